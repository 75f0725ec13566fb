"""The messages between the collective's processes, typed: one source for their names and fields.

Each message is a frozen dataclass: ``op`` names the handler that takes it, its fields are
that handler's keyword arguments (tests/test_messages.py checks every handler against its
message). Senders build one and send ``.to_dict()`` on a stream or ``await msg.call(rpc)``;
handlers are registered under ``Message.op``. Replies are `TypedDict`s.

* scheduler -> worker, on the worker's stream: `Start`, `Abort`, `Gone`, `Cleanup`, `Forget`, `Drop`;
* worker -> scheduler: `Barrier` (`BarrierReply`), `Failed`, `Stale` (`StaleReply`),
  `Allgather` (`AllgatherReply`); and `StageDone`, an event on the worker's stream (its ``op``
  the topic: `Worker.log_event`, taken by the plugin's ``log_event``);
* scheduler -> worker: `Capabilities`, `WorkerStatus`;
* worker -> worker: `Pieces`;
* client -> scheduler: `Probe`, `ForgetWorld`, `SchedulerStatus`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict


@dataclass(frozen=True)
class Message:
    """``op``: the handler's name; the fields: its keyword arguments."""

    op: ClassVar[str] = ""

    def kwargs(self) -> dict:
        """The fields, as the handler's keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_dict(self) -> dict:
        """As a stream message: ``{"op": ..., **kwargs}``."""
        return {"op": self.op, **self.kwargs()}

    async def call(self, rpc) -> Any:
        """Ask ``rpc`` (a Scheduler's or worker's rpc, ``client.scheduler``) and return its reply.
        Fields left at their default are not sent (the handler's default is the same): a handler
        from before such a field was added still answers."""
        return await getattr(rpc, self.op)(**self._non_default())

    def _non_default(self) -> dict:
        """The fields not at their default, as keyword arguments."""
        return {k: v for k, v in self.kwargs().items() if not _at_default(self, k, v)}


def _at_default(message: Message, name: str, value) -> bool:
    default = message.__dataclass_fields__[name].default
    return default is not dataclasses.MISSING and type(value) is type(default) and value == default


# -- scheduler -> worker, on the worker's stream (RedistWorkerPlugin) ---------------------------


@dataclass(frozen=True)
class Start(Message):
    """Start a run: ``run`` is its `dask_redist.core.spec.RunSpec` (wrapped in ``ToPickle``)."""

    op: ClassVar[str] = "redist-start"
    run: Any


@dataclass(frozen=True)
class Abort(Message):
    """Fail run ``run_id`` of ``token`` with ``reason``, as the error `dask_redist.errors.FAILURES`
    names (``failure``); ``gone``: its ranks that left (their calls never come)."""

    op: ClassVar[str] = "redist-abort"
    token: str
    run_id: int
    reason: str
    failure: str
    gone: list


@dataclass(frozen=True)
class Gone(Message):
    """``worker`` left: runs aborted before that it was a rank of stop completing."""

    op: ClassVar[str] = "redist-gone"
    worker: str


@dataclass(frozen=True)
class Cleanup(Message):
    """The runs of ``token`` up to ``run_id`` are done: forget them."""

    op: ClassVar[str] = "redist-cleanup"
    token: str
    run_id: int


@dataclass(frozen=True)
class Forget(Message):
    """The scheduler forgot rechunk ``token``: forget its runs and staged chunks."""

    op: ClassVar[str] = "redist-forget"
    token: str


@dataclass(frozen=True)
class Drop(Message):
    """The stage key ``(stage name, *index)`` of ``token`` was released: drop its chunks."""

    op: ClassVar[str] = "redist-drop"
    token: str
    index: tuple


# -- worker -> scheduler (RedistSchedulerPlugin's handlers) -------------------------------------


@dataclass(frozen=True)
class Barrier(Message):
    """Start a run of ``token``: the workers holding staged chunks, each input chunk's holder
    (an index into ``workers``), each stage key's tail and holder, the chunks' type ("numpy", "cupy")."""

    op: ClassVar[str] = "redist_barrier"
    token: str
    workers: list
    holders: list
    homes: list
    chunk_type: str

    @classmethod
    def of(cls, token: str, stages, what: str) -> Barrier:
        """From what the stage tasks staged: for each, ``(address, tail, indices, types)`` (the
        worker, the stage key's tail, the input chunks' flat indices and their types); a
        TypeError (``what`` first) where the chunks are of mixed types."""
        stages = [s for s in stages if len(s[2])]
        types = set().union(*(s[3] for s in stages))
        if len(types) > 1:
            raise TypeError(
                f"{what}: input chunks of mixed types {sorted(types)}; convert them to one type "
                "first, or set redist.output-type to numpy or cupy"
            )
        workers = sorted({address for address, *_ in stages})
        position = {w: i for i, w in enumerate(workers)}
        holders = [0] * sum(len(indices) for _, _, indices, _ in stages)
        for address, _, indices, _ in stages:
            for index in indices:
                holders[index] = position[address]
        homes = [[list(tail), position[address]] for address, tail, _, _ in stages]
        return cls(token, workers, holders, homes, types.pop() if types else "numpy")


class BarrierReply(TypedDict, total=False):
    status: str  # "OK", "stale" (nobody takes the barrier's result) or "error"
    run_id: int  # with "OK": the run started (0: none was needed)
    message: str
    fatal: bool  # with "error": not to be retried (a RedistError, not a consistency error)


@dataclass(frozen=True)
class Failed(Message):
    """Run ``run_id`` of ``token`` failed on ``address`` (``failure``: `dask_redist.errors.FAILURES`).
    The reply: whether the scheduler took it (an abort of the run follows; the rank holds its
    error until then), False for a run it no longer runs."""

    op: ClassVar[str] = "redist_failed"
    token: str
    run_id: int
    address: str
    message: str
    failure: str


@dataclass(frozen=True)
class Stale(Message):
    """An unpack task found output chunk ``index`` of run ``run_id`` missing: is its barrier stale?"""

    op: ClassVar[str] = "redist_stale"
    token: str
    run_id: int
    index: int


class StaleReply(TypedDict, total=False):
    stale: bool
    released: bool  # the barrier was released to run again


@dataclass(frozen=True)
class Allgather(Message):
    """Rank ``rank`` of ``nranks``'s contribution to step ``tag`` of a process group."""

    op: ClassVar[str] = "redist_allgather"
    tag: str
    rank: int
    nranks: int
    payload: bytes
    timeout: float


class AllgatherReply(TypedDict, total=False):
    status: str  # "OK" or "error"
    values: list  # with "OK": every rank's payload, in rank order
    message: str


@dataclass(frozen=True)
class Event(Message):
    """Not a call: an event on the worker's batched stream, its ``op`` the topic, taken by the
    scheduler plugin's ``log_event``, which drops it from the scheduler's event log once read
    (`dask_redist.runtime.eager.forget_events`)."""

    def send(self, worker) -> None:
        """From ``worker`` (a Worker; from any thread), behind what its stream already carries."""
        worker.log_event(self.op, self.kwargs())


@dataclass(frozen=True)
class StageDone(Event):
    """A stage task of ``token`` staged input chunks ``indices`` (flat) of ``chunk_type`` ("mixed"
    where they differ, "" where there are none) under stage key tail ``tail``; sent when the task's
    result is in memory, just ahead of it, so that the scheduler has it when the barrier task
    becomes ready (`dask_redist.runtime.eager`)."""

    op: ClassVar[str] = "redist-stage-done"
    token: str
    tail: list
    indices: list
    chunk_type: str


# -- scheduler -> worker ------------------------------------------------------------------------


@dataclass(frozen=True)
class Capabilities(Message):
    """Which of ``engines`` (name -> "package.module:EngineClass") can this worker run?"""

    op: ClassVar[str] = "redist_capabilities"
    engines: dict


@dataclass(frozen=True)
class WorkerStatus(Message):
    """What this worker holds for the collective (``dask_redist.status``)."""

    op: ClassVar[str] = "redist_worker_status"


# -- worker -> worker ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pieces(Message):
    """Pieces ``first ..`` (``count`` of them, packed into ``data``) that rank ``src`` sends for a run."""

    op: ClassVar[str] = "redist_receive"
    token: str
    run_id: int
    src: int
    first: int
    count: int
    data: Any


# -- client -> scheduler ------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe(Message):
    """The engines' state once every worker said which of ``engines`` it can run, the workers
    (``explain``), and which workers hold each of ``keys`` in memory (a transform's persisted
    input, grouped by holder: the same question, no second one)."""

    op: ClassVar[str] = "redist_probe"
    engines: dict
    keys: tuple = ()


@dataclass(frozen=True)
class ForgetWorld(Message):
    """The next run of ``engine`` (None: every engine) starts afresh (``bootstrap``)."""

    op: ClassVar[str] = "redist_forget_world"
    engine: str | None = None


@dataclass(frozen=True)
class SchedulerStatus(Message):
    """Runs, engines and every worker's `WorkerStatus` (``dask_redist.status``)."""

    op: ClassVar[str] = "redist_status"
