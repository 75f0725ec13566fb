"""Host buffers a worker process keeps from run to run: the packed buffers pieces are sent from
(`dask_redist.core.wire.pack`), and the output chunks a fused consumer reads and drops
(`dask_redist.runtime.tasks.unpack_into`).

A buffer of fresh pages costs far more to fill than one filled before where freed memory goes
back to the host: in a VM with virtio-balloon free page reporting, memory freed for about two
seconds is handed back, and touching it again costs the host's page faults (the CPU machine:
128 MiB in 37 ms when recently freed, 350-440 ms when freed 3 s before). A worker's large
arrays are ``mmap``-ed and unmapped on ``free`` (the nanny sets ``MALLOC_TRIM_THRESHOLD_``), so
every run's packed buffers and output chunks were fresh pages, fast or slow by how long ago the
last run freed its own: docs/benchmarks.md ("Where the CPU runs' slow mode came from").

Output chunks handed to Dask cannot be kept: Dask holds them. An output chunk that a fused
consumer reads is the consumer's alone, and once the consumer has returned it is given back
unless something still holds it (its result a view of it, or a reference the consumer kept):
`give_back_if_alone` counts the references, so memory is never handed out while in use.
"""

from __future__ import annotations

import math
import sys
import threading
import weakref

import numpy as np


def _references(holder: list) -> tuple[int, np.ndarray]:
    """The one array in ``holder`` (emptied) and how many references to it there are, counted
    here the same way each time (`_ALONE`: where nothing else holds it)."""
    buffer = holder.pop()
    return sys.getrefcount(buffer), buffer


#: `_references` of an array nothing else holds (the interpreter's count, measured once)
_ALONE = _references([np.empty(0, dtype=np.uint8)])[0]


def _rounded(nbytes: int) -> int:
    """``nbytes`` rounded up to a MiB: the sizes of the buffers made."""
    return -(-nbytes // 2**20) * 2**20


class KeptBuffers:
    """Host buffers kept for the next run (at most ``keep`` bytes free at once).

    `take` hands out a buffer of at least the size asked (the smallest kept one that fits, else a
    new one, rounded up to a MiB), `array` an array over one; `give_back` takes buffers back once
    their bytes are on the wire (``keep=False``: forgotten, where a failed send may still be
    reading them), `give_back_if_alone` once nothing holds them. A buffer lent and never given
    back is freed as any array is: the lent ones are known by weak references only.
    """

    def __init__(self, keep: int):
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lent: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def take(self, nbytes: int, most: int | None = None) -> np.ndarray:
        """A buffer of at least ``nbytes`` (and at most ``most``, where given, if a kept one)."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if nbytes <= b.nbytes <= (most or b.nbytes)]
            if fits:
                buffer = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
            else:
                buffer = np.empty(_rounded(nbytes), dtype=np.uint8)
            self._lent[id(buffer)] = buffer
            return buffer

    def array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialized C-ordered array over a buffer of `take` (its ``base``) of at most an
        eighth more than it needs: a result that is a view of it holds the whole buffer, and Dask
        counts the view's bytes only."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        return self.take(nbytes, _rounded(nbytes + nbytes // 8))[:nbytes].view(dtype).reshape(shape)

    def give_back(self, views: list, keep: bool = True) -> None:
        """The buffers of ``views`` (others' views are passed over) are free again: kept, the
        largest first, up to ``keep`` bytes with those kept already."""
        with self._lock:
            back = [b for b in map(self._lent_under, views) if b is not None]
            for b in back:
                del self._lent[id(b)]
            if not keep:
                return
            kept, total = [], 0
            for b in sorted(self._free + back, key=lambda b: -b.nbytes):
                if total + b.nbytes <= self.keep:
                    kept.append(b)
                    total += b.nbytes
            self._free = kept

    def lease(self, array) -> list:
        """[the lent buffer under ``array``], or [] where it is not one of these buffers' (to hand
        to `give_back_if_alone` once ``array`` and its views are dropped)."""
        with self._lock:
            buffer = self._lent_under(array)
        return [] if buffer is None else [buffer]

    def give_back_if_alone(self, lease: list) -> bool:
        """Give back the buffer of ``lease`` (`lease`; emptied) where nothing else holds it or a
        view of it; whether it was."""
        if not lease:
            return False
        count, buffer = _references(lease)
        if count != _ALONE:
            return False
        self.give_back([buffer])
        return True

    def _lent_under(self, view) -> np.ndarray | None:
        owner = view if getattr(view, "base", None) is None else view.base
        buffer = self._lent.get(id(owner))
        return buffer if buffer is owner else None

    def bound(self, keep: int) -> None:
        """Keep at most ``keep`` bytes from now on, what is kept already included."""
        self.keep = keep
        self.give_back([])

    @property
    def nbytes(self) -> int:
        """Bytes kept now."""
        with self._lock:
            return sum(b.nbytes for b in self._free)
