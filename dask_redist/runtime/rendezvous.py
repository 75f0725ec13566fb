"""The scheduler's side of the all-gather that NVSHMEM's bootstrap runs through, and of
questions put to every worker (`ask_each`).

nvmath bootstraps NVSHMEM (and plans some operations) with a handful of tiny
collectives. Dask workers have no MPI communicator, but they all reach the
scheduler, so every collective is one all-gather there: each rank sends its
pickled contribution (``redist_allgather``), and the scheduler answers every rank
with all of them once the last arrived, or with an error when ``timeout`` passes.
The workers' side is `dask_redist.runtime.transport.scheduler_exchange`; the group
built on it, `dask_redist.engines.cufftmp.world.DaskProcessGroup`.
"""

from __future__ import annotations

import asyncio

from dask_redist.core.messages import AllgatherReply
from dask_redist.errors import RedistTimeoutError


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

    async def handle(
        self, tag: str, rank: int, nranks: int, payload: bytes, timeout: float
    ) -> AllgatherReply:
        """The ``redist_allgather`` handler: every rank's payload, or the timeout's message."""
        try:
            return {"status": "OK", "values": await self.gather(tag, rank, nranks, payload, timeout)}
        except RedistTimeoutError as e:
            return {"status": "error", "message": str(e)}


async def ask_each(scheduler, msg: dict, workers, timeout: float) -> dict:
    """Each worker's answer to ``msg``, asked at once. A worker that fails, or gives no answer
    within ``timeout`` (stopped, or its event loop blocked), gets a string saying so instead of
    holding up the rest: a worker stopped with SIGSTOP held ``dask_redist.status`` until it was
    resumed when the workers were asked all in one call."""

    op, kwargs = msg["op"], {k: v for k, v in msg.items() if k != "op"}

    async def one(worker: str):
        # not asyncio.wait_for: it returns only once the cancelled call has unwound, and a call
        # to a worker whose process is frozen need not unwind promptly
        # (and not `Scheduler.broadcast`, which logs an error for a worker just killed, which
        # the answer already says)
        call = asyncio.ensure_future(getattr(scheduler.rpc(worker), op)(**kwargs))
        done, _ = await asyncio.wait([call], timeout=timeout)
        if not done:
            call.cancel()
            call.add_done_callback(_retrieve)
            return f"no answer within {timeout:g}s (the worker is stopped or busy)"
        try:
            return call.result()
        except Exception as e:  # (it left, or the handler failed)
            return f"{type(e).__name__}: {e}"

    workers = list(workers)
    return dict(zip(workers, await asyncio.gather(*map(one, workers))))


def _retrieve(call: asyncio.Future) -> None:
    """Consume the outcome of a call given up on (asyncio would log it as never retrieved)."""
    if not call.cancelled():
        call.exception()
