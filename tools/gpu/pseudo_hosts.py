"""On the GPU node: a short CuPy rechunk against NumPy on a running cluster of pseudo-hosts, with
``redist.engine`` auto and then cufftmp forced; prints what happened (tools/gpu/pseudo-hosts.sh).

    python3 tools/gpu/pseudo_hosts.py SCHEDULER_FILE

Lines starting with ``RESULT`` are what the summary keeps: the workers' hosts, and per engine
setting whether it ran, on which engine and why, and whether the values are NumPy's (or the
error, whole).
"""

from __future__ import annotations

import sys
import time
import traceback

import numpy as np

#: 64 MiB of float64 in 16 row slabs, to 16 column slabs: every worker holds input and owns output
SHAPE, OLD, NEW = (2048, 4096), (128, 4096), (2048, 256)


def hosts(client) -> dict[str, str]:
    import dask_redist

    return {w: s.get("host", "?") for w, s in sorted(dask_redist.status(client)["workers"].items())}


def placed(client):
    """The input as CuPy chunks in the workers' memory (spread by the scheduler), and NumPy's copy."""
    import cupy
    import dask.array as da

    expected = np.random.default_rng(44).random(SHAPE)
    meta = cupy.empty((0, 0), dtype=expected.dtype)
    x = da.from_array(expected, chunks=OLD).map_blocks(cupy.asarray, dtype=expected.dtype, meta=meta)
    return client.persist(x), expected


def attempt(client, engine: str) -> None:
    import cupy

    import dask_redist

    x, expected = placed(client)
    start = time.perf_counter()
    try:
        with dask_redist.enable(engine=engine):
            explained = dask_redist.explain(x.rechunk(NEW))
            print(f"explain ({engine}): {explained[0].engine} ({explained[0].engine_reason})", flush=True)
            got = cupy.asnumpy(x.rechunk(NEW).compute())
    except Exception as e:  # noqa: BLE001 - recorded: the point of this check
        took = time.perf_counter() - start
        traceback.print_exc()
        print(
            f"RESULT engine={engine}: refused or failed after {took:.1f}s: {type(e).__name__}: {e}",
            flush=True,
        )
        return
    took = time.perf_counter() - start
    last = dask_redist.status(client)["history"][-1]
    same = bool(np.array_equal(got, expected))
    print(
        f"RESULT engine={engine}: ran on {last.get('engine')} ({last.get('why')}), outcome {last.get('outcome')}, "
        f"values {'equal NumPy' if same else 'DIFFER from NumPy'}, {took:.1f}s",
        flush=True,
    )


def main(scheduler_file: str) -> None:
    from distributed import Client

    with Client(scheduler_file=scheduler_file, timeout=60) as client:
        client.wait_for_workers(4, timeout=180)
        print(f"RESULT hosts: {hosts(client)}", flush=True)
        for engine in ("auto", "cufftmp"):
            attempt(client, engine)
        import dask_redist

        print(dask_redist.status(client), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
