"""Reference points for the benchmark: raw nvmath ``Redistribute`` and the physical ceiling.

* `raw_redistribute` moves the same slab -> slab data with nvmath-python's own
  ``Redistribute`` inside the workers, over the NVSHMEM world the ``cufftmp``
  engine bootstrapped: what the engine's exchange costs with no Dask around it.
  Its ``execute`` allocates the result in symmetric memory on every call, as a
  user of that API pays.
* `link_ceiling` measures, in the calling process (which sees every GPU), a
  peer copy in both directions at once and a local device copy. A rechunk
  cannot finish faster than its bytes crossing GPUs per direction take at the
  peer rate.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np


def _slab_boxes(shape, rank: int, nranks: int):
    """Rank's slab along axis 0 (input) and along axis 1 (output), as (lower, upper)."""
    n0, n1 = shape[0], shape[1]
    lo0, hi0 = rank * n0 // nranks, (rank + 1) * n0 // nranks
    lo1, hi1 = rank * n1 // nranks, (rank + 1) * n1 // nranks
    return ((lo0, 0, 0), (hi0, *shape[1:])), ((0, lo1, 0), (n0, hi1, shape[2]))


def _redistribute(shape, dtype: str, seed: int, reps: int, address: str) -> dict:
    import cupy
    import nvmath.distributed as nd
    from nvmath.bindings import nvshmem
    from nvmath.distributed.distribution import Box, Redistribute

    from dask_redist.bench import expected_block
    from dask_redist.engines import get_engine

    engine = get_engine("cufftmp")
    if engine.world is None:
        raise RuntimeError("NVSHMEM is not up in this worker: run a redist-cufftmp rechunk first")
    rank, nranks = engine.world.index(address), len(engine.world)
    (lo_in, hi_in), (lo_out, hi_out) = _slab_boxes(shape, rank, nranks)
    a = nd.allocate_symmetric_memory(tuple(h - l for l, h in zip(lo_in, hi_in)), cupy, dtype=dtype)
    a[...] = expected_block(dtype, seed, a.shape, lo_in, shape, xp=cupy)
    r = Redistribute(a, Box(lo_in, hi_in), Box(lo_out, hi_out))
    r.plan()
    stream = cupy.cuda.get_current_stream()
    times, correct = [], True
    for i in range(reps + 1):  # the first is a warm-up
        nvshmem.sync_all_on_stream(stream.ptr)
        stream.synchronize()
        start = time.perf_counter()
        b = r.execute()
        stream.synchronize()
        if i:
            times.append(time.perf_counter() - start)
        else:
            want = expected_block(dtype, seed, b.shape, lo_out, shape, xp=cupy)
            correct = bool((b == want).all())
        nd.free_symmetric_memory(b)
    r.free()
    nd.free_symmetric_memory(a)
    return {"times": times, "correct": correct}


async def _redistribute_off_loop(shape, dtype, seed, reps, dask_worker=None):
    # nvmath plans through the engine's process group, which talks to the scheduler
    # through this worker's event loop: run the blocking part on a thread
    return await asyncio.to_thread(_redistribute, shape, dtype, seed, reps, dask_worker.address)


def raw_redistribute(client, shape, dtype: str, seed: int, reps: int) -> tuple[list[float], bool]:
    """Seconds per repetition (slowest worker) and whether every worker's result was right."""
    out = client.run(_redistribute_off_loop, tuple(shape), dtype, seed, reps)
    times = np.max([o["times"] for o in out.values()], axis=0).tolist()
    return times, all(o["correct"] for o in out.values())


def link_ceiling(nbytes: int = 2**31, reps: int = 5) -> dict:
    """GB/s of a peer copy per direction with both directions busy (GPUs 0 and 1), and of a local copy.

    Local copy bandwidth counts bytes read plus bytes written, like the design notes.
    """
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        raise RuntimeError("the peer-copy ceiling needs two GPUs visible to the benchmark process")
    n = nbytes // 8
    bufs, streams = {}, {}
    for d in (0, 1):
        with cupy.cuda.Device(d):
            for p in (1 - d,):
                try:
                    cupy.cuda.runtime.deviceEnablePeerAccess(p)
                except cupy.cuda.runtime.CUDARuntimeError:
                    pass  # already enabled
            bufs[d] = (cupy.ones(n), cupy.empty(n))
            streams[d] = cupy.cuda.Stream(non_blocking=True)
    peer = []
    for _ in range(reps):
        for d in (0, 1):
            cupy.cuda.Device(d).synchronize()
        start = time.perf_counter()
        for d in (0, 1):  # d -> 1 - d, both at once
            with cupy.cuda.Device(d):
                cupy.cuda.runtime.memcpyPeerAsync(bufs[1 - d][1].data.ptr, 1 - d, bufs[d][0].data.ptr, d, nbytes, streams[d].ptr)
        for d in (0, 1):
            streams[d].synchronize()
        peer.append(time.perf_counter() - start)
    local = []
    with cupy.cuda.Device(0):
        src, dst = bufs[0]
        for _ in range(reps):
            cupy.cuda.Device(0).synchronize()
            start = time.perf_counter()
            dst[...] = src
            cupy.cuda.Device(0).synchronize()
            local.append(time.perf_counter() - start)
    del bufs
    return {
        "peer GB/s per direction": nbytes / min(peer) / 1e9,
        "local copy GB/s (read + write)": 2 * nbytes / min(local) / 1e9,
        "bytes per copy": nbytes,
    }
