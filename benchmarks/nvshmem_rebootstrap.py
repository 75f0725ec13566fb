"""Probe: can a process that left an NVSHMEM world join a new world of another size?

Process 0 forms a world of one PE (optionally making a cuFFTMp reshape plan in it,
kept or destroyed) and finalizes it; then processes 0 and 1 form a world of two.
Needs 2 GPUs, CuPy and nvmath-python. Measured on the GPU node (2026-11-30): works
with no plan or a destroyed one (NVSHMEM's status is 0 again after the finalize).

    python benchmarks/nvshmem_rebootstrap.py [--plan none|kept|destroyed]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys


def _init(nvshmem, rank, nranks, uid):
    attr = nvshmem.InitAttr()
    nvshmem.set_attr_uniqueid_args(rank, nranks, uid.ptr, attr.ptr)
    nvshmem.hostlib_init_attr(nvshmem.Flags.INIT_WITH_UNIQUEID, attr.ptr)


def _reshape_plan(cufftMp):
    """A 1-PE cuFFTMp reshape of a 4 x 4 x 4 box, as the cufftmp engine makes them."""
    handle = cufftMp.create_reshape()
    lo, hi, strides = (0, 0, 0), (4, 4, 4), (16, 4, 1)
    cufftMp.make_reshape(handle, 8, 3, lo, hi, strides, lo, hi, strides, 0, cufftMp.MpCommType.COMM_NONE)
    return handle


def _pe(rank, plan, queue, barrier, report):
    import cupy
    import numpy as np
    from nvmath.bindings import cufftMp, nvshmem

    cupy.cuda.Device(rank).use()
    cupy.zeros(1)  # a CUDA context
    say = lambda *a: report.put((rank, " ".join(map(str, a))))  # noqa: E731
    try:
        if rank == 0:
            uid = nvshmem.UniqueId()
            nvshmem.get_uniqueid(uid.ptr)
            _init(nvshmem, 0, 1, uid)
            ptr = nvshmem.malloc(2**20)
            nvshmem.free(ptr)
            handle = _reshape_plan(cufftMp) if plan != "none" else None
            say("world of 1: n_pes", nvshmem.n_pes(), "status", nvshmem.init_status(), "plan", plan)
            if plan == "destroyed":
                cufftMp.destroy_reshape(handle)
            nvshmem.hostlib_finalize()
            say(
                "after finalize: status",
                nvshmem.init_status(),
                "(not initialized =",
                nvshmem.STATUS_NOT_INITIALIZED,
                ")",
            )
        barrier.wait(60)
        uid = nvshmem.UniqueId()
        if rank == 0:
            nvshmem.get_uniqueid(uid.ptr)
            queue.put(bytes(uid._data.view(np.int8)))
        else:
            uid._data.view(np.int8)[...] = np.frombuffer(queue.get(timeout=60), dtype=np.int8)
        _init(nvshmem, rank, 2, uid)
        say("world of 2: n_pes", nvshmem.n_pes(), "my_pe", nvshmem.my_pe())
        ptr = nvshmem.malloc(2**20)
        stream = cupy.cuda.Stream(non_blocking=True)
        nvshmem.sync_all_on_stream(stream.ptr)
        stream.synchronize()
        nvshmem.free(ptr)
        nvshmem.hostlib_finalize()
        say("world of 2 synced and finalized: OK")
    except BaseException as e:  # noqa: B036 - reported to the parent
        say("FAILED", type(e).__name__, e)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--plan",
        choices=["none", "kept", "destroyed"],
        default="none",
        help="make a cuFFTMp reshape plan in the first world, and keep it or destroy it before the finalize",
    )
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    queue, report, barrier = ctx.Queue(), ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_pe, args=(r, args.plan, queue, barrier, report)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        p.kill()
    lines = []
    while not report.empty():
        lines.append(report.get())
    for rank, line in sorted(lines):
        print(f"rank {rank}: {line}")
    ok = sum("OK" in line for _, line in lines) == 2 and not hung
    print(
        f"plan={args.plan}: {'re-bootstrap works' if ok else 'FAILED'}"
        + (f" (ranks {hung} hung)" if hung else "")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
