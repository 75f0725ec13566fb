"""What mapping a peer's allocation through CUDA IPC costs, on one GPU: does
``cudaIpcOpenMemHandle`` cost grow with the allocation, is a first open dearer than a repeated
one, and does it wait while another process keeps the GPU busy (the reading behind the 2-PE `fft`
row's 45-48 ms of mapping 8 allocations of 512 MiB: `engines.ipc.Mapped`)?

    python benchmarks/ipc_map_cost.py [REPS] [--first N] [--busy]

A parent process allocates one buffer per size with ``cudaMalloc`` (CuPy's pool bypassed) and
exports their handles; a child process (spawned) opens each handle once (the first open), then
opens and closes it REPS times (default 5), then also writes into the first MiB of each (opened,
copied, closed). Prints one line per size: the first open and the medians of open, close, and
open + a 1 MiB copy + close, in ms.

``--first N``: also N allocations of each size in `FIRST_BYTES`, each opened once by a fresh child
(as a run maps its peer's output chunks): every open's ms and their sum. The sizes: 512 MiB; the
2-PE `fft` row's output chunk at 16 chunks, (812, 51, 812) complex128 (`FFT_CHUNK`, 538,024,704
bytes: not a multiple of 2 MiB); and that rounded up to 2 MiB. ``--busy``: a third process runs 256 MiB
device-to-device copies back to back on the same GPU while the children open (PEs sharing a GPU
time-slice it: does an open wait for the other context's work?).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

SIZES_MIB = [64, 512, 4096, 16384, 65536]
FFT_CHUNK = 812 * 51 * 812 * 16
FIRST_BYTES = [2**29, FFT_CHUNK, -(-FFT_CHUNK // 2**21) * 2**21]


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def child(handles: dict, reps: int, out) -> None:
    import cupy

    rows = {}
    for mib, handle in handles.items():
        t0 = time.perf_counter()
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
        first = ms_since(t0)
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        opens, closes, writes = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            t1 = time.perf_counter()
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            opens.append((t1 - t0) * 1e3)
            closes.append(ms_since(t1))
        src = cupy.ones(2**20, dtype=cupy.uint8)
        for _ in range(reps):
            t0 = time.perf_counter()
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            cupy.cuda.runtime.memcpy(ptr, src.data.ptr, 2**20, cupy.cuda.runtime.memcpyDeviceToDevice)
            cupy.cuda.runtime.deviceSynchronize()
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            writes.append(ms_since(t0))
        rows[mib] = (first, *(statistics.median(v) for v in (opens, closes, writes)))
    out.put(rows)


def first_opens(handles: list, out) -> None:
    """Each handle opened once, in order, then all closed (as `Mapped` does): each open's ms."""
    import cupy

    cupy.cuda.runtime.free(0)  # (the context made before the clock starts, as on a worker)
    times, ptrs = [], []
    for handle in handles:
        t0 = time.perf_counter()
        ptrs.append(cupy.cuda.runtime.ipcOpenMemHandle(handle))
        times.append(ms_since(t0))
    t0 = time.perf_counter()
    for ptr in ptrs:
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    out.put((times, ms_since(t0)))


def busy(stop) -> None:
    """256 MiB device-to-device copies back to back until ``stop`` is set."""
    import cupy

    a, b = cupy.empty(2**28, dtype=cupy.uint8), cupy.empty(2**28, dtype=cupy.uint8)
    while not stop.is_set():
        for _ in range(20):
            b[...] = a
        cupy.cuda.runtime.deviceSynchronize()


def in_child(ctx, target, *args):
    out = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, out))
    p.start()
    result = out.get(timeout=300)
    p.join(30)
    return result


def main(reps: int, first: int, keep_busy: bool) -> None:
    import cupy

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    worker = ctx.Process(target=busy, args=(stop,)) if keep_busy else None
    free = cupy.cuda.runtime.memGetInfo()[0]
    buffers, handles = [], {}
    for mib in SIZES_MIB:
        if sum(b.size for b in buffers) + mib * 2**20 > free - 8 * 2**30 - first * sum(FIRST_BYTES):
            print(f"{mib} MiB: skipped (the GPU has {free / 2**30:.0f} GiB free)")
            continue
        buf = cupy.cuda.memory.Memory(mib * 2**20)  # cudaMalloc: an allocation of exactly this size
        buffers.append(buf)
        handles[mib] = cupy.cuda.runtime.ipcGetMemHandle(buf.ptr)
    chunks = {n: [cupy.cuda.memory.Memory(n) for _ in range(first)] for n in FIRST_BYTES}
    cupy.cuda.runtime.deviceSynchronize()
    if worker is not None:
        worker.start()
        time.sleep(2)  # (its context made and its copies running)
    try:
        rows = in_child(ctx, child, handles, reps)
        opened = {
            n: in_child(ctx, first_opens, [cupy.cuda.runtime.ipcGetMemHandle(c.ptr) for c in cs])
            for n, cs in chunks.items()
            if first
        }
    finally:
        stop.set()
        if worker is not None:
            worker.join(30)
    print(f"GPU {'kept busy by another process' if keep_busy else 'otherwise idle'}")
    print(f"{'allocation':>12} {'first open':>10} {'open ms':>9} {'close ms':>9} {'open+1MiB+close ms':>19}")
    for mib, (f, o, c, w) in rows.items():
        print(f"{mib:>8} MiB {f:10.2f} {o:9.2f} {c:9.2f} {w:19.2f}")
    for n, (times, close_ms) in opened.items():
        print(
            f"{first} allocations of {n:,} bytes, each opened once: " + ", ".join(f"{t:.2f}" for t in times)
        )
        print(f"  sum {sum(times):.2f} ms; closing them all {close_ms:.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reps", nargs="?", type=int, default=5)
    parser.add_argument("--first", type=int, default=0, metavar="N")
    parser.add_argument("--busy", action="store_true")
    a = parser.parse_args()
    main(a.reps, a.first, a.busy)
