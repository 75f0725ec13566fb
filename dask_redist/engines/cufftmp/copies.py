"""Many box copies on the GPU in one kernel launch: the stage and unstage of a round.

A round stages every local input chunk's part into the arena and cuts every output
chunk's part out of it. One CuPy slice assignment per chunk costs tens of microseconds
of Python and a launch each, so at 1024 chunks the GPU mostly waited for the CPU to
issue copies (stage 187 ms, unstage 155 ms for 8 GiB on 2x H200, against ~3 ms of
memory traffic). Here every copy of a round is folded into a job (two outer extents
and strides, and a contiguous run of bytes, source and destination alike) and one
launch of `box_copy` does them all. Copies that cannot be folded so (more than two
non-contiguous outer axes) fall back to CuPy, in order, on the same stream.

The job table travels to the GPU from pinned host memory (an asynchronous copy:
the engine's thread must never block in a CUDA call behind a round that waits for a
peer) and is kept alive until the run's work is done.
"""

from __future__ import annotations

import os

import numpy as np

#: Developer switch for benchmarks: REDIST_BATCHED_COPIES=0 issues one CuPy copy per box.
BATCHED = os.environ.get("REDIST_BATCHED_COPIES", "1") != "0"

_SOURCE = r"""
extern "C" __global__ void box_copy(const long long* __restrict__ jobs, const int njobs) {
    for (int j = blockIdx.y; j < njobs; j += gridDim.y) {
        const long long* p = jobs + 9 * (long long)j;
        const char* src = (const char*)p[0];
        char* dst = (char*)p[1];
        const long long n0 = p[2], n1 = p[3], nb = p[4], s0 = p[5], s1 = p[6], d0 = p[7], d1 = p[8];
        const unsigned long long bits = (unsigned long long)src | (unsigned long long)dst | nb | s0 | s1 | d0 | d1;
        const long long rows = n0 * n1;
        for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
            const long long i0 = r / n1, i1 = r - i0 * n1;
            const char* s = src + i0 * s0 + i1 * s1;
            char* d = dst + i0 * d0 + i1 * d1;
            if ((bits & 15) == 0) {
                for (long long b = 16 * threadIdx.x; b < nb; b += 16 * blockDim.x)
                    *(uint4*)(d + b) = *(const uint4*)(s + b);
            } else if ((bits & 7) == 0) {
                for (long long b = 8 * threadIdx.x; b < nb; b += 8 * blockDim.x)
                    *(unsigned long long*)(d + b) = *(const unsigned long long*)(s + b);
            } else if ((bits & 3) == 0) {
                for (long long b = 4 * threadIdx.x; b < nb; b += 4 * blockDim.x)
                    *(unsigned int*)(d + b) = *(const unsigned int*)(s + b);
            } else {
                for (long long b = threadIdx.x; b < nb; b += blockDim.x) d[b] = s[b];
            }
        }
    }
}
"""
_kernel = None


def fold(dst_shape, dst_strides, src_strides, itemsize: int):
    """``(n0, n1, nbytes, s0, s1, d0, d1)``: a copy of this shape as rows of ``nbytes`` contiguous
    bytes over two outer axes (byte strides, source then destination), or None if it is not one."""
    dims = [(n, s, d) for n, s, d in zip(dst_shape, src_strides, dst_strides) if n != 1]
    nbytes = itemsize
    while dims and dims[-1][1] == nbytes and dims[-1][2] == nbytes:  # the contiguous inner axes
        nbytes *= dims.pop()[0]
    outer: list[tuple[int, int, int]] = []
    for n, s, d in dims:  # merge an axis into the one outside it where both arrays allow
        if outer and outer[-1][1] == s * n and outer[-1][2] == d * n:
            m = outer.pop()
            outer.append((m[0] * n, s, d))
        else:
            outer.append((n, s, d))
    if len(outer) > 2:
        return None
    (n0, s0, d0), (n1, s1, d1) = [(1, 0, 0)] * (2 - len(outer)) + outer
    return n0, n1, nbytes, s0, s1, d0, d1


class BoxCopies:
    """The copies of one stage or unstage, launched together on the current stream."""

    def __init__(self, keep: list):
        self._jobs: list[tuple[int, ...]] = []
        self._keep = keep  # pinned tables stay alive until the engine's work is done

    def add(self, dst, src) -> None:
        """``dst[...] = src`` (CuPy arrays of one shape and dtype), now or at `launch`."""
        if dst.size == 0:
            return
        job = fold(dst.shape, dst.strides, src.strides, dst.itemsize) if BATCHED else None
        if job is None:
            self.launch()  # keep the order of the copies
            dst[...] = src
            return
        n0, n1, nbytes, s0, s1, d0, d1 = job
        self._jobs.append((src.data.ptr, dst.data.ptr, n0, n1, nbytes, s0, s1, d0, d1))

    def launch(self) -> None:
        if not self._jobs:
            return
        import cupy

        global _kernel
        if _kernel is None:
            _kernel = cupy.RawKernel(_SOURCE, "box_copy")
        table = np.array(self._jobs, dtype=np.int64)
        pinned = cupy.cuda.alloc_pinned_memory(table.nbytes)
        np.frombuffer(pinned, dtype=np.int64, count=table.size)[:] = table.ravel()
        device = cupy.empty(table.size, dtype=np.int64)
        device.data.copy_from_host_async(pinned.ptr, table.nbytes)
        rows = int((table[:, 2] * table[:, 3]).max())
        _kernel((min(rows, 2048), min(len(table), 65535)), (256,), (device, np.int32(len(table))))
        self._keep += [pinned, device]
        self._jobs = []
