"""A distributed 3-D FFT of a dask array: ``dask_redist.fft.fftn``, and the four steps it replaces.

    python examples/fft_pipeline.py                # CPU: LocalCluster of 2 worker processes, NumPy chunks
    python examples/fft_pipeline.py --n 256        # a bigger cube
    python examples/fft_pipeline.py --gpu          # dask-cuda LocalCUDACluster, CuPy chunks
    python examples/fft_pipeline.py --gpu --fft-gpu   # ... and the GPU path (redist.fft.gpu: true)
    python examples/fft_pipeline.py --gpu --scheduler tcp://host:8786   # workers you started

The (n, n, n) complex array comes in slabs along axis 0. ``dask.array.fft.fftn`` refuses it (axis 0
has several chunks); ``dask_redist.fft.fftn(x)`` takes it as it is: it transforms axes 1 and
2 chunk by chunk, makes axis 0 local (slabs along axis 1) in one collective rechunk, and
transforms axis 0, which is what users used to write by hand:

    t = x.map_blocks(fftn, axes=(1, 2))     # the old way: four steps (the first rechunk
    t = t.rechunk((n, c, n))                # is a no-op here: axes 1 and 2 are whole)
    X = t.map_blocks(fftn, axes=(0,))

Both are computed and timed; each is compared with ``numpy.fft.fftn`` (``cupy.fft.fftn`` with
--gpu) of the whole array.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import dask
import dask.array as da
import numpy as np
from dask.utils import format_bytes
from distributed import Client, LocalCluster, wait

import dask_redist
import dask_redist.fft


def fft_along(block, axes):
    """The old way's local step: FFT of one chunk along ``axes`` with numpy.fft or cupy.fft."""
    if type(block).__module__.startswith("cupy"):
        import cupy as xp
    else:
        xp = np
    return xp.fft.fftn(block, axes=axes)


def four_steps(x, c: int, meta):
    """The 3-D FFT as users wrote it by hand (under dask_redist.enable(): the rechunk is collective)."""
    n = x.shape[0]
    f12 = x.map_blocks(fft_along, axes=(1, 2), dtype=np.complex128, meta=meta)  # axes 1, 2 are local
    t = f12.rechunk((n, c, n))  # slabs along axis 1: now axis 0 is local (the transpose)
    return t.map_blocks(fft_along, axes=(0,), dtype=np.complex128, meta=meta)


def start_cluster(args):
    if args.gpu:
        from dask_cuda import LocalCUDACluster

        return LocalCUDACluster(n_workers=args.workers, dashboard_address=":0")  # n_workers None: one per GPU
    return LocalCluster(
        n_workers=args.workers or 2, threads_per_worker=args.threads, processes=True, dashboard_address=":0"
    )


@contextlib.contextmanager
def connect(args):
    """A Client to ``--scheduler`` (workers you started, e.g. ``dask cuda worker`` processes), or to a
    local cluster started here."""
    if args.scheduler:
        with Client(args.scheduler) as client:
            client.wait_for_workers(1, timeout=60)
            yield client
        return
    with start_cluster(args) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(cluster.workers))
        yield client


def collective_runs(client) -> list[dict]:
    """The collective runs the scheduler recorded (dask_redist.status)."""
    return dask_redist.status(client)["history"]


def timed(client, y) -> tuple[object, float, list[dict]]:
    """``y`` computed, seconds end to end, and the collective runs it made."""
    before = len(collective_runs(client))
    start = time.perf_counter()
    got = y.compute()
    elapsed = time.perf_counter() - start
    return got, elapsed, collective_runs(client)[before:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=64, help="edge of the cube (default 64)")
    p.add_argument(
        "--slabs", type=int, default=8, help="slabs (chunks) of the input and of the result (default 8)"
    )
    p.add_argument(
        "--workers", type=int, default=None, help="workers (default: 2 on CPU, one per GPU with --gpu)"
    )
    p.add_argument("--threads", type=int, default=1, help="threads per CPU worker (default 1)")
    p.add_argument("--gpu", action="store_true", help="LocalCUDACluster and CuPy chunks")
    p.add_argument("--fft-gpu", action="store_true", help="with --gpu: the GPU path (redist.fft.gpu: true)")
    p.add_argument("--scheduler", help="address of a running cluster's scheduler instead of a local cluster")
    args = p.parse_args(argv)

    n, c = args.n, math.ceil(args.n / args.slabs)
    if args.gpu:
        import cupy as xp
    else:
        xp = np

    with connect(args) as client:
        print(f"cluster: {len(client.scheduler_info(n_workers=-1)['workers'])} workers, {xp.__name__} chunks")

        x = (
            da.random.default_rng(0).standard_normal((n, n, n), chunks=(c, n, n)).astype(np.complex128)
        )  # slabs
        if args.gpu:
            x = x.map_blocks(xp.asarray)
        x = x.persist()
        wait(x)
        meta = xp.empty((0, 0, 0), dtype=np.complex128)
        expected = xp.fft.fftn(x.compute())  # the whole array at once, in this process
        print(f"\n{x.shape} complex128 in {x.numblocks[0]} slabs along axis 0 ({format_bytes(x.nbytes)})")

        # the new way: one call, NumPy's signature; explain() says which path runs and why
        with dask.config.set({"redist.fft.gpu": args.fft_gpu}):
            X = dask_redist.fft.fftn(x)
        print("\ndask_redist.explain(dask_redist.fft.fftn(x)):")
        print(dask_redist.explain(X))
        got, elapsed, runs = timed(client, X)
        if not runs or any(r["outcome"] != "done" for r in runs):
            raise SystemExit(f"the transform made no collective run: {runs}")
        for r in runs:
            print(
                f"collective run: engine {r['engine']} ({r['why']}), {format_bytes(r['bytes'])}, {r['seconds'] * 1e3:.1f} ms"
            )
        check(xp, got, expected)
        print(
            f"check: dask_redist.fft.fftn ({elapsed * 1e3:.0f} ms end to end) equals {xp.__name__}.fft.fftn of the whole array"
        )

        # the old way, for comparison: the four steps by hand, with the rechunk made collective
        with dask_redist.enable():
            old = four_steps(x, c, meta)
            got, elapsed, _ = timed(client, old)
        check(xp, got, expected)
        print(
            f"check: the four steps by hand ({elapsed * 1e3:.0f} ms end to end) equal {xp.__name__}.fft.fftn too"
        )
    return 0


def check(xp, got, expected) -> None:
    assert got.dtype == np.complex128, got.dtype
    xp.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9 * float(abs(expected).max()))


if __name__ == "__main__":  # worker processes are spawned: keep the cluster start under this guard
    raise SystemExit(main())
