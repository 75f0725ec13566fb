"""Reference points for the benchmark: raw nvmath ``Redistribute`` and the physical ceiling.

* `raw_redistribute` moves the same slab -> slab data with nvmath-python's own
  ``Redistribute``, in processes of its own (one per GPU), with no Dask around
  it. Its ``execute`` allocates the result in symmetric memory on every call,
  as a user of that API pays.
* `link_ceiling` measures, in the calling process (which sees every GPU), a
  peer copy in both directions at once and a local device copy. A rechunk
  cannot finish faster than its bytes crossing GPUs per direction take at the
  peer rate.
"""

from __future__ import annotations

import time

import numpy as np


def _slab_boxes(shape, rank: int, nranks: int):
    """Rank's slab along axis 0 (input) and along axis 1 (output), as (lower, upper)."""
    n0, n1 = shape[0], shape[1]
    lo0, hi0 = rank * n0 // nranks, (rank + 1) * n0 // nranks
    lo1, hi1 = rank * n1 // nranks, (rank + 1) * n1 // nranks
    return ((lo0, 0, 0), (hi0, *shape[1:])), ((0, lo1, 0), (n0, hi1, shape[2]))


def _redistribute_rank(
    rank: int, nranks: int, port: int, shape, dtype: str, seed: int, reps: int, queue
) -> None:
    """One process of the raw measurement: GPU ``rank`` (modulo the GPUs visible), NVSHMEM bootstrapped through torch's gloo group."""
    import os
    import pickle

    try:
        import cupy
        import nvmath.distributed as nd
        import torch.distributed as dist
        from nvmath.bindings import nvshmem
        from nvmath.distributed.distribution import Box, Redistribute

        from dask_redist.bench.cases import expected_block

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        device = (
            rank % cupy.cuda.runtime.getDeviceCount()
        )  # (several ranks share a GPU where fewer are visible)
        cupy.cuda.Device(device).use()
        dist.init_process_group("gloo", rank=rank, world_size=nranks)
        group = nd.TorchProcessGroup(device_id="cpu")
        reduce = group.allreduce_object
        # nvmath's Box reducer mutates its first argument: hand it a copy
        group.allreduce_object = lambda obj, *, op: reduce(pickle.loads(pickle.dumps(obj)), op=op)
        nd.initialize(device, group, ["nvshmem"])
        (lo_in, hi_in), (lo_out, hi_out) = _slab_boxes(shape, rank, nranks)
        a = nd.allocate_symmetric_memory(tuple(h - l for l, h in zip(lo_in, hi_in)), cupy, dtype=dtype)
        a[...] = expected_block(dtype, seed, a.shape, lo_in, shape, xp=cupy)
        r = Redistribute(a, Box(lo_in, hi_in), Box(lo_out, hi_out))
        r.plan()
        stream = cupy.cuda.get_current_stream()
        times, correct = [], True
        for i in range(reps + 1):  # the first is a warm-up, and checked
            nvshmem.sync_all_on_stream(stream.ptr)
            stream.synchronize()
            start = time.perf_counter()
            b = r.execute()
            stream.synchronize()
            if i:
                times.append(time.perf_counter() - start)
            else:
                correct = bool((b == expected_block(dtype, seed, b.shape, lo_out, shape, xp=cupy)).all())
            nd.free_symmetric_memory(b)
        r.free()
        nd.free_symmetric_memory(a)
        nd.finalize()
        dist.destroy_process_group()
        queue.put((rank, {"times": times, "correct": correct}))
    except BaseException as e:  # the parent must not wait for a result that never comes
        queue.put((rank, {"error": f"{type(e).__name__}: {e}"}))


def raw_redistribute(
    shape, dtype: str, seed: int, reps: int, nranks: int = 2, timeout: float = 300
) -> tuple[list[float], bool]:
    """nvmath's ``Redistribute`` of a slab -> slab array over ``nranks`` GPUs, without Dask.

    Run in fresh processes (one per GPU, NVSHMEM bootstrapped through torch's gloo
    group as nvmath documents), so nothing of the cluster is shared with it.
    Returns seconds per repetition (slowest rank) and whether every result was right.
    """
    import multiprocessing
    import queue as queues
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(
            target=_redistribute_rank, args=(r, nranks, port, tuple(shape), dtype, seed, reps, q), daemon=True
        )
        for r in range(nranks)
    ]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in procs:
            rank, result = q.get(timeout=timeout)
            out[rank] = result
    except queues.Empty:
        raise TimeoutError(f"raw Redistribute gave no result within {timeout:g}s") from None
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    if errors := [r["error"] for r in out.values() if "error" in r]:
        raise RuntimeError(errors[0])
    times = np.max([r["times"] for r in out.values()], axis=0).tolist()
    return times, all(r["correct"] for r in out.values())


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
            try:
                cupy.cuda.runtime.deviceEnablePeerAccess(1 - d)
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
                cupy.cuda.runtime.memcpyPeerAsync(
                    bufs[1 - d][1].data.ptr, 1 - d, bufs[d][0].data.ptr, d, nbytes, streams[d].ptr
                )
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


def host_ceiling(nbytes: int = 2**30, reps: int = 3, threads: int = 8) -> dict:
    """GB/s between this process's GPU and host memory: pinned and pageable, each way, and of a
    host-to-host copy (what packing NumPy parts into a pinned buffer costs), on one thread
    and on ``threads``.

    NumPy chunks through the GPUs cross this link twice; their copies are judged against it.
    """
    import cupy
    import cupyx

    n = nbytes // 8
    device = cupy.empty(n)
    pinned = cupyx.empty_pinned(n)
    pageable, other = np.ones(n), np.ones(n)
    stream = cupy.cuda.Stream(non_blocking=True)

    def best(copy) -> float:
        times = []
        for _ in range(reps):
            cupy.cuda.Device().synchronize()
            start = time.perf_counter()
            copy()
            stream.synchronize()
            times.append(time.perf_counter() - start)
        return nbytes / min(times) / 1e9

    return {
        "pinned H2D GB/s": best(lambda: device.set(pinned, stream=stream)),
        "pinned D2H GB/s": best(lambda: device.get(stream=stream, out=pinned)),
        "pageable H2D GB/s": best(lambda: device.set(pageable, stream=stream)),
        "pageable D2H GB/s": best(lambda: device.get(stream=stream, out=pageable)),
        "host copy GB/s": best(lambda: np.copyto(other, pageable)),
        "host copy into fresh memory GB/s": best(lambda: pageable.copy()),
        f"host copy, {threads} threads GB/s": best(lambda: _threaded_copy(other, pageable, threads)),
        "host bytes per copy": nbytes,
    }


def _threaded_copy(dst: np.ndarray, src: np.ndarray, threads: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    bounds = np.linspace(0, len(src), threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as pool:  # NumPy copies release the GIL
        list(
            pool.map(
                lambda i: np.copyto(dst[bounds[i] : bounds[i + 1]], src[bounds[i] : bounds[i + 1]]),
                range(threads),
            )
        )
