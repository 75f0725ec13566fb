"""Dask's own floor for a chunk count: what Dask needs to produce N output keys at all.

For a case with ``n_in`` input and ``n_out`` output chunks: a persisted array of ``n_in``
tiny chunks (8 values each), placed like the case's input (`cases.contiguous`), then one
layer of ``n_out`` coroutine tasks keyed like the case's output chunks, each adding one to
an input chunk; ``persist(optimize_graph=False)`` and ``wait``, on the same cluster as
the other methods. No bytes move and nothing is computed: what is left is submitting,
scheduling and finishing ``n_out`` tasks, which any rechunk producing those keys pays.
Coroutine tasks run on the worker's event loop, as the collective's unpack tasks do, so
no thread hand-off is counted either.
"""

from __future__ import annotations

import math
import time

import dask
import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from dask_redist.bench.cases import Case, contiguous, worker_addresses
from dask_redist.compat import Task, TaskRef

#: Values per chunk of the floor's arrays (the issue's definition: chunks of 8 float64).
VALUES = 8


def _block(ndim: int, kind: str):
    xp = np
    if kind == "cupy":
        import cupy as xp
    return xp.zeros((1,) * (ndim - 1) + (VALUES,))


async def add_one(block):
    """The floor's task: a coroutine, run on the worker's event loop."""
    return block + 1


def _meta(ndim: int, kind: str):
    if kind == "cupy":
        import cupy

        return cupy.empty((0,) * ndim)
    return np.empty((0,) * ndim)


def _tiny_chunks(grid) -> tuple:
    return tuple((1,) * g for g in grid[:-1]) + ((VALUES,) * grid[-1],)


def floor_input(client, case: Case, seed: int, kind: str = "numpy") -> da.Array:
    """A persisted array with the case's input chunk grid, chunks of `VALUES` values placed
    like the case's input."""
    from distributed import wait

    workers = worker_addresses(client)
    grid = [len(c) for c in case.old]
    n = math.prod(grid)
    name = f"floor-input-{seed}-{dask.base.tokenize(case, kind)}"
    futures = {}
    for i, idx in enumerate(np.ndindex(*grid)):
        key = (name, *idx)
        futures[key] = client.submit(
            _block,
            len(grid),
            kind,
            key=key,
            workers=[workers[contiguous(i, n, len(workers))]],
            allow_other_workers=False,
            pure=False,
        )
    wait(list(futures.values()))
    graph = HighLevelGraph.from_collections(name, futures, dependencies=())
    return da.Array(graph, name, _tiny_chunks(grid), meta=_meta(len(grid), kind))


def floor_layer(x: da.Array, case: Case, seed: int) -> da.Array:
    """One coroutine task per output chunk of the case, keyed like the output chunks; output
    chunk ``k`` (flat) reads input chunk ``k * n_in // n_out``."""
    grid_in = [len(c) for c in case.old]
    grid_out = [len(c) for c in case.new]
    n_in, n_out = math.prod(grid_in), math.prod(grid_out)
    name = f"floor-{seed}-{dask.base.tokenize(x.name)}"
    layer = {}
    for k, idx in enumerate(np.ndindex(*grid_out)):
        source = (x.name, *(int(i) for i in np.unravel_index(k * n_in // n_out, grid_in)))
        key = (name, *idx)
        layer[key] = Task(key, add_one, TaskRef(source))
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, _tiny_chunks(grid_out), meta=x._meta)


def measure_floor(client, case: Case, reps: int, kind: str = "numpy") -> tuple[list[float], bool]:
    """Seconds of ``reps`` timed floor runs after one warm-up (fresh keys each), and whether every
    output was right (every value one)."""
    from distributed import wait

    times, correct = [], True
    n_out = math.prod(len(c) for c in case.new)
    for rep in range(reps + 1):
        x = floor_input(client, case, rep + 1, kind)
        layer = floor_layer(x, case, rep + 1)
        start = time.perf_counter()
        (y,) = client.persist([layer], optimize_graph=False)
        wait(y)
        elapsed = time.perf_counter() - start
        total = y.sum().compute()
        correct = correct and float(total) == n_out * VALUES
        if rep:
            times.append(elapsed)
        del x, y, layer
    return times, correct


def floor_row(client, case: Case, r, reps: int, kind: str) -> None:
    """Fill the harness's `Result` ``r`` with Dask's floor for the case's chunk counts."""
    try:
        r.times, r.correct = measure_floor(client, case, reps, kind)
    except Exception as e:
        r.error = f"{type(e).__name__}: {e}".splitlines()[0]
    r.note = "Dask's floor: one coroutine task per output chunk over a persisted input, no data"


def relate_to_floor(results: list) -> list:
    """Give every result the floor measured for its chunk counts (same input and output chunk
    counts; the floor of its own case where there is one), for the "x floor" column."""
    floors, by_counts = {}, {}
    for r in results:
        if r.method == "floor" and r.times:
            floors[r.case] = r.median
            by_counts.setdefault((r.nchunks_in, r.nchunks_out), r.median)
    for r in results:
        r.floor_s = floors.get(r.case, by_counts.get((r.nchunks_in, r.nchunks_out)))
    return results
