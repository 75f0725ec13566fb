"""Many box copies on the GPU in one kernel launch: the stage and unstage of a round.

A round stages every local input chunk's part into the arena and cuts every output
chunk's part out of it. One CuPy slice assignment per chunk and round costs Python and
a kernel launch each: at 1024 chunks in 16 rounds that is 32k copies, far longer than
their memory traffic takes (docs/benchmarks.md, "a round's copies in one launch"). Here a copy is a *job* (two outer extents, a run of
contiguous bytes, byte strides on both sides) and one launch of `box_copy` does all
the jobs of a stage or unstage: each row (or 64 KiB segment of a longer one) a block's work,
rows under 4 KiB several to a block (a row of 64 bytes would leave 252 of its 256 threads
idle, and a round of 4096 slabs on 2 PEs has 8 million of them). `tests/test_copy_kernel.py`
runs the kernel's source on the CPU.

`ChunkTable` builds a round's jobs for every chunk at once with NumPy (chunks of at
most 3 axes, C-contiguous: the usual case), and `piece_jobs` the copies of every piece
straight from its input chunk into its output chunk (a world of one PE needs nothing else);
`BoxCopies` folds copies one at a time for the others (packed layouts), falling back to
CuPy for a copy that does not fold.

Job tables travel from pinned host memory (an asynchronous copy: the engine's thread
must never block in a CUDA call behind a round that waits for a peer) and are kept
alive until the run's work is done.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

#: Developer switch for benchmarks: REDIST_BATCHED_COPIES=0 issues one CuPy copy per box.
BATCHED = os.environ.get("REDIST_BATCHED_COPIES", "1") != "0"

_SEGMENT = 65536  # a block's bytes of a long row at a time (`box_copy`)
_SHORT = 4096  # rows shorter than this share a block: 256 threads of 16 bytes

_SOURCE = (
    f"#define SEG {_SEGMENT}LL\n#define SHORT {_SHORT}LL\n"
    + r"""
template <typename T>
__device__ __forceinline__ void copy_rows(const char* src, char* dst, const long long r0, const unsigned int count,
                                          const unsigned int nb, const long long n1, const long long s0,
                                          const long long s1, const long long d0, const long long d1) {
    // rows r0 .. r0 + count of nb bytes each (count * nb <= 64 KiB), the block's threads over all their bytes
    const unsigned int total = count * nb;
    for (unsigned int b = sizeof(T) * threadIdx.x; b < total; b += sizeof(T) * blockDim.x) {
        const unsigned int k = b / nb, off = b - k * nb;
        const long long row = r0 + k, i0 = row / n1, i1 = row - i0 * n1;
        *(T*)(dst + i0 * d0 + i1 * d1 + off) = *(const T*)(src + i0 * s0 + i1 * s1 + off);
    }
}

extern "C" __global__ void box_copy(const long long* __restrict__ jobs, const int njobs) {
    // a row under SHORT bytes leaves some of a block's 256 threads idle (16 bytes each at most)
    for (int j = blockIdx.y; j < njobs; j += gridDim.y) {
        const long long* p = jobs + 9 * (long long)j;
        const char* src = (const char*)p[0];
        char* dst = (char*)p[1];
        const long long n0 = p[2], n1 = p[3], nb = p[4], s0 = p[5], s1 = p[6], d0 = p[7], d1 = p[8];
        const unsigned long long bits = (unsigned long long)src | (unsigned long long)dst | nb | s0 | s1 | d0 | d1;
        if (nb < SHORT) {  // short rows: a block copies as many whole rows as make at most 64 KiB
            const long long per = SEG / nb, rows = n0 * n1, units = (rows + per - 1) / per;
            for (long long u = blockIdx.x; u < units; u += gridDim.x) {
                const long long r0 = u * per;
                const unsigned int count = (unsigned int)min(per, rows - r0);
                if ((bits & 15) == 0) copy_rows<uint4>(src, dst, r0, count, nb, n1, s0, s1, d0, d1);
                else if ((bits & 7) == 0) copy_rows<unsigned long long>(src, dst, r0, count, nb, n1, s0, s1, d0, d1);
                else if ((bits & 3) == 0) copy_rows<unsigned int>(src, dst, r0, count, nb, n1, s0, s1, d0, d1);
                else copy_rows<char>(src, dst, r0, count, nb, n1, s0, s1, d0, d1);
            }
            continue;
        }
        const long long nseg = (nb + SEG - 1) / SEG, units = n0 * n1 * nseg;  // long rows: 64 KiB a block
        for (long long u = blockIdx.x; u < units; u += gridDim.x) {
            const long long r = u / nseg, start = (u - r * nseg) * SEG, end = min(nb, start + SEG);
            const long long i0 = r / n1, i1 = r - i0 * n1;
            const char* s = src + i0 * s0 + i1 * s1;
            char* d = dst + i0 * d0 + i1 * d1;
            if ((bits & 15) == 0) {
                for (long long b = start + 16 * threadIdx.x; b < end; b += 16 * blockDim.x)
                    *(uint4*)(d + b) = *(const uint4*)(s + b);
            } else if ((bits & 7) == 0) {
                for (long long b = start + 8 * threadIdx.x; b < end; b += 8 * blockDim.x)
                    *(unsigned long long*)(d + b) = *(const unsigned long long*)(s + b);
            } else if ((bits & 3) == 0) {
                for (long long b = start + 4 * threadIdx.x; b < end; b += 4 * blockDim.x)
                    *(unsigned int*)(d + b) = *(const unsigned int*)(s + b);
            } else {
                for (long long b = start + threadIdx.x; b < end; b += blockDim.x) d[b] = s[b];
            }
        }
    }
}
"""
)
_kernel = None


def launch(jobs: np.ndarray, keep: list) -> None:
    """Run the ``(n, 9)`` int64 job table on the current stream (``keep`` holds it until done)."""
    if not len(jobs):
        return
    import cupy

    global _kernel
    if _kernel is None:
        _kernel = cupy.RawKernel(_SOURCE, "box_copy")
    jobs = np.ascontiguousarray(jobs, dtype=np.int64)
    pinned = cupy.cuda.alloc_pinned_memory(jobs.nbytes)
    np.frombuffer(pinned, dtype=np.int64, count=jobs.size)[:] = jobs.ravel()
    table = cupy.empty(jobs.size, dtype=np.int64)
    table.data.copy_from_host_async(pinned.ptr, jobs.nbytes)
    units = int(units_of(jobs).max())
    _kernel((max(1, min(units, 4096)), min(len(jobs), 65535)), (256,), (table, np.int32(len(jobs))))
    keep += [pinned, table]


def units_of(jobs: np.ndarray) -> np.ndarray:
    """Each job's units of work for `box_copy`, one block each at a time: a row, or a 64 KiB
    segment of a longer one; rows under 4 KiB as many to a unit as make at most 64 KiB."""
    rows, nbytes = jobs[:, 2] * jobs[:, 3], jobs[:, 4]
    per = np.maximum(_SEGMENT // np.maximum(nbytes, 1), 1)
    return np.where(nbytes < _SHORT, -(-rows // per), rows * -(-nbytes // _SEGMENT))


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
    """Copies folded one at a time, launched together on the current stream."""

    def __init__(self, keep: list):
        self._jobs: list[tuple[int, ...]] = []
        self._keep = keep

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
        launch(np.array(self._jobs, dtype=np.int64).reshape(-1, 9), self._keep)
        self._jobs = []


def _padded(a: np.ndarray) -> np.ndarray:
    """Corners of at most 3 axes, padded on the left to 3 (an axis of extent 1)."""
    pad = 3 - a.shape[1]
    return np.concatenate([np.zeros((len(a), pad), np.int64), a], axis=1) if pad else a


def _extents(lo, hi) -> np.ndarray:
    pad = 3 - lo.shape[1]
    e = hi - lo
    return np.concatenate([np.ones((len(e), pad), np.int64), e], axis=1) if pad else e


class ChunkTable:
    """A rank's chunks (C-contiguous CuPy arrays of at most 3 axes): boxes and addresses,
    from which the jobs of a whole stage or unstage are computed at once."""

    def __init__(self, lower: np.ndarray, upper: np.ndarray, ptrs: np.ndarray, itemsize: int):
        self.lower, self.upper, self.ptrs, self.itemsize = lower, upper, ptrs, itemsize
        e = _extents(lower, upper)
        self.strides = np.stack([e[:, 1] * e[:, 2], e[:, 2], np.ones(len(e), np.int64)], axis=1) * itemsize

    @classmethod
    def of(cls, arrays: dict[int, object], box_of, itemsize: int, boxes_of=None) -> ChunkTable | None:
        """The table of ``arrays`` (flat index -> chunk; ``box_of(flat)`` its global bounds, or
        ``boxes_of(flats)`` those of all at once as ``(n, ndim)`` lower and upper arrays), or None
        where a job table cannot describe them (more than 3 axes, not C-contiguous)."""
        if not BATCHED or not arrays:
            return None
        chunks = list(arrays.values())
        if chunks[0].ndim > 3 or not all(a.flags.c_contiguous for a in chunks):
            return None
        if boxes_of is not None:
            lower, upper = boxes_of(np.fromiter(arrays, dtype=np.int64, count=len(arrays)))
        else:
            corners = np.array([box_of(f) for f in arrays], dtype=np.int64).reshape(len(chunks), 2, -1)
            lower, upper = corners[:, 0], corners[:, 1]
        ptrs = np.fromiter((a.data.ptr for a in chunks), dtype=np.int64, count=len(chunks))
        return cls(lower, upper, ptrs, itemsize)

    def jobs(self, lower, upper, ptr: int, into_box: bool) -> np.ndarray:
        """Jobs copying every chunk's part of the box ``[lower, upper)`` (a C-contiguous array
        at ``ptr``) into the box (``into_box``: a stage) or out of it (an unstage)."""
        box_lo, box_hi = np.asarray(lower, np.int64), np.asarray(upper, np.int64)
        lo, hi = np.maximum(self.lower, box_lo), np.minimum(self.upper, box_hi)
        keep = np.all(hi > lo, axis=1)
        lo, hi = lo[keep], hi[keep]
        if not len(lo):
            return np.zeros((0, 9), np.int64)
        box = ChunkTable(box_lo[None], box_hi[None], np.array([ptr]), self.itemsize)
        c_off = ((_padded(lo - self.lower[keep])) * self.strides[keep]).sum(axis=1)
        b_off = ((_padded(lo - box_lo)) * box.strides).sum(axis=1)
        c_ptr, b_ptr = self.ptrs[keep] + c_off, ptr + b_off
        e = _extents(lo, hi)
        c_st, b_st = self.strides[keep], np.broadcast_to(box.strides, (len(lo), 3))
        src, dst = (c_ptr, b_ptr) if into_box else (b_ptr, c_ptr)
        s_st, d_st = (c_st, b_st) if into_box else (b_st, c_st)
        jobs = np.empty((len(lo), 9), np.int64)
        jobs[:, 0], jobs[:, 1] = src, dst
        rows = _merged(
            e[:, 0], e[:, 1], e[:, 2] * self.itemsize, s_st[:, 0], s_st[:, 1], d_st[:, 0], d_st[:, 1]
        )
        for col, values in enumerate(rows, start=2):
            jobs[:, col] = values
        return jobs


def _merged(n0, n1, nbytes, s0, s1, d0, d1) -> tuple:
    """Jobs' rows with those contiguous on both sides made one longer row: a chunk staged whole
    is one row, not one per line of its last axis (each row is a unit of work for the kernel,
    and a row of a few hundred bytes keeps most of a block idle)."""
    inner = (n1 == 1) | ((s1 == nbytes) & (d1 == nbytes))
    nbytes, n1 = np.where(inner, nbytes * n1, nbytes), np.where(inner, 1, n1)
    outer = inner & ((n0 == 1) | ((s0 == nbytes) & (d0 == nbytes)))
    nbytes, n0 = np.where(outer, nbytes * n0, nbytes), np.where(outer, 1, n0)
    return n0, n1, nbytes, s0, s1, d0, d1


def piece_jobs(
    src: ChunkTable, dst: ChunkTable, src_rows, dst_rows, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Jobs copying each piece ``[lo, hi)`` (global bounds, one row each) from the chunk at row
    ``src_rows`` of ``src`` straight into the chunk at row ``dst_rows`` of ``dst``.

    Column by column into one ``(n, 9)`` table (a world of one PE builds 65,536 of them at once):
    a piece's address is its chunk's *origin* (where the chunk's element at the global origin
    would be) plus the piece's corner times the chunk's strides."""
    src_rows, dst_rows = np.asarray(src_rows, np.int64), np.asarray(dst_rows, np.int64)
    n, ndim = lo.shape
    jobs = np.empty((n, 9), np.int64)
    pad = 3 - ndim
    for col, table, rows in ((0, src, src_rows), (1, dst, dst_rows)):
        origin = table.ptrs - (_padded(table.lower) * table.strides).sum(axis=1)
        ptr = origin[rows]
        for axis in range(ndim):
            ptr += lo[:, axis] * table.strides[rows, axis + pad]
        jobs[:, col] = ptr
    n0, n1 = (hi[:, -3] - lo[:, -3] if ndim >= 3 else 1), (hi[:, -2] - lo[:, -2] if ndim >= 2 else 1)
    nbytes = (hi[:, -1] - lo[:, -1]) * src.itemsize
    s0, s1 = src.strides[src_rows, 0], src.strides[src_rows, 1]
    d0, d1 = dst.strides[dst_rows, 0], dst.strides[dst_rows, 1]
    # (a slab's part of a slab: one row per plane)
    for col, values in enumerate(_merged(n0, n1, nbytes, s0, s1, d0, d1), start=2):
        jobs[:, col] = values
    return jobs


@dataclass(frozen=True, eq=False)
class PieceJobs:
    """The jobs of a one-PE run with the chunks' addresses left out: they change every run, the
    rest only with the rechunk, so a repeated rechunk builds its table once (`piece_jobs` of
    chunks at address 0: ``offsets``) and each run adds its chunks' addresses (`jobs`)."""

    old_block: np.ndarray  # each piece's input chunk (flat index)
    new_block: np.ndarray  # each piece's output chunk (flat index)
    offsets: np.ndarray  # (n, 9): the jobs, pointers as offsets into those chunks

    @classmethod
    def of(cls, rechunk, transfers) -> PieceJobs:
        """Of every piece in ``transfers`` (a `dask_redist.planning.Transfers`) of ``rechunk``
        (a `dask_redist.planning.RechunkSpec` of at most 3 axes), C-contiguous chunks assumed."""
        tables = []
        for count, boxes_of in (
            (math.prod(rechunk.old_grid), rechunk.old_boxes),
            (math.prod(rechunk.new_grid), rechunk.new_boxes),
        ):
            lower, upper = boxes_of(np.arange(count))
            tables.append(ChunkTable(lower, upper, np.zeros(count, np.int64), rechunk.itemsize))
        t = transfers
        return cls(t.old_block, t.new_block, piece_jobs(*tables, t.old_block, t.new_block, t.lo, t.hi))

    def jobs(self, inputs: dict, outputs: dict, n_old: int, n_new: int) -> np.ndarray | None:
        """The jobs for these chunks (flat index -> CuPy array, of ``n_old`` / ``n_new`` in their
        grids), or None where one is not C-contiguous. Raises KeyError naming a chunk missing."""
        if not BATCHED or not all(a.flags.c_contiguous for a in (*inputs.values(), *outputs.values())):
            return None
        return self.at(addresses(inputs, n_old), addresses(outputs, n_new))

    def at(self, inputs: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        """The jobs for chunks at these addresses (by flat index, -1 where a chunk is not here;
        an output chunk may be a peer's, mapped into this process). Raises KeyError naming a
        chunk missing."""
        src, dst = inputs[self.old_block], outputs[self.new_block]
        if (src < 0).any() or (dst < 0).any():
            raise KeyError(
                f"input chunks {self.old_block[src < 0][:5].tolist()} or output chunks "
                f"{self.new_block[dst < 0][:5].tolist()} of the run's pieces are not here"
            )
        jobs = self.offsets.copy()
        jobs[:, 0] += src
        jobs[:, 1] += dst
        return jobs


def addresses(chunks: dict, count: int) -> np.ndarray:
    """Each flat index's chunk address, -1 where ``chunks`` has none."""
    out = np.full(count, -1, dtype=np.int64)
    out[np.fromiter(chunks, dtype=np.int64, count=len(chunks))] = np.fromiter(
        (a.data.ptr for a in chunks.values()), dtype=np.int64, count=len(chunks)
    )
    return out
