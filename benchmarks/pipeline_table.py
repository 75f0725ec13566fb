"""Issue 40's table: a pipeline without and with a rechunk, the bare rechunk and
``map_blocks(identity)``, each persisted, medians in ms; ``--fuse false`` turns ``redist.fuse`` off.

    python benchmarks/pipeline_table.py --gpu --workers 1 --size 8GiB --chunks 16 64 256 1024
    python benchmarks/pipeline_table.py --workers 2 --engine dask --size 256MiB --chunks 16 64 256

The input: a cube of ``--size`` float64 in slabs along axis 0, persisted; the rechunk makes slabs
along axis 1. ``dask-redist bench --pipeline`` measures the same and more (Dask's floor and
``tasks``, five pipelines); this script is the issue's four graphs only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import dask
import dask.array as da
import numpy as np
from dask.utils import parse_bytes
from distributed import wait


def graphs(x, new):
    return {
        "without": lambda r: (2 * x + r) ** 2,
        "with": lambda r: ((2 * x + r).rechunk(new)) ** 2,
        "bare": lambda r: x.rechunk(new),
        "identity": lambda r: x.map_blocks(lambda b: b, token=f"identity-{r}"),
    }


def host(a):
    return a.get() if hasattr(a, "get") else a


def median_ms(make, reps: int, check=None) -> float:
    times = []
    for rep in range(reps + 1):  # (rep 0: the warm-up)
        y = make(rep + 1.0)
        start = time.perf_counter()
        y = y.persist()
        wait(y)
        if rep:
            times.append(time.perf_counter() - start)
        if check is not None and rep == 1:
            check(y, rep + 1.0)
        del y
        time.sleep(0.05)
    return 1e3 * statistics.median(times)


def row(x, new, reps: int) -> dict:
    def check(y, r):
        want = (2 * host(x[:, : new[1], :].compute()) + r) ** 2
        assert np.allclose(host(y.blocks[0, 0, 0].compute()), want), "wrong values"

    out = {
        name: median_ms(make, reps, check if name == "with" else None)
        for name, make in graphs(x, new).items()
    }
    out["adds"] = out["with"] - out["without"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--pes-per-gpu", type=int, default=0)
    p.add_argument("--size", default="8GiB")
    p.add_argument("--chunks", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--fuse", choices=["true", "false"], default="true")
    p.add_argument("--engine", default="auto")
    a = p.parse_args()

    import dask_redist
    from dask_redist.cli.clusters import client_for

    cluster = argparse.Namespace(
        scheduler=None, gpu=a.gpu, workers=a.workers, pes_per_gpu=a.pes_per_gpu, protocol="tcp", threads=1
    )
    n = round((parse_bytes(a.size) / 8) ** (1 / 3))
    rows = []
    with (
        client_for(cluster),
        dask_redist.enable(engine=a.engine),
        dask.config.set({"redist.fuse": a.fuse == "true"}),
    ):
        for c in a.chunks:
            x = da.random.random((n, n, n), chunks=(max(1, n // c), n, n))
            if a.gpu:
                import cupy

                x = x.map_blocks(cupy.asarray, meta=cupy.empty((0, 0, 0)))
            x = x.persist()
            wait(x)
            rows.append((c, row(x, (n, max(1, n // c), n), a.reps)))
            print(f"chunks {c}: " + "  ".join(f"{k} {v:.1f}" for k, v in rows[-1][1].items()), flush=True)
            del x
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"| chunks | without | with | adds | bare | identity |  (fuse={a.fuse}, {vars(a)}, {when})")
    for c, r in rows:
        print(
            f"| {c} | {r['without']:.1f} | {r['with']:.1f} | {r['adds']:.1f} | {r['bare']:.1f} | {r['identity']:.1f} |"
        )


if __name__ == "__main__":
    main()
