"""What mapping a peer's allocation through CUDA IPC costs, by the allocation's size, on one GPU:
does ``cudaIpcOpenMemHandle`` cost grow with the allocation (the reading behind the 2-PE `fft`
row's 42-48 ms of mapping: `engines.ipc.Mapped` maps the whole allocation a chunk lies in)?

    python benchmarks/ipc_map_cost.py [REPS]

A parent process allocates one buffer per size with ``cudaMalloc`` (CuPy's pool bypassed) and
exports their handles; a child process (spawned) opens and closes each handle REPS times
(default 5), then also writes into the first MiB of each (opened, copied, closed). Prints one line
per size: the medians of open, close, and open + a 1 MiB copy + close, in ms.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time

SIZES_MIB = [64, 512, 4096, 16384, 65536]


def child(handles: dict, reps: int, out) -> None:
    import cupy

    rows = {}
    for mib, handle in handles.items():
        opens, closes, writes = [], [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            t1 = time.perf_counter()
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            t2 = time.perf_counter()
            opens.append((t1 - t0) * 1e3)
            closes.append((t2 - t1) * 1e3)
        src = cupy.ones(2**20, dtype=cupy.uint8)
        for _ in range(reps):
            t0 = time.perf_counter()
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
            cupy.cuda.runtime.memcpy(ptr, src.data.ptr, 2**20, cupy.cuda.runtime.memcpyDeviceToDevice)
            cupy.cuda.runtime.deviceSynchronize()
            cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            writes.append((time.perf_counter() - t0) * 1e3)
        rows[mib] = tuple(statistics.median(v) for v in (opens, closes, writes))
    out.put(rows)


def main(reps: int) -> None:
    import cupy

    free = cupy.cuda.runtime.memGetInfo()[0]
    buffers, handles = [], {}
    for mib in SIZES_MIB:
        if sum(b.size for b in buffers) + mib * 2**20 > free - 8 * 2**30:
            print(f"{mib} MiB: skipped (the GPU has {free / 2**30:.0f} GiB free)")
            continue
        buf = cupy.cuda.memory.Memory(mib * 2**20)  # cudaMalloc: an allocation of exactly this size
        buffers.append(buf)
        handles[mib] = cupy.cuda.runtime.ipcGetMemHandle(buf.ptr)
    cupy.cuda.runtime.deviceSynchronize()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=child, args=(handles, reps, out))
    p.start()
    rows = out.get(timeout=300)
    p.join(30)
    print(f"{'allocation':>12} {'open ms':>9} {'close ms':>9} {'open+1MiB+close ms':>19}")
    for mib, (o, c, w) in rows.items():
        print(f"{mib:>8} MiB {o:9.2f} {c:9.2f} {w:19.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
