"""Micro benchmarks: the graph rewrite of a large rechunk, and the fixed cost of a tiny one."""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext

import dask.array as da
import numpy as np


def rewrite_time(nchunks: int = 10_000, reps: int = 3) -> dict:
    """Seconds to rewrite (and then optimize) the graph of an ``nchunks``-chunk rechunk."""
    from dask.array.optimization import optimize

    from dask_redist.config import Settings
    from dask_redist.graph.optimize import rewrite

    settings = Settings(min_bytes=0)  # (the rewrite itself: not what the cost model would leave to Dask)

    x = da.ones((nchunks, 100), chunks=(1, 100))
    y = x.rechunk((nchunks, 1), method="tasks")
    keys = y.__dask_keys__()
    rewrite_s, total_s = [], []
    for _ in range(reps):
        graph = y.__dask_graph__()
        t0 = time.perf_counter()
        new, (decision,) = rewrite(graph, [keys], settings)
        assert decision.collective, decision.reason
        t1 = time.perf_counter()
        optimize(new, [keys])
        t2 = time.perf_counter()
        rewrite_s.append(t1 - t0)
        total_s.append(t2 - t0)
    return {
        "chunks": nchunks,
        "rewrite": statistics.median(rewrite_s),
        "rewrite + dask optimize": statistics.median(total_s),
    }


def fixed_cost(client, reps: int = 20) -> dict:
    """End-to-end seconds of a tiny rechunk (2 -> 2 chunks of 16x16 float64), fresh keys each time."""
    from distributed import wait

    import dask_redist
    from dask_redist.config import Settings
    from dask_redist.engines.choice import recovery_engine

    engine = recovery_engine(Settings.from_config())  # the engine that runs wherever Dask does
    labels = {
        f"collective ({engine} engine)": lambda: dask_redist.enable(
            engine=engine, min_bytes=0, respect_method=False
        ),
        "dask tasks": nullcontext,
    }
    times = {k: [] for k in labels}
    for i in range(reps + 2):
        for j, (label, ctx) in enumerate(labels.items()):
            a = da.from_array(np.full((16, 16), float(i * 10 + j)), chunks=(8, 16)).persist()
            wait(a)
            with ctx():
                t0 = time.perf_counter()
                y = a.rechunk((16, 8), method="tasks").persist()
                wait(y)
                if i >= 2:
                    times[label].append(time.perf_counter() - t0)
            del a, y
    return {k: statistics.median(v) for k, v in times.items()}
