"""Host memory a worker process keeps from run to run: the buffers pieces are packed into
(`packed`), and the output chunks that a consumer fused into the unpack tasks reads and lets go
(`consumed`).

A buffer of fresh pages costs far more to fill than one filled before where freed memory goes
back to the host: in a VM with virtio-balloon free page reporting, memory freed for about two
seconds is handed back, and touching it again costs the host's page faults (the CPU machine:
128 MiB in 37 ms when recently freed, 350-440 ms when freed 3 s before). A worker's large arrays
are ``mmap``-ed and unmapped on ``free`` (the nanny sets ``MALLOC_TRIM_THRESHOLD_``), so every
run's buffers were fresh pages, fast or slow by how long ago the last run freed its own:
docs/benchmarks.md ("Where the CPU runs' slow mode came from").

Kept buffers are memory Dask does not manage: each pool keeps at most `KEPT` bytes, and at most
`SHARE` of the worker's memory limit (`bound`, when the collective's worker plugin starts).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

#: Bytes each pool keeps at most, per worker process ...
KEPT = 256 * 2**20
#: ... and at most this part of the worker's memory limit
SHARE = 1 / 16


class KeptBuffers:
    """Host buffers kept for the next run (at most ``keep`` bytes).

    `take` hands out a buffer of at least the size asked (the smallest kept one that fits, else a
    new one, rounded up to a MiB), `array` one viewed as an array; `give_back` takes them back
    once their bytes are no longer read (``keep=False``: forgotten, where something may still read
    them). A buffer lent and never given back is simply freed with its last view.
    """

    def __init__(self, keep: int):
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lent: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
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

    def array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized C-ordered NumPy array in a buffer `take` hands out."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.take(nbytes)[:nbytes].view(dtype).reshape(shape)

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


#: buffers pieces are packed into (`dask_redist.core.wire.pack`), kept once their bytes are on the wire
packed = KeptBuffers(KEPT)
#: output chunks of a run whose consumers are fused into its unpack tasks, kept once the
#: consumer's result does not hold them (`holds`)
consumed = KeptBuffers(KEPT)


def bound(memory_limit: int | None) -> int:
    """Keep at most `KEPT` bytes in each pool of this process, and at most `SHARE` of
    ``memory_limit`` (the worker's; None or 0: none); the bound."""
    keep = KEPT if not memory_limit else min(KEPT, int(memory_limit * SHARE))
    packed.bound(keep)
    consumed.bound(keep)
    return keep


def holds(result, chunk, depth: int = 3) -> bool:
    """Whether ``result`` may hold memory of ``chunk``: a NumPy array that may share it (or holds
    objects), anything but a number or None, tuples, lists and dicts searched ``depth`` deep."""
    if type(result) is np.ndarray:
        return result.dtype.hasobject or np.may_share_memory(result, chunk)
    if result is None or isinstance(result, (int, float, complex, np.generic)):
        return isinstance(result, np.generic) and result.dtype.hasobject
    if depth and isinstance(result, (tuple, list)):
        return any(holds(r, chunk, depth - 1) for r in result)
    if depth and type(result) is dict:
        return any(holds(r, chunk, depth - 1) for r in result.values())
    return True
