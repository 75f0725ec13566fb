"""How a worker's run reaches its peers: Dask comms for pieces, the scheduler for all-gathers;
and distributed's batched streams written at once.

`CommsTransport` is the `dask_redist.engines.protocol.Transport` the worker hands an
engine: ``send`` delivers packed pieces to peer workers over the worker's own comms
(TCP or UCX), all peers at once; ``exchange_factory`` gives the all-gather through the
scheduler (`dask_redist.runtime.rendezvous`) that NVSHMEM's bootstrap runs on. Those are
called from the collective thread and run on the worker's event loop with a timeout
(`call_on_loop`). `send_now` and `flush`, on the event loop, write a stream without waiting
out its batching interval (the scheduler's start of a run, a worker's last result of one).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from concurrent import futures
from typing import Callable

from distributed.protocol import to_serialize

from dask_redist.core import messages as m
from dask_redist.core.wire import tcp_shard_size
from dask_redist.errors import RedistConsistencyError, RedistTimeoutError


#: Seconds between two looks at ``stop`` while `call_on_loop` waits.
STOP_POLL_S = 0.1


def call_on_loop(
    worker, coro_fn, timeout: float, what: str, stop: Callable[[], BaseException | None] | None = None
):
    """Run ``coro_fn()`` on ``worker``'s event loop from another thread, within ``timeout`` seconds.

    ``stop``: asked every `STOP_POLL_S` while it waits; an error it returns cancels the call on the
    loop and is raised (a run aborted meanwhile: its sends are not waited out)."""

    async def bounded():
        return await asyncio.wait_for(coro_fn(), timeout)

    future = asyncio.run_coroutine_threadsafe(bounded(), worker.loop.asyncio_loop)
    while stop is not None and not futures.wait([future], STOP_POLL_S).done:
        if (error := stop()) is not None:
            future.cancel()
            raise error
    try:
        return future.result()
    except asyncio.TimeoutError:
        raise RedistTimeoutError(f"{what} timed out after {timeout:g}s") from None
    finally:
        del future  # (else a cycle: the future, its error, the error's frames, this one, the future)


class CommsTransport:
    """Sends ``run``'s pieces to peer workers over Dask comms, all peers at once."""

    def __init__(self, worker, run):
        self.worker, self.run = worker, run

    def send(self, batches: list) -> None:
        """A peer that cannot be reached (it is leaving, or gone) fails the run as a restart:
        the scheduler runs the rechunk again over the workers there are then (`redist.retries`)."""
        run, worker = self.run, self.worker
        by_dst: dict[int, list] = defaultdict(list)
        for dst, first, packed in batches:
            by_dst[dst].append((first, packed))

        unsent = set(by_dst)  # (peers not done yet: the timeout names them)

        async def to_peer(dst, items):
            address = run.spec.workers[dst]
            try:
                for first, packed in items:
                    pieces = m.Pieces(
                        run.spec.token, run.run_id, run.rank, first, packed.count, to_serialize(packed.buffer)
                    )
                    await pieces.call(worker.rpc(address))
                unsent.discard(dst)
            except OSError as e:  # (CommClosedError too) a peer leaving: the run restarts without it
                raise RedistConsistencyError(
                    f"{run.name()} could not send to rank {dst} ({address}): {type(e).__name__}: {e}"
                ) from e

        async def send_all():
            await asyncio.gather(*(to_peer(d, items) for d, items in by_dst.items()))

        def aborted() -> BaseException | None:  # (the abort's error: the peers' replies are not waited for)
            return run.failure() if run.must_stop() else None

        try:
            call_on_loop(worker, send_all, run.timeout, f"{run.name()} phase 'send'", stop=aborted)
        except RedistTimeoutError as e:
            if run.must_stop():  # (the abort's own error)
                raise
            peers = ", ".join(f"{d} ({run.spec.workers[d]})" for d in sorted(unsent))
            raise RedistTimeoutError(
                f"{e}: ranks {peers} did not take their pieces (stopped or busy?); "
                "raise redist.timeouts.collective if the run is just slow"
            ) from None
        finally:
            # the packed buffers go with the send: a failure's frames, kept with the failed run,
            # still reach the closures above (a frame holds its function), and so this dict
            by_dst.clear()

    def wire_limit(self, dst: int) -> int | None:
        """Over TCP (and TLS): the comm's shard size (`dask_redist.core.wire.tcp_shard_size`). None
        over UCX and inproc (no shards; inproc hands the sender's buffer over as it is)."""
        return tcp_shard_size() if self.run.spec.workers[dst].startswith(("tcp://", "tls://")) else None

    def exchange_factory(self, rank: int, nranks: int) -> Callable[[str, bytes], list]:
        """The all-gather of a process group over the scheduler, for NVSHMEM's bootstrap."""
        return scheduler_exchange(
            self.worker, nranks, rank, self.run.spec.collective.settings.bootstrap_timeout
        )


def scheduler_exchange(worker, nranks: int, rank: int, timeout: float) -> Callable[[str, bytes], list]:
    """``exchange(tag, payload) -> every rank's payload``: an RPC to the scheduler's ``redist_allgather``."""

    def exchange(tag: str, payload: bytes) -> list:
        start = time.monotonic()

        async def call() -> m.AllgatherReply:
            return await m.Allgather(tag, rank, nranks, payload, timeout).call(worker.scheduler)

        response = call_on_loop(worker, call, timeout + 5, f"process group step {tag}")
        if response.get("status") != "OK":
            raise RedistTimeoutError(
                f"{response.get('message')} (after {time.monotonic() - start:.1f}s; see redist.timeouts.bootstrap)"
            )
        return response["values"]

    return exchange


def send_now(stream, msg) -> None:
    """``msg`` on ``stream`` (distributed's ``BatchedSend``), and the stream's buffer written at
    once rather than when its interval (5 ms from the scheduler) has passed since its last write."""
    stream.send(msg)
    flush(stream)


def flush(stream) -> None:
    """``stream``'s buffer (distributed's ``BatchedSend``) written at once, not when its interval
    has passed since its last write."""
    if getattr(stream, "buffer", None) and hasattr(stream, "next_deadline") and hasattr(stream, "waker"):
        stream.next_deadline = None
        stream.waker.set()
