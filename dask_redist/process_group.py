"""An nvmath-python ``ProcessGroup`` whose collectives go through the Dask scheduler.

nvmath bootstraps NVSHMEM (and plans some operations) with a handful of tiny
collectives: broadcast a unique id, all-reduce a few numbers or objects. Dask
workers have no MPI communicator, but they all reach the scheduler, so every
collective here is one *all-gather* through it: each rank sends its pickled
contribution, the scheduler answers every rank with all of them once the last
one arrived (or with an error when ``timeout`` passes), and each rank finishes
the collective locally.

Each rank unpickles its own copies of the contributions, so a reducer may
mutate its arguments (nvmath 1.0's ``Box`` reducer does) without corrupting
the result on any rank.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import time
from typing import Any, Callable

import numpy as np

try:  # the ABC nvmath checks for; optional so that the group is usable (and tested) without it
    from nvmath.distributed.process_group import ProcessGroup as _ProcessGroup
    from nvmath.distributed.process_group import ReductionOp
except ImportError:  # pragma: no cover - depends on the environment
    _ProcessGroup = object

    class ReductionOp:  # type: ignore[no-redef]
        SUM, MIN, MAX = 0, 1, 2


from dask_redist.errors import RedistTimeoutError

_REDUCE = {0: np.sum, 1: np.min, 2: np.max}

#: exchange(tag, payload) -> every rank's payload, in rank order
Exchange = Callable[[str, bytes], list]


class DaskProcessGroup(_ProcessGroup):
    """Rank ``rank`` of ``nranks`` in group ``name``; ``exchange`` does the all-gather."""

    def __init__(self, name: str, rank: int, nranks: int, exchange: Exchange):
        if not 0 <= rank < nranks:
            raise ValueError(f"rank {rank} is not in [0, {nranks})")
        self.name = name
        self._rank, self._nranks = rank, nranks
        self._exchange = exchange
        self._step = 0

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def nranks(self) -> int:
        return self._nranks

    def allgather(self, obj: Any) -> list:
        """Every rank's ``obj``, in rank order (fresh copies)."""
        self._step += 1
        payloads = self._exchange(f"{self.name}/{self._step}", pickle.dumps(obj))
        return [pickle.loads(p) for p in payloads]

    def broadcast_buffer(self, array: np.ndarray, *, root: int = 0) -> None:
        values = self.allgather(array if self._rank == root else None)
        array[...] = values[root]

    def allreduce_buffer(self, array: np.ndarray, *, op) -> None:
        values = self.allgather(array)
        array[...] = _REDUCE[int(op)](np.stack(values), axis=0)

    def allreduce_object(self, obj, *, op):
        return functools.reduce(op, self.allgather(obj))

    def barrier(self) -> None:
        self.allgather(None)


class Rendezvous:
    """The scheduler's side of `DaskProcessGroup.allgather`: one slot per tag."""

    def __init__(self):
        self._slots: dict[str, dict] = {}

    async def gather(self, tag: str, rank: int, nranks: int, payload: bytes, timeout: float) -> list:
        slot = self._slots.setdefault(tag, {"values": {}, "event": asyncio.Event(), "served": 0})
        slot["values"][rank] = payload
        if len(slot["values"]) == nranks:
            slot["event"].set()
        try:
            await asyncio.wait_for(slot["event"].wait(), timeout)
        except asyncio.TimeoutError:
            missing = sorted(set(range(nranks)) - set(slot["values"]))
            self._slots.pop(tag, None)
            raise RedistTimeoutError(
                f"process group step {tag}: rank {rank} waited {timeout:g}s for ranks {missing}"
            ) from None
        slot["served"] += 1
        if slot["served"] == nranks:
            self._slots.pop(tag, None)
        return [slot["values"][r] for r in range(nranks)]

    def abort(self, prefix: str) -> None:
        """Forget the pending steps of a group (its ranks time out on their own)."""
        for tag in [t for t in self._slots if t.startswith(prefix)]:
            del self._slots[tag]


def scheduler_exchange(state, nranks: int, rank: int, timeout: float) -> Exchange:
    """An `Exchange` for a worker: an RPC to the scheduler's ``redist_allgather``."""

    def exchange(tag: str, payload: bytes) -> list:
        start = time.monotonic()

        async def call():
            return await state.worker.scheduler.redist_allgather(
                tag=tag, rank=rank, nranks=nranks, payload=payload, timeout=timeout
            )

        response = state.call(call, timeout + 5, f"process group step {tag}")
        if response.get("status") != "OK":
            raise RedistTimeoutError(
                f"{response.get('message')} (after {time.monotonic() - start:.1f}s; see redist.timeouts.bootstrap)"
            )
        return response["values"]

    return exchange
