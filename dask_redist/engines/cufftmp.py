"""The ``cufftmp`` engine: GPU to GPU through NVSHMEM, one cuFFTMp reshape per round.

Per worker process the engine keeps

* the NVSHMEM *world* it bootstrapped (the run's workers, in rank order),
  through a `dask_redist.process_group.DaskProcessGroup`;
* a symmetric *arena*: one collective ``nvshmem_malloc`` holding the input box,
  the output box and the reshape workspace, reused by every run and grown
  (collectively, identically on every rank) only when a run needs more;
* reshape *plans* by geometry: planning costs tens of milliseconds, so a
  repeated rechunk reuses its plan.

A run is laid out by `dask_redist.planning.layout.choose_layout`: the direct box
mapping when the placement allows it, else the packed (P, W) matrix; in rounds
when it does not fit ``redist.memory-budget``. Every rank derives the same
layout from the same plan, so all of them make the same collective calls in
the same order, which NVSHMEM requires. Each round: stage the local chunks
into the arena, sync, reshape, sync, copy the output boxes out.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from dask_redist.assemble import cut
from dask_redist.errors import EngineUnavailableError, RedistError, RedistTimeoutError
from dask_redist.planning.layout import Box, DirectLayout, PackedLayout, choose_layout, size_class
from dask_redist.planning.geometry import block_lower, chunk_box, chunk_lowers

logger = logging.getLogger("dask_redist")

ALIGN = 512
#: Rounds queued on the GPU ahead of the one it runs. Bounded so that the engine's thread
#: never blocks inside a CUDA call (a launch into a full queue) behind a reshape that waits
#: for a dead peer: it waits in `CufftMpEngine._wait`, where it sees aborts and timeouts.
ROUNDS_AHEAD = 4
#: Whether cuFFTMp accepts a rank with an empty box (checked on the GPU node; see docs/gpu-testing.md).
ALLOW_EMPTY_BOXES = False


def _align(n: int) -> int:
    return -(-int(n) // ALIGN) * ALIGN


def capabilities() -> dict:
    """Can this process run the cufftmp engine? ``{"ok": bool, "reason": str, ...}``."""
    info: dict = {"ok": False}
    try:
        import cupy

        info["gpus"] = cupy.cuda.runtime.getDeviceCount()
        if not info["gpus"]:
            info["reason"] = "no GPU visible"
            return info
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception as e:
        info["reason"] = f"CuPy unusable: {type(e).__name__}: {e}"
        return info
    try:
        import nvmath

        info["nvmath"] = nvmath.__version__
        from nvmath.bindings import cufftMp, nvshmem  # noqa: F401 - loads libcufftMp and libnvshmem
    except Exception as e:
        info["reason"] = f"nvmath-python / cuFFTMp / NVSHMEM unusable: {type(e).__name__}: {e}"
        return info
    info["ok"] = True
    info["reason"] = "CuPy, nvmath-python, cuFFTMp and NVSHMEM load"
    return info


#: NVSHMEM host libraries cuFFTMp 12.1.3 (nvidia-cufftmp-cu13) works with: 3.3.24 or later (its
#: release notes) within major version 3 (NVSHMEM keeps its host/device ABI within a major
#: version since 3.0), except 3.5.19, which broke that ABI (fixed in 3.5.21). pyproject's
#: ``[gpu]`` pin says the same: ``nvidia-nvshmem-cu13>=3.3.24,!=3.5.19,<4``.
NVSHMEM_SUPPORTED = ((3, 3, 24), (4, 0, 0))
NVSHMEM_EXCLUDED = {(3, 5, 19): "its host library broke the ABI of the team structure (fixed in 3.5.21)"}
#: From 3.5.19 the layout of RC queue pairs changed, which NVSHMEM's release notes say breaks the
#: ABI with earlier device code when IBGDA is on; cuFFTMp 12.1.3's device code is built for 3.3.24.
NVSHMEM_IBGDA_BREAK = (3, 5, 19)


def nvshmem_problem(version: tuple[int, int, int], ibgda: bool = False) -> str | None:
    """Why the NVSHMEM host library ``version`` will not work with cuFFTMp 12.1.3, or None."""
    text = ".".join(map(str, version))
    low, high = NVSHMEM_SUPPORTED
    if not low <= tuple(version) < high:
        return (
            f"NVSHMEM {text} is outside what cuFFTMp 12.1.3 supports (>= {'.'.join(map(str, low))}, < 4); "
            "pip install 'nvidia-nvshmem-cu13>=3.3.24,!=3.5.19,<4'"
        )
    if tuple(version) in NVSHMEM_EXCLUDED:
        return f"NVSHMEM {text}: {NVSHMEM_EXCLUDED[tuple(version)]}; use another release"
    if ibgda and tuple(version) >= NVSHMEM_IBGDA_BREAK:
        return (
            f"NVSHMEM {text} with NVSHMEM_IB_ENABLE_IBGDA set: from 3.5.19 IBGDA breaks the ABI with device code "
            "built for earlier releases (cuFFTMp 12.1.3's is built for 3.3.24); unset it or use NVSHMEM < 3.5.19"
        )
    return None


def nvshmem_library() -> dict:
    """The NVSHMEM host library nvmath-python loaded in this process: version (asked of the library
    itself, ``nvshmemx_vendor_get_version_info``) and path; the pip distributions' versions next to it."""
    import ctypes
    from importlib import metadata

    from nvmath.bindings import nvshmem

    nvshmem.init_status()  # nvmath loads libnvshmem_host on its first call
    info: dict = {}
    for dist in ("nvidia-nvshmem-cu13", "nvidia-cufftmp-cu13"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = None
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libnvshmem_host" in line}
    info["path"] = min(paths) if paths else None
    lib = ctypes.CDLL(info["path"] or "libnvshmem_host.so.3")
    parts = [ctypes.c_int() for _ in range(3)]
    lib.nvshmemx_vendor_get_version_info(*(ctypes.byref(p) for p in parts))
    info["version"] = tuple(p.value for p in parts)
    return info


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_symmetric_size(text: str) -> int:
    """``NVSHMEM_SYMMETRIC_SIZE`` as NVSHMEM reads it: bytes, or K/M/G/T in powers of 1024."""
    value = str(text).strip().upper().removesuffix("B")
    unit = value[-1] if value and value[-1] in _UNITS else ""
    try:
        return int(float(value[: len(value) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise ValueError(
            f"NVSHMEM_SYMMETRIC_SIZE={text!r} is not a size NVSHMEM reads (bytes, or a number with K, M, G or T); "
            "set redist.nvshmem.symmetric-size instead"
        ) from None


def heap_problem(symmetric_size: int, free: int, total: int, pool: str | None = None) -> str | None:
    """Why NVSHMEM's symmetric heap cannot fit this GPU's free memory, or None.

    NVSHMEM asks the driver for the heap when it starts; memory held by an RMM
    pool (dask-cuda's ``rmm_pool_size``) or by CuPy's cache is not free to it, and
    a failed start leaves the process unable to start NVSHMEM again.
    """
    if symmetric_size <= free:
        return None
    from dask.utils import format_bytes

    held = f"; {pool} holds most of the rest" if pool else ""
    return (
        f"NVSHMEM's symmetric heap needs {format_bytes(symmetric_size)} of GPU memory, but only {format_bytes(free)} "
        f"of {format_bytes(total)} is free{held}. Lower redist.nvshmem.symmetric-size (NVSHMEM_SYMMETRIC_SIZE; "
        "by default 1.25 x redist.memory-budget + 256 MiB) or make the RMM pool smaller (dask-cuda rmm_pool_size)"
    )


def _gpu_memory() -> tuple[int, int, str | None]:
    """Free and total bytes of this process's GPU, and the RMM pool holding it if any."""
    import sys

    import cupy

    cupy.get_default_memory_pool().free_all_blocks()  # CuPy's cache would count as taken
    free, total = cupy.cuda.runtime.memGetInfo()
    pool = None
    if "rmm" in sys.modules:  # only where the user set RMM up: never import it for this
        try:
            resource = sys.modules["rmm"].mr.get_current_device_resource()
            upstream = [resource, getattr(resource, "upstream_mr", None)]
            names = [type(r).__name__ for r in upstream if r is not None]
            pool = next((f"an RMM {n}" for n in names if "Pool" in n or "Arena" in n), None)
        except Exception:  # noqa: S110 - the pool name only decorates the message
            pass
    return int(free), int(total), pool


def _strides(lower, upper) -> tuple[int, int, int]:
    e = [max(0, u - l) for l, u in zip(lower, upper)]
    return (e[1] * e[2], e[2], 1)


@dataclass
class ReshapePlan:
    handle: int
    workspace: int


class Arena:
    """One symmetric allocation, grown collectively (every rank asks for the same size)."""

    def __init__(self):
        self.ptr = 0
        self.size = 0

    def ensure(self, nbytes: int) -> None:
        from nvmath.bindings import nvshmem

        if nbytes <= self.size:
            return
        nbytes = max(2**20, size_class(int(nbytes), 3))  # 8 size classes per octave: few regrowths, <13% slack
        import cupy

        cupy.cuda.Device().synchronize()  # nvshmem_free is not stream-ordered
        self.release()
        ptr = nvshmem.malloc(nbytes)
        if not ptr:
            raise MemoryError(
                f"nvshmem_malloc of {nbytes} bytes failed: the symmetric heap is too small. Raise "
                "redist.nvshmem.symmetric-size (NVSHMEM_SYMMETRIC_SIZE) or lower redist.memory-budget; "
                "an RMM pool holding most of the GPU also leaves NVSHMEM too little"
            )
        self.ptr, self.size = ptr, nbytes

    def view(self, offset: int, shape, dtype):
        import cupy

        mem = cupy.cuda.UnownedMemory(self.ptr, self.size, self)
        return cupy.ndarray(tuple(shape), dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, offset))

    def release(self) -> None:
        from nvmath.bindings import nvshmem

        if self.ptr:
            nvshmem.free(self.ptr)
        self.ptr, self.size = 0, 0


class CufftMpEngine:
    name = "cufftmp"

    def __init__(self):
        self.world: tuple[str, ...] | None = None
        self.group = None
        self.arena = Arena()
        self.plans: dict = {}
        self.stream = None
        self.stats = {"bootstrap_s": None, "plans": 0, "plan_s": 0.0, "runs": 0, "last": None}
        self.broken: str | None = None  # why NVSHMEM in this process cannot be trusted any more
        self.stuck = False  # GPU work of an aborted run waits inside NVSHMEM, forever
        self.in_flight_since: float | None = None  # the oldest NVSHMEM work not yet seen done was queued then
        self._marks: list = []
        self._pending: deque = deque()  # (event after a round's reshape, when it was queued)

    # -- world -------------------------------------------------------------------------

    def bootstrap(self, run, exchange_factory) -> None:
        """Initialize NVSHMEM over the run's workers (collective; once per worker set)."""
        import cupy
        import nvmath.distributed

        from dask_redist.process_group import DaskProcessGroup

        workers = run.spec.workers
        if self.world == workers:
            return
        settings = run.spec.collective.settings
        problem = None
        if self.world is not None:  # a new worker set: leave the old world first
            try:
                self._finalize_within(settings.bootstrap_timeout)
            except RedistError as e:
                problem = str(e)
        if settings.symmetric_size is not None:
            os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(settings.symmetric_size)
        elif "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:  # the arena (budget + 13% + workspace) must fit
            os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(settings.memory_budget * 5 // 4 + 2**28)
        start = time.perf_counter()
        group = DaskProcessGroup(
            f"nvshmem/{run.spec.token}/{run.run_id}", run.rank, len(workers), exchange_factory(run.rank, len(workers))
        )
        # agreed on by every rank before NVSHMEM starts: one rank refusing alone would leave
        # the others inside NVSHMEM's bootstrap until it times out
        problem = problem or self._rejoin_problem() or self._heap_problem()
        problems = [(workers[r], p) for r, p in enumerate(group.allgather(problem)) if p]
        if problems:
            raise EngineUnavailableError(f"{run.name()}: cufftmp cannot start on {problems[0][0]}: {problems[0][1]}")
        device = cupy.cuda.runtime.getDevice()
        try:
            nvmath.distributed.initialize(device, group, ["nvshmem"])
        except BaseException as e:  # noqa: B036 - NVSHMEM may be half started: never again here
            self.broken = f"NVSHMEM's bootstrap failed in this process ({type(e).__name__}: {e})"
            raise
        self.group, self.world = group, workers
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stats["bootstrap_s"] = time.perf_counter() - start
        logger.info("NVSHMEM bootstrapped over %d workers in %.2fs", len(workers), self.stats["bootstrap_s"])

    @staticmethod
    def _heap_problem() -> str | None:
        try:
            size = parse_symmetric_size(os.environ["NVSHMEM_SYMMETRIC_SIZE"])
        except ValueError as e:
            return str(e)
        return heap_problem(size, *_gpu_memory())

    def _rejoin_problem(self) -> str | None:
        """Why this process cannot start NVSHMEM for a new world: it is still up from the last one."""
        from nvmath.bindings import nvshmem

        if nvshmem.init_status() == nvshmem.STATUS_NOT_INITIALIZED:
            return None
        self.broken = "NVSHMEM is still initialized after leaving this worker's previous world; restart the worker"
        return self.broken

    def abandoned(self, run) -> None:
        """``run`` was aborted while inside NVSHMEM (its bootstrap, or a GPU wait) and never returned."""
        self.broken = f"{run.name()} was aborted inside NVSHMEM (phase {run.phase!r}) and never returned"

    def _finalize_within(self, timeout: float) -> None:
        """Finalize NVSHMEM on a helper thread: with a PE of the old world gone it may never return."""
        import threading

        done, failed = threading.Event(), []

        def target():
            try:
                self.finalize()
            except BaseException as e:  # noqa: B036 - reported below
                failed.append(e)
            finally:
                done.set()

        threading.Thread(target=target, name="redist-nvshmem-finalize", daemon=True).start()
        if not done.wait(timeout) or failed:
            why = f"failed ({type(failed[0]).__name__}: {failed[0]})" if failed else "did not return"
            self.broken = f"NVSHMEM finalize of the previous worker set {why}; restart this worker"
            raise RedistError(self.broken)

    def finalize(self) -> None:
        """Leave the NVSHMEM world, in the same process (every member of the old world does it
        in the same run, so the collective frees below match up).

        The reshape plans are destroyed and the arena freed first: NVSHMEM counts its
        initializations, and with a plan alive the finalize left NVSHMEM initialized
        for the old world (the next world, of another size, then failed to start).
        Only for a healthy world: where a PE died, the collectives here would wait
        for it forever, and the scheduler has the survivors restarted instead.
        """
        import cupy
        import nvmath.distributed
        from nvmath.bindings import cufftMp

        cupy.cuda.Device().synchronize()
        for plan in self.plans.values():
            cufftMp.destroy_reshape(plan.handle)
        self.plans.clear()
        self.arena.release()
        nvmath.distributed.finalize()
        self.world = None

    # -- plans -------------------------------------------------------------------------

    def plan(self, word: int, boxes_in, boxes_out, rank: int) -> ReshapePlan:
        """The reshape plan for this geometry (all ranks' boxes: the key is the same everywhere)."""
        from nvmath.bindings import cufftMp

        key = (word, *(tuple((tuple(lo), tuple(hi)) for lo, hi in b) for b in (boxes_in, boxes_out)))
        if key not in self.plans:
            start = time.perf_counter()
            (lo_in, hi_in), (lo_out, hi_out) = boxes_in[rank], boxes_out[rank]
            handle = cufftMp.create_reshape()
            cufftMp.make_reshape(
                handle, word, 3,
                lo_in, hi_in, _strides(lo_in, hi_in),
                lo_out, hi_out, _strides(lo_out, hi_out),
                0, cufftMp.MpCommType.COMM_NONE,
            )  # fmt: skip
            workspace = int(cufftMp.get_reshape_size(handle))
            # symmetric memory is allocated with the same size everywhere: agree on the largest
            workspace = int(self.group.allreduce_object(workspace, op=max))
            self.plans[key] = ReshapePlan(handle, workspace)
            self.stats["plans"] += 1
            self.stats["plan_s"] += time.perf_counter() - start
        return self.plans[key]

    def _mark(self, what: str) -> None:
        """A CUDA event on the engine's stream: timings without host synchronization."""
        import cupy

        event = cupy.cuda.Event()
        event.record(self.stream)
        self._marks.append((what, event))

    def exchange(self, plan: ReshapePlan, src_offset: int, dst_offset: int, ws_offset: int) -> None:
        from nvmath.bindings import cufftMp, nvshmem

        s = self.stream.ptr
        base = self.arena.ptr
        self._mark("stage")
        queued = time.monotonic()
        if self.in_flight_since is None:
            self.in_flight_since = queued
        nvshmem.sync_all_on_stream(s)  # every rank has staged
        cufftMp.exec_reshape_async(plan.handle, base + dst_offset, base + src_offset, base + ws_offset, s)
        nvshmem.sync_all_on_stream(s)  # nobody reads our input any more: the arena is free again
        self._mark("reshape")
        self._pending.append((self._marks[-1][1], queued))

    def _next_round(self, run) -> None:
        """Before queuing a round: stop if the run was aborted; keep `ROUNDS_AHEAD` at most queued."""
        if run.state == "failed":
            self._wait(run)  # raises, and marks the engine stuck if the GPU still waits on a peer
        while len(self._pending) >= ROUNDS_AHEAD:
            self._wait(run, self._pending[0][0])

    # -- a run -------------------------------------------------------------------------

    def execute(self, run, transport) -> None:
        import cupy

        if self.broken:
            raise RedistError(f"{run.name()}: NVSHMEM is unusable in this worker: {self.broken}")
        cupy.cuda.Device().synchronize()  # inputs may come from kernels still in flight
        self.in_flight_since = None  # (and an earlier run that raised has drained by now)
        run.set_phase("bootstrap")
        self.bootstrap(run, transport.exchange_factory)
        settings = run.spec.collective.settings
        run.set_phase("plan")
        layout, _ = choose_layout(
            run.plan, settings.memory_budget, size_class_bits=settings.size_class_bits, allow_empty=ALLOW_EMPTY_BOXES
        )
        spec = run.spec.collective
        outputs = {}
        for j in run.plan.owned(run.rank):
            flat = int(np.ravel_multi_index(j, spec.rechunk.new_grid))
            lo, hi = chunk_box(spec.rechunk.new, j)
            outputs[flat] = cupy.empty(tuple(h - l for l, h in zip(lo, hi)), dtype=spec.dtype)
        run.set_phase("exchange")
        self._marks = []
        self._pending.clear()
        with self.stream:
            self._mark("start")
            if isinstance(layout, DirectLayout):
                self._direct(run, layout, outputs)
            else:
                self._packed(run, layout, outputs)
        self._wait(run)
        self._record(layout)
        run.inputs = {}
        run.finish(outputs)

    def _wait(self, run, event=None) -> None:
        """Wait for ``event`` (default: all work queued so far) without blocking in CUDA: a
        dead peer must not hang this thread.

        If the run is aborted or times out while the GPU still waits inside an NVSHMEM
        collective, that collective can never finish: the engine marks itself broken so
        that later runs fail fast (the scheduler moves them to the dask engine).
        """
        import cupy

        everything = event is None
        if everything:
            event = cupy.cuda.Event(disable_timing=True)
            event.record(self.stream)
        deadline = time.monotonic() + run.timeout
        while not event.done:
            if run.state == "failed" or time.monotonic() > deadline:
                self.broken = f"{run.name()} was left unfinished on the GPU"
                self.stuck = True  # that kernel never ends: see redist.nvshmem.exit-when-stuck
                if run.state == "failed":
                    raise run.error
                raise RedistTimeoutError(
                    f"{run.name()} timed out after {run.timeout:g}s in phase 'exchange' on the GPU "
                    "(a peer never joined the reshape); raise redist.timeouts.collective if it is just slow"
                )
            time.sleep(0.0001)
        if run.state == "failed":
            if not everything:  # rounds queued after ``event`` may still wait for a peer
                self._wait(run)  # (raises)
            raise run.error
        while self._pending and self._pending[0][0].done:
            self._pending.popleft()
        self.in_flight_since = self._pending[0][1] if self._pending else None

    def _record(self, layout) -> None:
        """Milliseconds spent staging, reshaping (syncs included) and unstaging, over all rounds."""
        import cupy

        spent = {"stage": 0.0, "reshape": 0.0, "unstage": 0.0}
        for (_, a), (what, b) in zip(self._marks[:-1], self._marks[1:]):
            spent[what] += cupy.cuda.get_elapsed_time(a, b)
        self.stats["runs"] += 1
        self.stats["last"] = {
            "layout": layout.kind,
            "rounds": layout.rounds,
            "arena bytes": self.arena.size,
            **{f"{k} ms": round(v, 3) for k, v in spent.items()},
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

    def _direct(self, run, layout: DirectLayout, outputs) -> None:
        spec = run.spec.collective
        dtype, rank, nranks = spec.dtype, run.rank, len(run.spec.workers)
        item = spec.rechunk.itemsize
        in_max = max(max(b.size for b in layout.boxes(k)[0]) for k in range(layout.rounds)) * item
        out_max = max(max(b.size for b in layout.boxes(k)[1]) for k in range(layout.rounds)) * item
        chunks_in = {f: Box(*chunk_box(spec.rechunk.old, np.unravel_index(f, spec.rechunk.old_grid))) for f in run.inputs}
        chunks_out = {f: Box(*chunk_box(spec.rechunk.new, np.unravel_index(f, spec.rechunk.new_grid))) for f in outputs}
        plans = []
        for k in range(layout.rounds):  # plan every round first (collective, same order everywhere)
            boxes = list(zip(layout.folded[k].lower.tolist(), layout.folded[k].upper.tolist()))
            plans.append(self.plan(layout.folded[k].word, boxes[:nranks], boxes[nranks:], rank))
        src, dst, ws = self._regions(in_max, out_max, plans)
        for k, plan in enumerate(plans):
            self._next_round(run)
            ins, outs = layout.boxes(k)
            b_in, b_out = ins[rank], outs[rank]
            staged = self.arena.view(src, b_in.shape, dtype)
            for f, box in chunks_in.items():
                part = box.intersect(b_in)
                if part.size:
                    staged[part.slices(b_in.lower)] = run.inputs[f][part.slices(box.lower)]
            self.exchange(plan, src, dst, ws)
            received = self.arena.view(dst, b_out.shape, dtype)
            for f, box in chunks_out.items():
                part = box.intersect(b_out)
                if part.size:
                    outputs[f][part.slices(box.lower)] = received[part.slices(b_out.lower)]
            self._mark("unstage")

    def _packed(self, run, layout: PackedLayout, outputs) -> None:
        spec = run.spec.collective
        dtype, rank, nranks = spec.dtype, run.rank, len(run.spec.workers)
        word = layout.word
        old_lowers, new_lowers = chunk_lowers(spec.rechunk.old), chunk_lowers(spec.rechunk.new)
        old_grid, new_grid = spec.rechunk.old_grid, spec.rechunk.new_grid
        in_max = max(r.row_words for r in layout.rounds_) * word
        out_max = max(nranks * int(r.widths.max()) for r in layout.rounds_) * word
        plans = []
        for rnd in layout.rounds_:  # plan every round first (collective, same order everywhere)
            cols = rnd.columns
            boxes_in = [([0, s, 0], [1, s + 1, rnd.row_words]) for s in range(nranks)]
            boxes_out = [([0, 0, int(cols[d])], [1, nranks, int(cols[d + 1])]) for d in range(nranks)]
            plans.append(self.plan(word, boxes_in, boxes_out, rank))
        src, dst, ws = self._regions(in_max, out_max, plans)
        for rnd, plan in zip(layout.rounds_, plans):
            self._next_round(run)
            cols = rnd.columns
            t = rnd.transfers
            for i in np.flatnonzero(t.src == rank):
                f = int(t.old_block[i])
                piece = cut(run.inputs[f], block_lower(old_lowers, old_grid, f), t.lo[i], t.hi[i])
                offset = src + int(cols[int(t.dst[i])]) * word + int(rnd.offset[i])
                self.arena.view(offset, piece.shape, dtype)[...] = piece
            self.exchange(plan, src, dst, ws)
            width = int(rnd.widths[rank]) * word
            for i in np.flatnonzero(t.dst == rank):
                f = int(t.new_block[i])
                lower = block_lower(new_lowers, new_grid, f)
                shape = tuple(int(h - l) for l, h in zip(t.lo[i], t.hi[i]))
                offset = dst + int(t.src[i]) * width + int(rnd.offset[i])
                part = tuple(slice(int(l) - o, int(h) - o) for l, h, o in zip(t.lo[i], t.hi[i], lower))
                outputs[f][part] = self.arena.view(offset, shape, dtype)
            self._mark("unstage")
