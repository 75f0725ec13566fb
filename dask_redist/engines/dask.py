"""The ``dask`` engine: pieces travel over Dask's worker-to-worker comms.

Each rank cuts what it sends out of its staged chunks (views), keeps its own
pieces without a copy, and packs what goes to each peer into contiguous
buffers of at most ``redist.memory-budget`` bytes: one message (one
device-to-host copy for CuPy over TCP) per batch instead of one per piece,
which matters when a rechunk has tens of thousands of pieces. All peers are
sent to at once; then the rank waits for what the others send.
Output chunks are assembled lazily by the unpack tasks, in parallel on the
worker's threads. NumPy and CuPy pieces alike: Dask's serializers carry them
(CuPy stays on the GPU over UCX).
"""

from __future__ import annotations

import numpy as np

from dask_redist._run import Packed
from dask_redist.assemble import cut
from dask_redist.planning import Transfers
from dask_redist.planning.geometry import block_lower, chunk_lowers


def cut_pieces(run, t: Transfers) -> list:
    """Views of the staged input chunks for every transfer in ``t``."""
    spec = run.spec.collective.rechunk
    lowers = chunk_lowers(spec.old)
    out = []
    for k in range(len(t)):
        f = int(t.old_block[k])
        out.append(cut(run.inputs[f], block_lower(lowers, spec.old_grid, f), t.lo[k], t.hi[k]))
    return out


ALIGN = 16  # pieces start on 16-byte boundaries inside a packed buffer


def packed_offsets(nbytes: np.ndarray) -> np.ndarray:
    """Byte offset of each piece in a packed buffer, and the buffer size last."""
    padded = -(-nbytes // ALIGN) * ALIGN
    return np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)


def pack(arrays: list, nbytes: np.ndarray):
    """One contiguous uint8 buffer holding ``arrays`` (in their array namespace)."""
    offsets = packed_offsets(nbytes)
    buffer = np.empty_like(arrays[0], shape=(int(offsets[-1]),), dtype=np.uint8)
    for a, start, n in zip(arrays, offsets[:-1].tolist(), nbytes.tolist()):
        buffer[start : start + n].view(a.dtype).reshape(a.shape)[...] = a
    return buffer


def unpack_views(buffer, shapes: list[tuple[int, ...]], dtype) -> list:
    """The pieces inside a packed buffer, as views."""
    dtype = np.dtype(dtype)
    nbytes = np.array([int(np.prod(s)) * dtype.itemsize for s in shapes], dtype=np.int64)
    offsets = packed_offsets(nbytes)
    return [
        buffer[start : start + n].view(dtype).reshape(shape)
        for shape, start, n in zip(shapes, offsets[:-1].tolist(), nbytes.tolist())
    ]


def batches(nbytes: np.ndarray, budget: int) -> list[tuple[int, int]]:
    """Consecutive (first, stop) ranges of at most ``budget`` bytes (a bigger piece alone)."""
    out, first, size = [], 0, 0
    for i, n in enumerate(nbytes.tolist()):
        if size + n > budget and i > first:
            out.append((first, i))
            first, size = i, 0
        size += n
    if first < len(nbytes):
        out.append((first, len(nbytes)))
    return out


class DaskEngine:
    name = "dask"

    def execute(self, run, transport) -> None:
        sends = run.plan.sends(run.rank)
        budget = run.spec.collective.settings.memory_budget
        nranks = len(run.spec.workers)
        run.set_phase("send")
        outgoing = []
        # start with the next rank so that not every rank sends to rank 0 first
        for dst in sorted(set(sends.dst.tolist()), key=lambda d: (d - run.rank - 1) % nranks):
            t = sends.take(sends.dst == dst)
            arrays = cut_pieces(run, t)
            if dst == run.rank:
                run.receive(run.rank, 0, arrays)
            else:
                outgoing += [
                    (dst, first, Packed(stop - first, pack(arrays[first:stop], t.nbytes[first:stop])))
                    for first, stop in batches(t.nbytes, budget)
                ]
        if outgoing:
            transport.send(outgoing)
        run.inputs = {}
        received = run.wait_received()
        run.finish(run.assemblies(received))
