"""CUDA IPC between the processes of one host: output chunks exported and mapped, all-gathers
given up once a rank is gone.

Processes on one machine can map each other's GPU memory: each rank exports its output chunks
(an IPC handle per allocation, and where in it each chunk lies: `export`), the ranks all-gather
that, and each maps the chunks it writes to (`map_outputs`), copies its pieces straight into
them (`dask_redist.engines.copies`), and unmaps them once every rank said its copies are done.
A rank that cannot export (memory from a stream-ordered pool has no IPC handle) says why
(`Refused`), one whose copies went wrong says so (`Failed`), so that every rank decides alike
from what all of them sent. Used by the engines that copy chunk to chunk between processes
(PEs sharing a GPU; ranks of one host).
"""

from __future__ import annotations

import pickle
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dask_redist.engines.copies import addresses

#: Seconds between looks at ``stop()`` while an all-gather through the scheduler waits.
STOP_POLL_S = 0.05
#: Output chunks that peers map are allocated in multiples of this (`exchange.rounded_empty`): the
#: GPU's large page; an allocation that is not costs its importer far more to open (docs/benchmarks.md).
PAGE = 2 * 2**20


class Stopped(Exception):
    """An all-gather given up because its caller's ``stop()`` said so (a rank is gone)."""


def unless_stopped(stop: Callable[[], bool], exchange, tag: str, payload: bytes) -> list:
    """``exchange(tag, payload)`` on a thread of its own (the scheduler answers only once every
    rank asked, or its timeout passed), given up with `Stopped` once ``stop()``."""
    done, box = threading.Event(), []

    def target():
        try:
            box.append((True, exchange(tag, payload)))
        except BaseException as e:  # noqa: BLE001 - raised below, on the caller's thread
            box.append((False, e))
        finally:
            done.set()

    threading.Thread(target=target, name="redist-allgather", daemon=True).start()
    while not done.wait(STOP_POLL_S):
        if stop():
            raise Stopped(f"step {tag}: given up waiting for the scheduler's all-gather")
    ok, value = box[0]
    if not ok:
        raise value
    return value


class ExchangeGroup:
    """An all-gather among ranks over ``exchange`` (tag, payload -> every rank's payload, in rank
    order), step by step under ``name``: every rank's object, fresh copies. With ``stop``:
    `Stopped` once ``stop()`` is true, where a rank that is gone would never answer
    (``exchange_until(tag, payload, stop)`` where the exchange looks at ``stop`` itself, else
    `unless_stopped`)."""

    def __init__(self, name: str, exchange, exchange_until=None):
        self.name, self._exchange, self._exchange_until, self._step = name, exchange, exchange_until, 0

    def allgather(self, obj, stop: Callable[[], bool] | None = None) -> list:
        self._step += 1
        tag, payload = f"{self.name}/{self._step}", pickle.dumps(obj)
        if stop is None:
            payloads = self._exchange(tag, payload)
        elif self._exchange_until is not None:
            payloads = self._exchange_until(tag, payload, stop)
        else:
            payloads = unless_stopped(stop, self._exchange, tag, payload)
        return [pickle.loads(p) for p in payloads]


@dataclass(frozen=True)
class Exported:
    """A rank's output chunks as its peers map them: chunk ``flats[i]`` lies ``offsets[i]`` bytes
    into the allocation whose IPC handle is ``handles[allocation[i]]``."""

    flats: np.ndarray
    allocation: np.ndarray
    offsets: np.ndarray
    handles: tuple[bytes, ...]


@dataclass(frozen=True)
class Refused:
    """A rank that cannot take part: ``aborted`` (the run was), or it cannot export (``why``);
    ``lasting``: nor will it in later runs (its memory has no IPC handles, CUDA IPC is missing)."""

    why: str
    aborted: bool = False
    lasting: bool = False


class CudaIpc:
    """CUDA IPC for `export` and `Mapped`: handles of allocations, mapped into this process.
    ``opened_bytes``: the bytes of each allocation opened since it was last emptied (a peer's whole
    allocation is mapped, however little of it the chunks written to take)."""

    def __init__(self):
        from cuda.bindings import driver

        self._driver = driver
        self.opened_bytes: list[int] = []

    def allocation(self, ptr: int) -> int:
        """The start of the allocation that holds ``ptr`` (a pool hands out parts of larger ones)."""
        err, base, _ = self._driver.cuMemGetAddressRange(ptr)
        if err != self._driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemGetAddressRange: {err.name}")
        return int(base)

    @staticmethod
    def handle(base: int) -> bytes:
        import cupy

        return cupy.cuda.runtime.ipcGetMemHandle(base)

    def open(self, handle: bytes) -> int:
        import cupy

        ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
        err, _, size = self._driver.cuMemGetAddressRange(ptr)  # (for the stats only: never raises)
        self.opened_bytes.append(int(size) if err == self._driver.CUresult.CUDA_SUCCESS else 0)
        return ptr

    @staticmethod
    def close(ptr: int) -> None:
        import cupy

        cupy.cuda.runtime.ipcCloseMemHandle(ptr)


def opened_since(ipc) -> dict:
    """For an engine's stats: the peers' allocations ``ipc`` opened since this was last asked,
    and their size (its record emptied; an IPC that keeps none says 0)."""
    sizes = getattr(ipc, "opened_bytes", [])
    opened = list(sizes)
    sizes.clear()
    return {"mapped allocations": len(opened), "mapped MiB": round(sum(opened) / 2**20, 1)}


def export(outputs: dict, ipc) -> Exported | Refused:
    """``outputs`` (flat index -> CuPy chunk) as its peers map them, or why they cannot be."""
    flats = np.fromiter(outputs, dtype=np.int64, count=len(outputs))
    ptrs = [a.data.ptr for a in outputs.values()]
    try:
        bases = [ipc.allocation(p) for p in ptrs]
        distinct = list(dict.fromkeys(bases))
        handles = tuple(ipc.handle(b) for b in distinct)
    except Exception as e:  # noqa: BLE001 - e.g. a stream-ordered pool's memory: another path then
        return Refused(
            f"its output chunks cannot be exported through CUDA IPC ({type(e).__name__}: {e})", lasting=True
        )
    where = {b: i for i, b in enumerate(distinct)}
    allocation = np.array([where[b] for b in bases], dtype=np.int64)
    offsets = np.array(ptrs, dtype=np.int64) - np.array(bases, dtype=np.int64)
    return Exported(flats, allocation, offsets, handles)


class Mapped:
    """The output chunks this rank writes to, at addresses in this process: its own as they are,
    its peers' through their opened allocations (`close` unmaps them)."""

    def __init__(self, ipc, outputs: dict, n_new: int):
        self._ipc = ipc
        self.addresses = addresses(outputs, n_new)  # (its own; the peers' as they are mapped)
        self._opened: list[int] = []

    def peer(self, exported: Exported, wanted: np.ndarray) -> None:
        """Map those of a peer's chunks that are ``wanted`` (flat indices)."""
        take = np.isin(exported.flats, wanted)
        which = exported.allocation[take]
        bases = np.full(len(exported.handles), -1, dtype=np.int64)
        for i in np.unique(which).tolist():
            bases[i] = self._ipc.open(exported.handles[i])
            self._opened.append(int(bases[i]))
        self.addresses[exported.flats[take]] = bases[which] + exported.offsets[take]

    def close(self) -> None:
        """Unmap the peers' allocations (once this rank's copies into them are done)."""
        opened, self._opened = self._opened, []
        for ptr in opened:
            self._ipc.close(ptr)


def map_outputs(everyone: list, rank: int, outputs: dict, wanted: np.ndarray, n_new: int, ipc) -> Mapped:
    """Every output chunk this rank writes to (flat indices ``wanted``), mapped here."""
    mapped = Mapped(ipc, outputs, n_new)
    try:
        for peer, exported in enumerate(everyone):
            if peer != rank:
                mapped.peer(exported, wanted)
    except BaseException:
        mapped.close()
        raise
    return mapped


class Steps:
    """Milliseconds from one step of a run to the next, by the name of the step ended."""

    def __init__(self, ms: dict):
        self.ms = ms
        self._last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = round((now - self._last) * 1e3, 3)
        self._last = now


def gather(run, group, payload) -> list:
    """``group.allgather(payload)``, given up once the run must stop (a rank is gone: it would
    never answer)."""
    try:
        return group.allgather(payload, stop=run.must_stop)
    except Stopped:
        raise run.failure() from None


@dataclass(frozen=True)
class Failed:
    """A rank's copies went wrong (``why``); ``unmapped``: it could not map its peers' chunks,
    before writing any (every rank then leaves this path alike)."""

    why: str
    unmapped: bool = False
