"""A distributed 3-D FFT: local FFTs, one collective rechunk (the transpose), local FFTs.

    python examples/fft_pipeline.py                # CPU: LocalCluster of 2 worker processes, NumPy, `dask` engine
    python examples/fft_pipeline.py --n 256        # a bigger cube
    python examples/fft_pipeline.py --gpu          # dask-cuda LocalCUDACluster, CuPy (engine auto: cufftmp)

The (n, n, n) array comes in slabs along axis 0, so axes 1 and 2 are local to
every chunk: FFT along them chunk by chunk (``map_blocks``). A plain
``x.rechunk(...)`` under ``dask_redist.enable()`` then makes axis 0 local (slabs
along axis 1) in one collective step, and a last ``map_blocks`` does the FFT
along axis 0. The result is compared with ``numpy.fft.fftn`` (``cupy.fft.fftn``
with --gpu) of the whole array.
"""

from __future__ import annotations

import argparse
import math
import time

import dask.array as da
import numpy as np
from dask.utils import format_bytes
from distributed import Client, LocalCluster, wait

import dask_redist


def fft_along(block, axes):
    """FFT of one chunk along ``axes`` with numpy.fft or cupy.fft, whichever fits the chunk."""
    if type(block).__module__.startswith("cupy"):
        import cupy as xp
    else:
        xp = np
    return xp.fft.fftn(block, axes=axes)


def start_cluster(args):
    if args.gpu:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(n_workers=args.workers, dashboard_address=":0")  # n_workers None: one per GPU
    return LocalCluster(
        n_workers=args.workers or 2, threads_per_worker=args.threads, processes=True, dashboard_address=":0"
    )


def collective_runs(client) -> list[dict]:
    """What the dask-redist scheduler plugin recorded about collective runs (a peek, not a public API)."""

    def history(dask_scheduler):
        plugin = dask_scheduler.plugins.get("redist")
        return list(plugin.history) if plugin is not None else []

    return client.run_on_scheduler(history)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=64, help="edge of the cube (default 64)")
    p.add_argument(
        "--slabs", type=int, default=8, help="slabs (chunks) before and after the transpose (default 8)"
    )
    p.add_argument(
        "--workers", type=int, default=None, help="workers (default: 2 on CPU, one per GPU with --gpu)"
    )
    p.add_argument("--threads", type=int, default=1, help="threads per CPU worker (default 1)")
    p.add_argument("--gpu", action="store_true", help="LocalCUDACluster and CuPy chunks")
    args = p.parse_args(argv)

    n, c = args.n, math.ceil(args.n / args.slabs)
    if args.gpu:
        import cupy as xp
    else:
        xp = np

    with start_cluster(args) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(cluster.workers))
        print(f"cluster: {len(cluster.workers)} workers, {xp.__name__} chunks")

        x = da.random.default_rng(0).standard_normal((n, n, n), chunks=(c, n, n))  # slabs along axis 0
        if args.gpu:
            x = x.map_blocks(xp.asarray)
        x = x.persist()
        wait(x)
        meta = xp.empty((0, 0, 0), dtype=np.complex128)

        dask_redist.enable()  # engine auto: `dask` for NumPy chunks, `cufftmp` for CuPy chunks on dask-cuda workers
        f12 = x.map_blocks(fft_along, axes=(1, 2), dtype=np.complex128, meta=meta)  # axes 1, 2 are local
        t = f12.rechunk((n, c, n))  # slabs along axis 1: now axis 0 is local (the transpose)
        X = t.map_blocks(fft_along, axes=(0,), dtype=np.complex128, meta=meta)

        print(
            f"\n{x.shape} float64 in {x.numblocks[0]} slabs -> fft(1, 2) -> rechunk to {t.numblocks[1]} slabs "
            f"along axis 1 ({format_bytes(t.nbytes)} complex128) -> fft(0)"
        )
        print("\ndask_redist.explain(X):")
        print(dask_redist.explain(X))

        before = len(collective_runs(client))
        start = time.perf_counter()
        got = X.compute()
        elapsed = time.perf_counter() - start
        runs = collective_runs(client)[before:]
        if not runs or any(r["outcome"] != "done" for r in runs):
            raise SystemExit(f"the rechunk did not run as a collective: {runs}")
        for r in runs:
            print(
                f"\ncollective run: engine {r['engine']} ({r['why']}), {format_bytes(r['bytes'])}, "
                f"{r['seconds'] * 1e3:.1f} ms"
            )

        expected = xp.fft.fftn(x.compute())  # the whole array at once, in this process
        assert got.dtype == np.complex128, got.dtype
        xp.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * float(abs(expected).max()))
        print(
            f"check: the pipeline ({elapsed * 1e3:.0f} ms end to end) equals {xp.__name__}.fft.fftn "
            "of the whole array"
        )
    return 0


if __name__ == "__main__":  # worker processes are spawned: keep the cluster start under this guard
    raise SystemExit(main())
