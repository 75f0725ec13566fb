"""Quickstart: one dask-array rechunk run as ONE collective step, checked and timed.

    python examples/quickstart.py                  # CPU: LocalCluster of 2 worker processes, NumPy chunks
    python examples/quickstart.py --size 1GiB      # a bigger array
    python examples/quickstart.py --gpu            # dask-cuda LocalCUDACluster (one worker per GPU), CuPy chunks
    python examples/quickstart.py --gpu --scheduler tcp://host:8786   # workers you started (`dask cuda worker`)

A random (n, n, n) float64 array in slabs along axis 0 is rechunked to slabs along
axis 1 with a plain ``x.rechunk(...)`` under ``dask_redist.enable()``; a reduction
over axis 0 is checked against NumPy (CuPy with --gpu) on the whole array. Then
dask's own rechunk and the collective are timed once each: a rough illustration,
not a benchmark (``dask-redist bench`` is the benchmark).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import time

import dask.array as da
from dask.utils import format_bytes, parse_bytes
from distributed import Client, LocalCluster, futures_of, wait

import dask_redist


def start_cluster(args):
    if args.gpu:
        from dask_cuda import LocalCUDACluster

        # n_workers=None: one worker per visible GPU
        return LocalCUDACluster(n_workers=args.workers, dashboard_address=":0")
    return LocalCluster(
        n_workers=args.workers or 2,
        threads_per_worker=args.threads,
        processes=True,
        dashboard_address=":0",
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


def random_array(n: int, nslabs: int, seed: int, gpu: bool) -> da.Array:
    """A random (n, n, n) float64 array in ``nslabs`` slabs along axis 0 (CuPy chunks with gpu)."""
    x = da.random.default_rng(seed).standard_normal((n, n, n), chunks=(math.ceil(n / nslabs), n, n))
    if gpu:
        import cupy

        x = x.map_blocks(cupy.asarray)  # dask infers the CuPy meta from this
    return x


def collective_runs(client) -> list[dict]:
    """What the dask-redist scheduler plugin recorded about the collective runs so far.

    A peek into the plugin (not a public API), used here to show that the rechunk
    really ran as a collective and through which engine.
    """

    def history(dask_scheduler):
        plugin = dask_scheduler.plugins.get("redist")
        return list(plugin.history) if plugin is not None else []

    return client.run_on_scheduler(history)


def timed_rechunk(x: da.Array, new, method=None) -> float:
    """Seconds for ``x.rechunk(new).persist(); wait(...)`` (x is already in worker memory)."""
    start = time.perf_counter()
    y = x.rechunk(new, method=method).persist()
    wait(y)
    elapsed = time.perf_counter() - start
    for f in futures_of(y):  # wait() also returns for failed tasks
        if f.status == "error":
            raise f.exception()
    del y
    return elapsed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="32MiB", help="array size, e.g. 32MiB (default), 1GiB")
    p.add_argument("--slabs", type=int, default=8, help="slabs before and after (default 8)")
    p.add_argument(
        "--workers", type=int, default=None, help="workers (default: 2 on CPU, one per GPU with --gpu)"
    )
    p.add_argument("--threads", type=int, default=1, help="threads per CPU worker (default 1)")
    p.add_argument("--gpu", action="store_true", help="LocalCUDACluster and CuPy chunks")
    p.add_argument("--scheduler", help="address of a running cluster's scheduler instead of a local cluster")
    args = p.parse_args(argv)
    logging.getLogger("distributed.shuffle").setLevel(logging.ERROR)  # p2p's per-run notices

    n = max(2, round((parse_bytes(args.size) / 8) ** (1 / 3)))
    c = math.ceil(n / args.slabs)
    if args.gpu:
        import cupy as xp
    else:
        import numpy as xp

    with connect(args) as client:
        nworkers = len(client.scheduler_info()["workers"])
        kind = "CuPy" if args.gpu else "NumPy"
        print(f"cluster: {nworkers} workers ({'dask-cuda' if args.gpu else 'processes'}), {kind} chunks")

        x = random_array(n, args.slabs, seed=0, gpu=args.gpu).persist()  # the input lives on the workers
        wait(x)
        print(f"x: shape {x.shape}, {format_bytes(x.nbytes)}, chunks {x.chunksize} ({x.npartitions} slabs)")

        # -- the collective --------------------------------------------------------------
        dask_redist.enable()  # every eligible x.rechunk(...) now runs as one collective step
        y = x.rechunk((n, c, n))  # slabs along axis 1: axis 0 is now local to every chunk
        print("\ndask_redist.explain(y):")
        print(dask_redist.explain(y))

        before = len(collective_runs(client))
        got = (y * y).sum(axis=0).compute()  # a reduction along the axis the rechunk made local

        a = x.compute()  # the whole array, in this process
        expected = (a * a).sum(axis=0)
        xp.testing.assert_allclose(got, expected, rtol=1e-12)
        runs = collective_runs(client)[before:]
        if not runs or any(r["outcome"] != "done" for r in runs):
            raise SystemExit(f"the rechunk did not run as a collective: {runs}")
        print(f"\ncheck: sum(y * y, axis=0) equals {xp.__name__} on the whole array")
        for r in runs:
            print(
                f"collective run: engine {r['engine']}, {format_bytes(r['bytes'])} rechunked, "
                f"{format_bytes(r['bytes moved'])} moved between workers, {r['seconds'] * 1e3:.1f} ms"
            )

        # -- timing: one run each, a rough illustration, not a benchmark -------------------
        # Every run gets a fresh input (new keys), already persisted on the workers.
        dask_redist.disable()  # dask's own rechunks
        times = {}
        for seed, method in ((1, "tasks"), (2, "p2p")):
            xi = random_array(n, args.slabs, seed=seed, gpu=args.gpu).persist()
            wait(xi)
            try:
                times[f"dask {method}"] = timed_rechunk(xi, (n, c, n), method=method)
            except Exception as e:  # noqa: BLE001 - p2p does not take every chunk type
                times[f"dask {method}"] = f"not available ({type(e).__name__})"
            del xi
        with dask_redist.enable():  # also a context manager
            xi = random_array(n, args.slabs, seed=3, gpu=args.gpu).persist()
            wait(xi)
            times["dask-redist collective"] = timed_rechunk(xi, (n, c, n))
            del xi
        print(f"\ntiming, y = x.rechunk(...).persist(); wait(y), {format_bytes(x.nbytes)}, one run each")
        print("(a rough illustration, not a benchmark: see `dask-redist bench`)")
        for label, t in times.items():
            print(f"  {label:<24} {t * 1e3:9.1f} ms" if isinstance(t, float) else f"  {label:<24} {t}")
    return 0


if __name__ == "__main__":  # worker processes are spawned: keep the cluster start under this guard
    raise SystemExit(main())
