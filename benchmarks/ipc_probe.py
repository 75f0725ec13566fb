"""CUDA IPC between two processes on one GPU, as a chunk-to-chunk path would use it.

Run on the GPU node: ``python3 benchmarks/ipc_probe.py [chunks] [GiB]``. The parent allocates
``chunks`` output chunks of ``GiB / chunks`` each from CuPy's pool and exports them; a child
process opens them (timed), writes a pattern into each with a kernel, and the parent checks it.
It also times a 1-PE-like copy of the same bytes, and says whether the pool's pointers are the
bases of their allocations and whether a stream-ordered (cudaMallocAsync) allocation exports.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time


def base_of(ptr: int) -> tuple[int, int]:
    from cuda.bindings import driver

    err, base, size = driver.cuMemGetAddressRange(ptr)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return int(base), int(size)


def child(conn, chunks: int, nbytes: int) -> None:
    import cupy

    cupy.cuda.Device(0).use()
    handles, offsets = conn.recv()
    out = {}
    t0 = time.perf_counter()
    opened = {}
    for h in set(handles):
        opened[h] = cupy.cuda.runtime.ipcOpenMemHandle(h)
    out["open_ms"] = (time.perf_counter() - t0) * 1e3
    out["distinct"] = len(opened)
    try:
        cupy.cuda.runtime.ipcOpenMemHandle(handles[0])
        out["reopen"] = "ok"
    except Exception as e:  # noqa: BLE001 - a probe
        out["reopen"] = f"{type(e).__name__}: {e}"
    src = cupy.arange(nbytes // 8, dtype=cupy.float64)
    cupy.cuda.Device().synchronize()
    for rep in range(3):
        t0 = time.perf_counter()
        for h, off in zip(handles, offsets):
            mem = cupy.cuda.UnownedMemory(opened[h] + off, nbytes, owner=None)
            dst = cupy.ndarray(nbytes // 8, dtype=cupy.float64, memptr=cupy.cuda.MemoryPointer(mem, 0))
            dst[...] = src
        cupy.cuda.Device().synchronize()
        out[f"write_ms_{rep}"] = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for ptr in opened.values():
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    out["close_ms"] = (time.perf_counter() - t0) * 1e3
    conn.send(out)


def main() -> None:
    import cupy

    chunks = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    total = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0
    nbytes = int(total * 2**30 // chunks) // 8 * 8
    outs = [cupy.empty(nbytes // 8, dtype=cupy.float64) for _ in range(chunks)]
    cupy.cuda.Device().synchronize()
    report = {"chunks": chunks, "chunk MiB": nbytes / 2**20}
    t0 = time.perf_counter()
    bases = [base_of(a.data.ptr) for a in outs]
    report["base_ms"] = (time.perf_counter() - t0) * 1e3
    report["ptr is base"] = sum(b == a.data.ptr for (b, _), a in zip(bases, outs))
    t0 = time.perf_counter()
    handles = [cupy.cuda.runtime.ipcGetMemHandle(b) for b, _ in bases]
    report["export_ms"] = (time.perf_counter() - t0) * 1e3
    offsets = [a.data.ptr - b for (b, _), a in zip(bases, outs)]
    parent, kid = mp.get_context("spawn").Pipe()
    p = mp.get_context("spawn").Process(target=child, args=(kid, chunks, nbytes))
    p.start()
    parent.send((handles, offsets))
    report.update(parent.recv())
    p.join()
    expect = cupy.arange(nbytes // 8, dtype=cupy.float64)
    report["values right"] = all(bool((a == expect).all()) for a in outs)
    src = cupy.arange(nbytes // 8, dtype=cupy.float64)
    for rep in range(2):
        t0 = time.perf_counter()
        for a in outs:
            a[...] = src
        cupy.cuda.Device().synchronize()
        report[f"local_write_ms_{rep}"] = (time.perf_counter() - t0) * 1e3
    try:
        pool = cupy.cuda.MemoryAsyncPool()
        m = pool.malloc(2**20)
        cupy.cuda.runtime.ipcGetMemHandle(m.ptr)
        report["async pool export"] = "ok"
    except Exception as e:  # noqa: BLE001 - a probe
        report["async pool export"] = f"{type(e).__name__}: {e}"
    for k, v in report.items():
        print(f"{k:>20}: {v}")


if __name__ == "__main__":
    main()
