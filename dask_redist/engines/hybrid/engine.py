"""The hybrid engine: one collective whose pieces move GPU to GPU through CUDA IPC between the
workers of one host, and over Dask's comms between hosts.

Where workers span several hosts without a remote transport NVSHMEM can use, no one world can
form; the ranks of each host can still map each other's GPU memory. A run, on every rank:

1. its output chunks allocated and exported (`dask_redist.engines.ipc.export`), and the first
   all-gather: every rank's host (`dask_redist.config.host`) and exported chunks, or why they
   cannot be mapped (an aborted rank, or one that failed so far, says so: every rank then
   raises, nothing moved);
2. the routes, alike on every rank (`routes.by_ipc`): a piece between two ranks of one host
   whose every rank exported goes through CUDA IPC, every other over Dask's comms;
3. where a piece goes through IPC to a peer, the peers' chunks mapped, and a second all-gather
   saying whether every rank could: a host with a rank that could not sends all its pieces over
   comms instead (decided alike, before anything moved);
4. this rank's IPC pieces copied straight from its input chunks into whichever output chunk they
   belong to, in one launch of the copy kernel (`dask_redist.engines.copies`), and its other
   pieces packed and sent as the engine that runs over Dask's comms does
   (`dask_redist.engines.exchange.send_pieces`: delivered once it returns);
5. the last all-gather: every rank's copies done (its GPU work waited for) and its pieces sent,
   and whether that went right. Then no peer writes into this rank's chunks any more (the peers'
   chunks are unmapped), every piece over comms has arrived, and what came over comms is copied
   into the output chunks. A rank whose copies or sends failed is named on every rank: an
   `EngineUnavailableError` (``auto`` passes the engine over from then on, and the rechunk
   restarts on the engine it prefers next), or a peer leaving or a timeout as its sender said.
   No rank ever waits for pieces a failed peer never sent.

Every rank makes every all-gather whatever went wrong (what did is told to the others there),
an aborted rank too (``completes_aborted_runs``: a peer may be writing into its chunks), unless
a rank is gone (then every wait is given up). The all-gathers go through the scheduler
(`Transport.exchange_factory`, ``redist.timeouts.bootstrap``), the comms' waits have
``redist.timeouts.collective``. No NVSHMEM, no world: nothing to bootstrap, nothing stranded.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from dask_redist.config import host
from dask_redist.core.assemble import cut
from dask_redist.engines.copies import PieceJobs, addresses
from dask_redist.engines.exchange import empty_outputs, in_order, receives, send_pieces, sends
from dask_redist.engines.hybrid.description import HybridDescription
from dask_redist.engines.hybrid.routes import by_ipc, summary
from dask_redist.engines.ipc import (
    PAGE,
    ExchangeGroup,
    Exported,
    Mapped,
    Refused,
    Steps,
    export,
    gather,
    opened_since,
)
from dask_redist.engines.protocol import Engine
from dask_redist.errors import FAILURES, EngineUnavailableError, RedistError, RedistTimeoutError, failure_of

logger = logging.getLogger("dask_redist")


def capabilities() -> dict:
    """Can this process run the hybrid engine: CuPy, a GPU, and CUDA's driver API (IPC)?"""
    try:
        import cupy

        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no CuPy, no driver: the reason says so
        return {"ok": False, "reason": f"CuPy unusable: {type(e).__name__}: {e}"}
    if not gpus:
        return {"ok": False, "reason": "no GPU visible", "gpus": 0}
    try:
        from cuda.bindings import driver  # noqa: F401 - CUDA IPC's address ranges (`ipc.CudaIpc`)
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "reason": f"cuda-bindings unusable: {type(e).__name__}: {e}", "gpus": gpus}
    return {"ok": True, "reason": "CuPy and CUDA IPC load", "gpus": gpus}


class Gpu:
    """What a run does on the GPU: allocate, copy (the copy kernel), wait. A stand-in replays it
    on the CPU in tests (`HybridEngine(device=...)`)."""

    def __init__(self):
        import cupy

        from dask_redist.engines.ipc import CudaIpc

        self._cupy = cupy
        self.ipc = CudaIpc()
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._keep: list = []  # job tables in flight

    def empty(self, shape, dtype):
        return self._cupy.empty(shape, dtype=dtype)

    def synchronize(self) -> None:
        self._cupy.cuda.Device().synchronize()
        self._keep.clear()

    def launch(self, jobs: np.ndarray) -> None:
        from dask_redist.engines.copies import launch

        with self.stream:
            launch(jobs, self._keep)

    def place(self, pairs: list) -> None:
        """``dst[...] = src`` for every pair, batched into one launch where they fold."""
        from dask_redist.engines.copies import BoxCopies

        with self.stream:
            copies = BoxCopies(self._keep)
            for dst, src in pairs:  # (a piece that came as host memory is copied over first)
                copies.add(dst, src if isinstance(src, self._cupy.ndarray) else self._cupy.asarray(src))
            copies.launch()


#: What an aborted rank says in an all-gather.
ABORTED = "aborted"
#: Why an aborted rank exported nothing (a rank that failed before the first all-gather says why).
ABORTED_WHY = "the run was aborted"


class HybridEngine(Engine):
    name = "hybrid"
    description = HybridDescription
    #: a rank aborted still makes every all-gather: its peers may be writing into its chunks
    completes_aborted_runs = True
    capabilities = staticmethod(capabilities)

    def __init__(self, device=None, group=None):
        self._device = device
        self._group = group  # (tests: rank -> the all-gather; else the scheduler's, per run)
        self._stats: dict = {"runs": 0, "last": {}}

    @property
    def device(self):
        if self._device is None:
            self._device = Gpu()
        return self._device

    def stats(self) -> dict:
        return {"runs": self._stats["runs"], "last": dict(self._stats["last"])}

    def execute(self, run, transport) -> None:
        if run.spec.chunk_type not in self.description.chunk_types:
            raise RedistError(
                f"{run.name()}: the hybrid engine copies CuPy chunks only; redist.engine: auto picks an "
                "engine for NumPy chunks"
            )
        dev, rechunk, plan = self.device, run.spec.collective.rechunk, run.plan
        group = _run_group(run, transport) if self._group is None else self._group(run)
        steps = Steps({})
        opened_since(dev.ipc)  # (a failed run's mappings are not this one's)
        run.set_phase("export")
        outputs, inputs = {}, dict(run.inputs)  # (held until every copy is done: an abort empties run.inputs)
        try:
            outputs = empty_outputs(run, dev, PAGE)  # (peers of this host map them: whole pages)
            dev.synchronize()  # inputs from kernels in flight; outputs' memory the peers write into
            mine = _export(run, outputs, inputs, dev)
        except Exception as e:  # noqa: BLE001 - told to every rank, which all raise (none waits for it)
            mine = Refused(f"{type(e).__name__}: {e}", aborted=True)
        everyone = _gather(run, group, "all-gather chunks", (host(run.address), mine))
        steps("export and all-gather")
        hosts, exported = [h for h, _ in everyone], [e for _, e in everyone]
        _raise_if_aborted(run, exported)
        t = plan.transfers
        mappable = [isinstance(e, Exported) for e in exported]
        ipc = by_ipc(t.src, t.dst, hosts, mappable)
        mapped, unmapped = None, None
        if (ipc & (t.src != t.dst)).any():  # (alike on every rank) peers' chunks to map: agreed on
            mine = t.take(ipc & (t.src == run.rank))
            try:
                mapped = _map(run, dev.ipc, outputs, exported, hosts, np.unique(mine.new_block), rechunk)
            except Exception as e:  # noqa: BLE001 - told to every rank: this host's pieces over comms then
                unmapped = f"{type(e).__name__}: {e}"
            failed = _gather(run, group, "all-gather mapped", unmapped)
            steps("map and all-gather")
            if any(why is not None for why in failed):
                for r, why in enumerate(failed):
                    if why is not None:
                        mappable[r] = False
                        logger.warning(
                            "%s: rank %d could not map its peers' chunks (%s): over comms", run.name(), r, why
                        )
                ipc = by_ipc(t.src, t.dst, hosts, mappable)
        try:
            status = self._move(run, transport, dev, t, ipc, inputs, outputs, mapped)
            statuses = _gather(run, group, "all-gather moved", status)
        finally:
            if mapped is not None:
                mapped.close()
        steps("copy, send and all-gather")
        _raise_if_failed(run, statuses)
        # (every piece over comms was delivered before its sender said so in the all-gather)
        recv = receives(run, t.take(~ipc))
        received = run.wait_received(recv)
        dev.place(_placed(recv, received, outputs, rechunk))
        dev.synchronize()
        steps("receive")
        self._stats["runs"] += 1
        self._stats["last"] = {
            "layout": "hybrid (CUDA IPC within a host, comms between hosts)",
            "rounds": 1,
            "hosts": len(set(hosts)),
            **summary(t.nbytes, t.src, t.dst, ipc),
            "steps ms": steps.ms,
            **opened_since(dev.ipc),
        }
        run.inputs = {}
        run.finish(outputs)

    def _move(self, run, transport, dev, t, ipc, inputs, outputs, mapped):
        """This rank's IPC pieces copied (the kernel runs while the others are packed and sent) and
        its other pieces sent, its GPU work waited for; its status for the last all-gather: None,
        ``ABORTED``, or (the failure's kind, why) where it failed."""
        try:
            if run.state == "failed":
                return ABORTED
            run.set_phase("exchange")
            copying = None  # (a copy that fails still lets this rank send: no peer misses its pieces)
            try:
                self._copy(run, dev, t.take(ipc & (t.src == run.rank)), inputs, outputs, mapped)
            except Exception as e:  # noqa: BLE001 - raised once its pieces are sent
                copying = e
            send_pieces(run, transport, sends(run, t.take(~ipc)))
            dev.synchronize()  # (the copies into the peers' chunks done before the peers hear so)
            if copying is not None:
                raise copying
            return None
        except Exception as e:  # noqa: BLE001 - told to every rank in the last all-gather
            try:
                dev.synchronize()  # (the peers' chunks stay mapped until the kernel is done)
            except Exception:  # noqa: BLE001 - the first error is the one to tell
                pass
            if run.state == "failed":
                return ABORTED
            return (failure_of(e) if isinstance(e, RedistError) else "copy", f"{type(e).__name__}: {e}")

    @staticmethod
    def _copy(run, dev, mine, inputs: dict, outputs: dict, mapped) -> None:
        """This rank's pieces ``mine`` copied by one launch of the copy kernel into the output chunks
        they belong to: its own, and its peers' of its host as ``mapped``."""
        if not len(mine):
            return
        rechunk = run.spec.collective.rechunk
        table = PieceJobs.of(rechunk, mine)
        at = mapped.addresses if mapped is not None else addresses(outputs, math.prod(rechunk.new_grid))
        dev.launch(table.at(addresses(inputs, math.prod(rechunk.old_grid)), at))


def _export(run, outputs: dict, inputs: dict, dev) -> Exported | Refused:
    """This rank's output chunks as its peers map them, or why they cannot be (the pieces of its
    host then go over comms)."""
    if run.state == "failed":
        return Refused(ABORTED_WHY, aborted=True)
    if run.spec.collective.rechunk.ndim > 3:
        return Refused("more than 3 axes (the copy kernel's jobs have 3)")
    if not all(a.flags.c_contiguous for a in (*inputs.values(), *outputs.values())):
        return Refused("a chunk is not C-contiguous")
    try:
        return export(outputs, dev.ipc)
    except Exception as e:  # noqa: BLE001 - told to every rank
        return Refused(f"{type(e).__name__}: {e}", lasting=True)


def _run_group(run, transport) -> ExchangeGroup:
    """The run's all-gather among all its ranks, through the scheduler, step by step."""
    exchange = transport.exchange_factory(run.rank, len(run.spec.workers))
    return ExchangeGroup(f"hybrid/{run.spec.token}/{run.run_id}", exchange)


def _gather(run, group, phase: str, payload) -> list:
    """The all-gather of step ``phase``, its timeout's error naming the run, rank and phase."""
    run.phase = phase
    try:
        return gather(run, group, payload)
    except RedistTimeoutError as e:
        raise RedistTimeoutError(f"{run.name()} timed out in phase '{phase}': {e}") from None


def _raise_if_aborted(run, exported: list) -> None:
    """An aborted rank (as it said in the first all-gather) ends the run on every rank, before
    anything moved: its own abort, or one naming it. Decided from the all-gather alone: a rank
    whose abort arrived after it exported makes the next all-gathers as its peers do (it says
    it was aborted in the last)."""
    aborted = [r for r, e in enumerate(exported) if isinstance(e, Refused) and e.aborted]
    if not aborted:
        return
    if run.state == "failed":
        raise run.failure()
    r = aborted[0]
    why = exported[r].why
    raise RedistError(
        f"{run.name()}: rank {r} ({run.spec.workers[r]}) "
        + ("was aborted" if why == ABORTED_WHY else f"failed in phase 'export': {why}")
    )


def _raise_if_failed(run, statuses: list) -> None:
    """The run's end as the last all-gather says, alike on every rank: this rank's abort, a rank
    whose copies failed (named, with why: `EngineUnavailableError`, so that ``auto`` passes the
    engine over from then on and the rechunk restarts on another), or an aborted rank; else
    nothing (every copy done)."""
    if run.state == "failed":
        raise run.failure()
    bad = [(r, s) for r, s in enumerate(statuses) if s is not None and s != ABORTED]
    if bad:
        r, (kind, why) = bad[0]
        where = f"{run.name()}: rank {r} ({run.spec.workers[r]}) failed in phase 'exchange' of the hybrid engine: {why}"
        if kind in ("restart", "timeout"):  # (a peer leaving, a timeout: as the engine that sent said)
            raise FAILURES[kind](where)
        raise EngineUnavailableError(  # (under auto the rechunk restarts, on an engine auto prefers next)
            f"{where} (redist.engine: auto finishes the rechunk on another engine)"
        )
    if aborted := [r for r, s in enumerate(statuses) if s == ABORTED]:
        raise RedistError(f"{run.name()}: rank {aborted[0]} ({run.spec.workers[aborted[0]]}) was aborted")


def _map(run, ipc, outputs: dict, exported: list, hosts: list, wanted: np.ndarray, rechunk) -> Mapped:
    """The output chunks this rank writes to through IPC (flat indices ``wanted``): its own, and
    its peers' of its host, mapped here."""
    mapped = Mapped(ipc, outputs, math.prod(rechunk.new_grid))
    try:
        for peer, e in enumerate(exported):
            if peer != run.rank and hosts[peer] == hosts[run.rank] and isinstance(e, Exported):
                mapped.peer(e, wanted)
    except BaseException:
        mapped.close()
        raise
    return mapped


def _placed(recv, received: dict, outputs: dict, rechunk) -> list:
    """(view of its output chunk, piece) for every piece received over comms, in ``recv``'s order."""
    return [
        (cut(outputs[f], rechunk.new_box(f)[0], lo, hi), piece)
        for f, lo, hi, piece in zip(recv.new_block.tolist(), recv.lo, recv.hi, in_order(recv, received))
    ]
