"""The wire format of pieces between ranks: consecutive pieces packed into one buffer.

A rechunk can have tens of thousands of pieces; sending each as its own message
costs a round trip (and, for CuPy over TCP, a device-to-host copy) per piece. So
pieces for one peer travel packed: one contiguous uint8 buffer per batch of at most
``redist.memory-budget`` bytes, each piece starting on a 16-byte boundary. Both ends
know the pieces' shapes from the plan, so only ``(first piece, count, buffer)`` is sent.

A large piece that is one contiguous block of memory (a whole input chunk, a slab of one)
travels as it is, in a batch of its own: copying it into a packed buffer would cost a pass
over its bytes and as much new memory, for a message saved where messages are few.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGN = 16  # pieces start on 16-byte boundaries inside a packed buffer
#: Contiguous pieces of at least this many bytes travel as they are, not packed (`batches`).
AS_IS_BYTES = 8 * 2**20


def tcp_shard_size() -> int:
    """The largest message Dask's TCP (and TLS) comm sends whole (``distributed.comm.shard``, read
    when the comm was imported): a larger buffer goes in shards, each read by the receiver into a
    buffer of its own and then copied into one new buffer (`merge_and_deserialize`)."""
    from distributed.comm.tcp import TCP

    return TCP.max_shard_size


@dataclass(frozen=True)
class Packed:
    """``count`` consecutive pieces in one contiguous buffer."""

    count: int
    buffer: Any


def padded_sizes(nbytes: np.ndarray) -> np.ndarray:
    """What each piece takes in a packed buffer: its bytes rounded up to `ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN


def packed_offsets(nbytes: np.ndarray) -> np.ndarray:
    """Byte offset of each piece in a packed buffer, and the buffer size last."""
    return np.concatenate([[0], np.cumsum(padded_sizes(nbytes))]).astype(np.int64)


def pack(arrays: list, nbytes: np.ndarray, pool: SendBuffers | None = None):
    """One contiguous uint8 buffer holding ``arrays`` (in their array namespace): a view of the
    one array there is where it is contiguous, else a copy (NumPy: into a buffer of ``pool``)."""
    if len(arrays) == 1 and arrays[0].flags.c_contiguous:
        return arrays[0].reshape(-1).view(np.uint8)
    offsets = packed_offsets(nbytes)
    size = int(offsets[-1])
    if pool is not None and isinstance(arrays[0], np.ndarray):
        buffer = pool.take(size)[:size]
    else:
        buffer = np.empty_like(arrays[0], shape=(size,), dtype=np.uint8)
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


def batches(nbytes: np.ndarray, budget: int, alone: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Consecutive (first, stop) ranges of at most ``budget`` bytes (a bigger piece alone), and
    a range of its own for each piece ``alone`` marks (see `as_is`)."""
    alone = np.zeros(len(nbytes), bool) if alone is None else alone
    out, first, size = [], 0, 0
    for i, (n, single) in enumerate(zip(nbytes.tolist(), alone.tolist())):
        if (size + n > budget or single) and i > first:
            out.append((first, i))
            first, size = i, 0
        size += n
        if single:
            out.append((first, i + 1))
            first, size = i + 1, 0
    if first < len(nbytes):
        out.append((first, len(nbytes)))
    return out


def as_is(arrays: list, nbytes: np.ndarray) -> np.ndarray:
    """Which of ``arrays`` travel as they are (`AS_IS_BYTES`): large and contiguous."""
    return (nbytes >= AS_IS_BYTES) & np.array([a.flags.c_contiguous for a in arrays], dtype=bool)


class SendBuffers:
    """Host buffers that pieces are packed into, kept for the next run (at most ``keep`` bytes).

    A buffer of fresh pages costs far more to fill than one filled before where freed memory goes
    back to the host: in a VM with virtio-balloon free page reporting, memory freed for about two
    seconds is handed back, and touching it again costs the host's page faults (the CPU machine:
    128 MiB in 37 ms when recently freed, 350-440 ms when freed 3 s before). A worker's large
    arrays are ``mmap``-ed and unmapped on ``free`` (the nanny sets ``MALLOC_TRIM_THRESHOLD_``), so
    every run's packed buffers were fresh pages, fast or slow by how long ago the last run freed
    its own: docs/benchmarks.md ("Where the CPU runs' slow mode came from").

    `take` hands out a buffer of at least the size asked (the smallest kept one that fits, else a
    new one, rounded up to a MiB); `give_back` takes what was packed into them back once its bytes
    are on the wire (``keep=False``: forgotten, where a failed send may still be reading them).
    """

    def __init__(self, keep: int):
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lent: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
            if fits:
                buffer = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
            else:
                buffer = np.empty(-(-nbytes // 2**20) * 2**20, dtype=np.uint8)
            self._lent[id(buffer)] = buffer
            return buffer

    def give_back(self, views: list, keep: bool = True) -> None:
        """The buffers of ``views`` (others' views are passed over) are free again: kept, the
        largest first, up to ``keep`` bytes with those kept already."""
        with self._lock:
            owners = [v if getattr(v, "base", None) is None else v.base for v in views]
            back = [b for b in (self._lent.pop(id(o), None) for o in owners) if b is not None]
            if not keep:
                return
            kept, total = [], 0
            for b in sorted(self._free + back, key=lambda b: -b.nbytes):
                if total + b.nbytes <= self.keep:
                    kept.append(b)
                    total += b.nbytes
            self._free = kept

    def bound(self, keep: int) -> None:
        """Keep at most ``keep`` bytes from now on, what is kept already included."""
        self.keep = keep
        self.give_back([])

    @property
    def nbytes(self) -> int:
        """Bytes kept now."""
        with self._lock:
            return sum(b.nbytes for b in self._free)
