"""The ``cufftmp`` engine: GPU to GPU through NVSHMEM, one cuFFTMp reshape per round.

Per worker process the engine keeps

* the NVSHMEM *world* it bootstrapped (the run's workers, in rank order;
  `dask_redist.engines.cufftmp.world`);
* a symmetric *arena*: one collective ``nvshmem_malloc`` holding the input box,
  the output box and the reshape workspace, reused by every run and grown
  (collectively, identically on every rank) only when a run needs more;
* reshape *plans* by geometry: planning costs tens of milliseconds, so a
  repeated rechunk reuses its plan.

A run is laid out by `dask_redist.planning.layout.choose_layout`: the direct box
mapping when the placement allows it (`.direct`), else the packed (P, W) matrix
(`.packed`); in rounds when it does not fit ``redist.memory-budget``. Every rank derives the same
layout from the same plan, so all of them make the same collective calls in
the same order, which NVSHMEM requires. Each round: stage the local chunks
into the arena, sync, reshape, sync, copy the output boxes out.

A world of one PE needs none of that: every piece (old chunk ∩ new chunk) is copied straight
from its input chunk into its output chunk, in one launch (`LOCAL_MAX_PIECES`): one pass over
the bytes where the arena's rounds make three, with a synchronization on either side of each
reshape and a round per ``redist.memory-budget`` (measured in docs/benchmarks.md). That launch
is queued behind the inputs' kernels and not waited for (`.queued`).

Rounds are queued asynchronously and waited for by polling (`dask_redist.engines.rounds`),
where the engine sees aborts and timeouts; an aborted run is completed dry there, so that
every rank makes the same NVSHMEM calls and no worker is lost to a cancel.
"""

from __future__ import annotations

import logging
import math
import time
from collections import namedtuple

import numpy as np

from dask_redist.engines.cufftmp import fft, peers, queued
from dask_redist.engines.copies import PieceJobs, launch
from dask_redist.engines.cufftmp.description import CufftMpDescription
from dask_redist.engines.cufftmp.direct import run_direct
from dask_redist.engines.cufftmp.host import HostLink
from dask_redist.engines.cufftmp.nvshmem import Arena, capabilities
from dask_redist.engines.cufftmp.packed import run_packed
from dask_redist.engines.cufftmp.plans import Plans, ReshapePlan
from dask_redist.engines.cufftmp.world import World
from dask_redist.engines.exchange import empty_outputs
from dask_redist.engines.protocol import Engine, Health
from dask_redist.engines.rounds import Rounds
from dask_redist.errors import EngineUnavailableError, RedistError
from dask_redist.planning.layout import DirectLayout, choose_layout

logger = logging.getLogger("dask_redist")

ALIGN = 512
#: Most pieces a world of one PE copies chunk to chunk (`_local_jobs`); beyond, the arena's rounds.
LOCAL_MAX_PIECES = 1 << 16
#: Job tables kept for a repeated rechunk (`_piece_table`; 65,536 pieces: 5 MB each).
KEPT_PIECE_JOBS = 4
#: What a run of one PE reports as its layout (`CufftMpEngine._record`).
LOCAL = namedtuple("Local", "mapping rounds")("local (one PE: chunk to chunk)", 1)
#: Whether cuFFTMp accepts a rank with an empty box (checked on the GPU node; see docs/gpu-testing.md).
ALLOW_EMPTY_BOXES = False


def _align(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


def _strides(lower, upper) -> tuple[int, int, int]:
    e = [max(0, u - l) for l, u in zip(lower, upper)]
    return (e[1] * e[2], e[2], 1)


def _local_jobs(run, outputs: dict, kept: dict | None = None) -> np.ndarray | None:
    """The copies of every piece of a one-PE run straight from its input chunk into its output
    chunk, or None where the arena's rounds are taken instead: more than `LOCAL_MAX_PIECES`
    pieces, or chunks a job table cannot describe (more than 3 axes, not C-contiguous).
    ``kept``: tables of earlier runs by geometry (`_piece_table`)."""
    rechunk = run.spec.collective.rechunk
    if not outputs:
        return np.zeros((0, 9), np.int64)
    if rechunk.ndim > 3 or run.plan.piece_count > LOCAL_MAX_PIECES:
        return None
    try:
        return _piece_table(run, kept).jobs(
            run.inputs, outputs, math.prod(rechunk.old_grid), math.prod(rechunk.new_grid)
        )
    except KeyError as e:
        raise RedistError(f"{run.name()}: {e.args[0]}") from None


def _piece_table(run, kept: dict | None, rank: int | None = None) -> PieceJobs:
    """The job table of the pieces ``rank`` sends (None: every piece of the run), relative to
    their chunks; ``kept``: tables of earlier runs by geometry, at most `KEPT_PIECE_JOBS`, the
    most recently used last (a repeated rechunk builds its table once)."""
    rechunk, plan = run.spec.collective.rechunk, run.plan
    key = (rechunk, plan.needed.tobytes())
    if rank is not None:
        key += (rank, plan.in_ranks.tobytes(), plan.out_ranks.tobytes())
    table = kept.pop(key, None) if kept is not None else None
    if table is None:  # (needed chunks only)
        table = PieceJobs.of(rechunk, plan.transfers if rank is None else plan.sends(rank))
    if kept is not None:
        kept[key] = table
        while len(kept) > KEPT_PIECE_JOBS:
            del kept[next(iter(kept))]
    return table


class CufftMpEngine(Engine):
    name = "cufftmp"
    description = CufftMpDescription
    watched = True  # a launch can block behind a reshape that waits for a dead peer
    completes_aborted_runs = True  # every rank must make the same NVSHMEM calls
    stuck_wording = "GPU inside an NVSHMEM collective that cannot finish"
    capabilities = staticmethod(capabilities)

    def __init__(self):
        self.world = World()
        self.arena = Arena()
        self.stream = None
        self._stats = {"bootstrap_s": None, "plans": 0, "plan_s": 0.0, "runs": 0, "last": None}
        self.plans = Plans(self._stats)
        self.broken: str | None = None  # why NVSHMEM in this process cannot be trusted any more
        self.rounds = Rounds(self._everything)  # what is queued on the GPU; stuck if it never ends
        self._marks: list = []
        self._keep: list = []  # what queued GPU work still reads (copy job tables), until it is done
        self.in_flight = queued.InFlight()  # the same, of one-PE runs not waited for (.queued)
        self._unrecorded = None  # (layout, marks) of a run not waited for: `stats` reads its timings
        self.host = HostLink()  # pinned staging for NumPy chunks (.host)
        self._able: dict | None = None  # capabilities(), asked at the first run
        self.ffts = fft.FFTs()  # distributed FFTs kept for later runs (.fft)
        self.piece_jobs: dict = {}  # job tables by geometry, least recently used first
        self.ipc: peers.CudaIpc | None = None  # for PEs on one GPU (.peers), made at their first run

    # -- the protocol --------------------------------------------------------------------

    def health(self) -> Health:
        broken = self.broken or self.rounds.broken or self.world.broken
        return Health(broken, self.rounds.stuck, self.rounds.in_flight_since)

    def stats(self) -> dict:
        pending = self._unrecorded
        if pending is not None and pending[1][-1][1].done:  # (a one-PE run's, once its work is done)
            self._unrecorded = None
            self._record(*pending)
        return dict(self._stats)

    def abandoned(self, run) -> None:
        """``run`` was aborted while inside NVSHMEM (its bootstrap, or a GPU wait) and never returned."""
        self.broken = f"{run.name()} was aborted inside NVSHMEM (phase {run.phase!r}) and never returned"

    def worker_left(self, address: str) -> None:
        self.world.member_left(address)

    # -- world -------------------------------------------------------------------------

    def bootstrap(self, run, exchange_factory) -> None:
        """Be in an NVSHMEM world over the run's workers (collective; once per worker set)."""
        import cupy

        if self.world.join(run, exchange_factory, self._release):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._stats["bootstrap_s"] = self.world.bootstrap_s

    def _release(self) -> None:
        """Destroy the reshape plans and FFTs and free the arena (before leaving a world)."""
        self.ffts.release()
        self.plans.forget(0)
        self.arena.release()

    # -- plans -------------------------------------------------------------------------

    def plan(self, word: int, boxes_in, boxes_out, rank: int) -> ReshapePlan:
        """The reshape plan for this geometry (all ranks' boxes: the key is the same everywhere)."""
        from nvmath.bindings import cufftMp

        def make() -> ReshapePlan:
            (lo_in, hi_in), (lo_out, hi_out) = boxes_in[rank], boxes_out[rank]
            handle = cufftMp.create_reshape()
            cufftMp.make_reshape(
                handle,
                word,
                3,
                lo_in,
                hi_in,
                _strides(lo_in, hi_in),
                lo_out,
                hi_out,
                _strides(lo_out, hi_out),
                0,
                cufftMp.MpCommType.COMM_NONE,
            )
            workspace = int(cufftMp.get_reshape_size(handle))
            # symmetric memory is allocated with the same size everywhere: agree on the largest
            return ReshapePlan(handle, int(self.world.group.allreduce_object(workspace, op=max)))

        key = (word, *(tuple((tuple(lo), tuple(hi)) for lo, hi in b) for b in (boxes_in, boxes_out)))
        return self.plans.get(key, make)

    def _mark(self, what: str, stream=None) -> None:
        """A CUDA event on the engine's stream (or ``stream``: timings without host
        synchronization), and when the host queued it."""
        import cupy

        event = cupy.cuda.Event()
        event.record(stream or self.stream)
        self._marks.append((what, event, time.perf_counter()))

    def _everything(self):
        """A CUDA event after all work queued on the engine's stream so far."""
        import cupy

        event = cupy.cuda.Event(disable_timing=True)
        event.record(self.stream)
        return event

    def exchange(self, plan: ReshapePlan, src_offset: int, dst_offset: int, ws_offset: int) -> None:
        from nvmath.bindings import cufftMp, nvshmem

        s = self.stream.ptr
        base = self.arena.ptr
        self._mark("stage")
        nvshmem.sync_all_on_stream(s)  # every rank has staged
        cufftMp.exec_reshape_async(plan.handle, base + dst_offset, base + src_offset, base + ws_offset, s)
        nvshmem.sync_all_on_stream(s)  # nobody reads our input any more: the arena is free again
        self._mark("reshape")
        self.rounds.queued(self._marks[-1][1])

    # -- a run -------------------------------------------------------------------------

    def execute(self, run, transport) -> None:
        if run.spec.collective.fft is not None:  # a distributed FFT: two legs of this path around it
            return fft.execute(self, run, transport)
        self.prepare(run, transport, synchronize=False)  # (waited for below, after the host's work)
        import cupy

        settings = run.spec.collective.settings
        xp = np if run.spec.chunk_type == "numpy" else cupy  # NumPy in, NumPy out: see .host
        outputs = empty_outputs(run, xp, peers.PAGE if xp is cupy and len(run.spec.workers) > 1 else 0)
        one_pe = len(run.spec.workers) == 1 and xp is cupy and run.state != "failed"
        if one_pe and (jobs := _local_jobs(run, outputs, self.piece_jobs)) is not None:
            return self._local(run, jobs, outputs)  # (queued behind the inputs' kernels: .queued)
        if peers.applies(run, self.world.shared_gpu, LOCAL_MAX_PIECES):
            # inputs may come from kernels still in flight, and the outputs' memory from arrays
            # whose last kernels are: the peers write into it once it is exported
            cupy.cuda.Device().synchronize()
            if self._peers(run, outputs):
                return
        run.set_phase("plan")
        layout, _ = choose_layout(
            run.plan,
            settings.memory_budget,
            size_class_bits=settings.size_class_bits,
            allow_empty=ALLOW_EMPTY_BOXES,
        )
        # inputs may come from kernels still in flight: waited for only now, the host's work above
        # (outputs, plans, copy jobs) done meanwhile
        cupy.cuda.Device().synchronize()
        run.set_phase("exchange")
        self._marks = []
        with self.stream:
            self._mark("start")
            if isinstance(layout, DirectLayout):
                run_direct(self, run, layout, outputs)
            else:
                run_packed(self, run, layout, outputs)
        self.rounds.wait(run)  # (raises an abort's error once every round is done: see .rounds)
        self.plans.forget()
        self._finish(run, layout, outputs)

    def prepare(self, run, transport, synchronize: bool = True) -> None:
        """Be able to run ``run`` here: cufftmp can run on this worker, NVSHMEM is usable, and
        this worker is in the run's world (collective: bootstrapped with the others if not).
        ``synchronize``: wait for the inputs' kernels still in flight, here."""
        if self._able is None:
            self._able = capabilities()
        if not self._able["ok"]:  # e.g. redist.engine=cufftmp on workers without GPUs
            raise EngineUnavailableError(
                f"{run.name()}: cufftmp cannot run on this worker: {self._able['reason']}"
            )
        import cupy

        if broken := self.health().broken:
            raise RedistError(f"{run.name()}: NVSHMEM is unusable in this worker: {broken}")
        if synchronize:
            cupy.cuda.Device().synchronize()  # inputs may come from kernels still in flight
        self.rounds.reset()
        run.set_phase("bootstrap")  # (an aborted run goes on, dry: see .rounds)
        self.bootstrap(run, transport.exchange_factory)

    def _local(self, run, jobs: np.ndarray, outputs: dict) -> None:
        """A run of one PE: its pieces copied chunk to chunk in one launch (`_local_jobs`), queued
        behind the inputs' kernels and not waited for (`.queued`)."""
        run.set_phase("exchange")
        self._marks = []
        self.in_flight.hold(self._launch(jobs, queued.stream()), self._keep)
        self._keep = []
        self._finish(run, LOCAL, outputs, waited=False)

    def _peers(self, run, outputs: dict) -> bool:
        """A run of PEs on one GPU: this rank's pieces copied into whichever output chunk they
        belong to, through CUDA IPC (`.peers`). False where it cannot be (every rank then takes
        the arena's rounds)."""
        run.set_phase("exchange")

        def prepare():
            if self.ipc is None:
                self.ipc = peers.CudaIpc()
            peers.opened_since(self.ipc)  # (a failed run's mappings are not this one's)
            return _piece_table(run, self.piece_jobs, run.rank), self.ipc

        def done():
            self._finish(run, peers.LAYOUT, outputs)

        self._marks, steps = [], {}
        instead = peers.run_peers(run, outputs, prepare, self.world.peers_group, self._copy, done, steps)
        if instead is not None:  # (every rank saw the same: all of them leave this path alike)
            lasting = isinstance(instead, peers.Failed) or instead.lasting
            log = logger.warning if lasting else logger.info
            log("%s: %s; the symmetric heap's rounds instead", run.name(), instead.why)
            if lasting:  # (in this world's later runs too)
                self.world.shared_gpu = False
            return False
        self._stats["last"]["steps ms"] = steps
        self._stats["last"].update(peers.opened_since(self.ipc))
        self._stats["last"]["all-gathers"] = (
            "scheduler" if self.world.peers_group is self.world.group else "files"
        )
        return True

    def _copy(self, run, jobs: np.ndarray, dry: bool = True) -> None:
        """Run a job table on the engine's stream and wait for it, polling (`Rounds.wait`: unless
        ``dry``, an abort raises once it is done)."""
        self.rounds.queued(self._launch(jobs, self.stream))
        self.rounds.wait(run, dry=dry)

    def _launch(self, jobs: np.ndarray, stream):
        """Queue a job table on ``stream`` between two marks; the event after it."""
        with stream:
            self._mark("start", stream)
            launch(jobs, self._keep)
            self._mark("reshape", stream)
        return self._marks[-1][1]

    def _finish(self, run, layout, outputs: dict, waited: bool = True) -> None:
        """``run``'s GPU work is done (or, not ``waited`` for, queued: `.queued`): its statistics
        recorded (its GPU timings once asked for, where not waited for), its inputs let go, its
        outputs given."""
        self._keep.clear()
        self._stats["runs"] += 1
        self._unrecorded = None if waited else (layout, self._marks)
        if waited:
            self._record(layout, self._marks)
        run.inputs = {}
        run.finish(outputs)

    def _record(self, layout, marks: list) -> None:
        """Milliseconds spent staging, reshaping (syncs included) and unstaging, over all rounds,
        on the GPU's clock (so a GPU idle while the host prepares a round counts in the next
        stage); and the host's: from the first mark to the last (queuing every round), of which
        waiting for a place in the queue of rounds (`dask_redist.engines.rounds.ROUNDS_AHEAD`)."""
        import cupy

        spent = {"stage": 0.0, "reshape": 0.0, "unstage": 0.0}
        for (_, a, _), (what, b, _) in zip(marks[:-1], marks[1:]):
            spent[what] += cupy.cuda.get_elapsed_time(a, b)
        self._stats["last"] = {
            "layout": layout.mapping,
            "rounds": layout.rounds,
            "arena bytes": self.arena.size,
            **{f"{k} ms": round(v, 3) for k, v in spent.items()},
            "host queuing ms": round((marks[-1][2] - marks[0][2]) * 1e3, 3),
            "host waiting ms": round(self.rounds.ahead_s * 1e3, 3),
        }

    def _regions(self, in_bytes: int, out_bytes: int, plans: list[ReshapePlan]) -> tuple[int, int, int]:
        """Arena offsets of the input box, output box and workspace, sized for every round.

        Sized once per run, before any round starts: growing the arena between rounds
        would free symmetric memory that the previous round's reshape still uses.
        """
        out_off = _align(in_bytes)
        ws_off = out_off + _align(out_bytes)
        self.arena.ensure(ws_off + _align(max([p.workspace for p in plans] + [1])))
        return 0, out_off, ws_off
