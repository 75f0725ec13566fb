"""A distributed FFT run on the cufftmp engine: leg in, the transforms, leg out.

A run whose spec carries an FFT (`dask_redist.planning.fft.DistributedFFT`, ``spec.fft``; ``dfft``
below) is executed by the same engine, on the same collective thread, in the same global order as a rechunk:

0. *setup*: nvmath-python's stateful ``FFT`` for the geometry, planned, on an operand on the
   symmetric heap (``allocate_operand``; the input slab the geometry names, ``Slab.X``, or
   ``Slab.Y`` for C2R, the complementary slab out, ``redistribute=False``), kept per geometry
   for later runs (`FFTs`). Made before any data moves, and agreed on by every rank
   (`setup`, `agree`): where it fails alike everywhere before cuFFTMp's planning, the run is
   refused (`RunRefusedError`) and the world stays usable;
1. *leg in*: the input chunks are rechunked into this rank's input slab, by the engine's own
   rechunk path (`Leg`: a run as that path sees one, with its own plan and outputs);
2. one cuFFTMp transform per batch; each is queued like a round of a rechunk and waited for
   by polling (`dask_redist.engines.rounds`);
3. *leg out*: the output slabs, scaled for ``norm``, are rechunked into the output chunks (they
   are the output chunks where those are the slabs on their ranks: one PE's one chunk).

A world of one PE needs no symmetric heap and no cuFFTMp (`dask_redist.engines.cufftmp.one_pe`):
cuFFT transforms its input chunks where they are, where they split the first axis only, else the
whole array its leg in gathers; the leg out rechunks the result where other chunks are asked for.

Every rank makes the same collective calls in the same order. An aborted run, or a rank's
own error in one step, completes the remaining steps dry (copies skipped, the collective
calls made), as a rechunk's rounds do; the error is raised at the end.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import replace
from functools import cached_property

from dask_redist.engines.cufftmp import one_pe
from dask_redist.errors import RedistError, RunRefusedError

#: FFT plans (with their operands on the symmetric heap) kept for later runs.
FFTS_KEPT = 2


class Leg:
    """One rechunk of an FFT run, as the engine's rechunk path reads a run: its own ``spec``,
    ``plan``, ``inputs`` and ``outputs``; the run's rank, aborts and timeouts. ``error``: this
    rank's own error in an earlier step (the leg then runs dry and raises it). ``into``: output
    chunks already allocated, by index (the leg in writes this rank's slab straight into the
    FFT's operand where it can: `operand_as_slab`)."""

    def __init__(self, run, spec, inputs: dict, error: BaseException | None = None, into=None):
        self._run = run
        self.spec = spec
        self.inputs = inputs
        self.outputs: dict = {}
        self.error = error
        self.into: dict = into or {}

    @cached_property
    def plan(self):
        return self.spec.plan

    @property
    def state(self) -> str:
        return "failed" if self.error is not None else self._run.state

    def failure(self) -> BaseException:
        return self.error if self.error is not None else self._run.failure()

    def finish(self, outputs: dict) -> None:
        self.outputs = outputs

    def __getattr__(self, name):  # rank, run_id, timeout, must_stop, set_phase, name, phase
        return getattr(self._run, name)


def leg_spec(spec, rechunk, dtype, in_ranks, out_ranks, needed=None):
    """The `RunSpec` of one leg of the FFT run ``spec``."""
    collective = replace(spec.collective, rechunk=rechunk, dtype=dtype, fft=None)
    return replace(spec, collective=collective, in_ranks=in_ranks, out_ranks=out_ranks, needed=needed)


class _Transform:
    def __init__(self, fft, operand):
        self.fft, self.operand = fft, operand


#: Where an FFT's setup failed (`SetupFailed.stage`): nvmath's ``allocate_operand`` (nothing
#: allocated: its checks are agreed on by every process before it allocates), the ``FFT``
#: constructor (the operand allocated; its checks are agreed on the same way), or ``plan``
#: (cuFFTMp's collective planning: what it left on each rank is not known).
STAGES = ("operand", "fft", "plan")


class SetupFailed(Exception):
    """This rank's FFT could not be set up: at ``stage``; ``operand``: what it had allocated."""

    def __init__(self, stage: str, error: BaseException, operand=None):
        super().__init__(f"{type(error).__name__}: {error}")
        self.stage, self.error, self.operand = stage, error, operand

    @property
    def outcome(self) -> tuple[str, bool, str]:
        """What the ranks agree on (`agree`)."""
        return (self.stage, self.operand is not None, str(self))


def agree(outcomes: list) -> str:
    """What every rank does after setting up its FFT, from every rank's outcome (None: set up;
    else `SetupFailed.outcome`): "ok"; "refused" where every rank failed alike before cuFFTMp's
    planning (the same stage, the same allocations, which each rank then frees: the world is
    as before, nothing moved); else "broken" (ranks differ, or planning failed: what the
    collective left behind is not known, so the world is not to be trusted)."""
    if all(o is None for o in outcomes):
        return "ok"
    if any(o is None for o in outcomes) or len({o[:2] for o in outcomes}) != 1:
        return "broken"
    return "refused" if outcomes[0][0] in ("operand", "fft") else "broken"


class FFTs:
    """nvmath ``FFT`` objects (planned) with their operands, one per geometry, least recently
    used first. Making and freeing them is collective: every rank does it in the same runs."""

    def __init__(self):
        self._kept: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, dfft, nranks: int, rank: int, stream, make_room) -> _Transform:
        """The FFT of ``dfft``'s geometry, made if new (`SetupFailed` if it cannot be)."""
        key = (dfft.kind, dfft.in_shape[dfft.first :], dfft.in_dtype.str, dfft.parity, nranks)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        while len(self._kept) >= FFTS_KEPT:
            _free(self._kept.popitem(last=False)[1])
        make_room()  # (the arena: the legs grow it again within redist.memory-budget)
        self._kept[key] = _make(dfft, nranks, rank, stream)
        return self._kept[key]

    def release(self) -> None:
        """Free every FFT (collective; before leaving a world)."""
        while self._kept:
            _free(self._kept.popitem(last=False)[1])


def _make(dfft, nranks: int, rank: int, stream) -> _Transform:
    """This rank's planned FFT of ``dfft``: its operand (this rank's input slab, on the symmetric
    heap, sized by nvmath for the input and the output: R2C's real rows padded to
    ``2 (n // 2 + 1)``), ``Slab.X`` or ``Slab.Y`` in as ``dfft.distribution`` says, the
    complementary slab out (``redistribute=False``)."""
    import cupy
    import nvmath.distributed.fft as nfft
    from nvmath.distributed.distribution import Slab

    slab = Slab.Y if dfft.distribution == "Y" else Slab.X
    shape = dfft.slab_shape(nranks, rank, out=False)
    try:
        operand = nfft.allocate_operand(
            shape, cupy, input_dtype=dfft.in_dtype, distribution=slab, fft_type=dfft.fft_type
        )
    except Exception as e:
        raise SetupFailed("operand", e) from e
    options = nfft.FFTOptions(
        fft_type=dfft.fft_type, redistribute=False, last_axis_parity=dfft.parity
    )  # (1.0: not `reshape`)
    try:
        fft = nfft.FFT(operand, distribution=slab, options=options, stream=stream)
    except Exception as e:
        raise SetupFailed("fft", e, operand) from e
    try:
        fft.plan(stream=stream)
    except Exception as e:
        raise SetupFailed("plan", e, operand) from e
    return _Transform(fft, operand)


def _free(t: _Transform) -> None:
    import cupy

    cupy.cuda.Device().synchronize()
    t.fft.free()
    _free_operand(t.operand)


def _free_operand(operand) -> None:
    """Free an operand of `_make` (collective): the buffer nvmath allocated, of which the
    operand is a view (``allocate_operand`` returns a view of its first elements)."""
    import nvmath.distributed

    nvmath.distributed.free_symmetric_memory(operand if operand.base is None else operand.base)


def setup(engine, run) -> _Transform:
    """This rank's FFT for ``run``, set up on every rank before any data moves (collective).

    Every rank tells the others how its setup went (`agree`). Where all failed alike before
    cuFFTMp's planning, each frees what it allocated and raises `RunRefusedError`: the world
    is intact and the scheduler leaves it usable. Any other failure raises a `RedistError`
    (the world is then not trusted any more)."""
    dfft, nranks, rank = run.spec.collective.fft, len(run.spec.workers), run.rank
    run.set_phase("fft setup")
    try:
        t, mine = engine.ffts.get(dfft, nranks, rank, engine.stream, lambda: _make_room(engine)), None
    except SetupFailed as e:
        t, mine = None, e
    outcomes = engine.world.group.allgather(None if mine is None else mine.outcome)
    verdict = agree(outcomes)
    if verdict == "ok":
        return t
    failed = next(o for o in outcomes if o is not None)
    what = (
        f"cuFFTMp's FFT of {dfft.in_shape[dfft.first :]} {dfft.in_dtype} over {nranks} GPUs could not be set up "
        f"({failed[2]}); its operand and workspace live on the symmetric heap next to the rechunk's arena "
        "(redist.nvshmem.symmetric-size)"
    )
    if verdict == "refused":
        if mine.operand is not None:  # (every rank allocated one: `agree`)
            _free_operand(mine.operand)
        raise RunRefusedError(f"{run.name()}: {what}; it failed alike on every GPU before any data moved")
    raise RedistError(f"{run.name()}: {what}") from mine


def _direction(dfft):
    from nvmath.distributed.fft import FFTDirection

    return FFTDirection.INVERSE if dfft.inverse else FFTDirection.FORWARD


def transforms(engine, run, t: _Transform, slab, error=None):
    """This rank's output slab of the transforms of its input slab ``slab`` (one per batch) by
    ``t``, scaled."""
    import cupy
    from nvmath.bindings import nvshmem

    dfft, nranks, rank = run.spec.collective.fft, len(run.spec.workers), run.rank
    run.set_phase("fft")
    out_shape = dfft.slab_shape(nranks, rank, out=True, batches=True)
    step = Leg(
        run, run.spec, {}, error if slab is not None else error or RedistError(f"{run.name()}: no input slab")
    )
    out = cupy.empty(out_shape, dtype=dfft.out_dtype) if step.state != "failed" else None
    result: list = []

    def exchange(k):
        try:
            out = t.fft.execute(direction=_direction(dfft), stream=engine.stream, sync_symmetric_memory=True)
        except MemoryError as e:  # (its workspace: allocated by the first transform of a new FFT)
            raise workspace_error(dfft, nranks, len(engine.ffts), e) from e
        result[:] = [out]
        nvshmem.sync_all_on_stream(engine.stream.ptr)  # every rank is done with the operand
        engine.rounds.queued(engine._everything())

    def work(k, go):
        # (R2C's operand is a strided view, its rows padded; C2R's result is one too: copies, not views)
        if slab.data.ptr != t.operand.data.ptr:  # (else the leg in wrote it there: `operand_as_slab`)
            t.operand[...] = slab.reshape((dfft.batches, *slab.shape[dfft.first :]))[k]
        go()
        mine = out.reshape((dfft.batches, *out.shape[dfft.first :]))[k]
        if dfft.scale != 1.0:  # scaled as it is copied out: one pass
            cupy.multiply(result[0], float(dfft.scale), out=mine)
        else:
            mine[...] = result[0]

    engine.rounds.reset()
    with engine.stream:
        engine.rounds.run(step, dfft.batches, exchange, work)
    engine.rounds.wait(step)
    return out


def workspace_error(dfft, nranks: int, kept: int, error: MemoryError) -> MemoryError:
    """The error of a transform whose workspace did not fit the symmetric heap (``kept``: the
    FFTs kept, this one included), with what shares the heap and what to change."""
    return MemoryError(
        f"cuFFTMp's workspace for the FFT of {dfft.in_shape[dfft.first :]} {dfft.in_dtype} over {nranks} GPUs "
        f"did not fit the symmetric heap ({type(error).__name__}: {error}); it shares the heap with the "
        f"operands and workspaces of the {kept} FFT(s) kept and the rechunk's arena: raise "
        "redist.nvshmem.symmetric-size (NVSHMEM_SYMMETRIC_SIZE) where the workers start, or leave NVSHMEM "
        "more of the GPU (an RMM pool, other processes on it)"
    )


def operand_as_slab(t: _Transform, dfft, nranks: int, rank: int) -> dict:
    """``{rank: array}``: this rank's input slab as a view of ``t``'s operand, for the leg in to
    write into (saving one pass over the slab); empty where the operand cannot be the slab (R2C's
    padded rows, or batches: the operand holds one transform at a time)."""
    shape = dfft.slab_shape(nranks, rank, out=False, batches=True)
    operand = t.operand
    if dfft.batches != 1 or operand.dtype != dfft.in_dtype or not operand.flags.c_contiguous:
        return {}
    if operand.size != math.prod(shape):
        return {}
    return {rank: operand.reshape(shape)}


def _make_room(engine) -> None:
    import cupy

    cupy.cuda.Device().synchronize()
    engine.arena.release()


def execute(engine, run, transport) -> None:
    """Execute the FFT run ``run`` on ``engine`` (see the module)."""
    spec = run.spec
    dfft, nranks, rank = spec.collective.fft, len(spec.workers), run.rank
    if problem := dfft.problem(nranks):  # (the scheduler refuses these first: nothing was made, on no rank)
        raise RunRefusedError(f"{run.name()}: {problem}")
    clock = _Clock()
    alone = nranks == 1
    engine.prepare(run, transport, synchronize=not alone)  # (collective: the world; alone: .queued)
    if run.must_stop():
        raise run.failure()
    t = None if alone else setup(engine, run)  # (collective, before any data moves)
    clock("world and setup")
    leg_in, leg_out = dfft.legs(spec.collective.rechunk.old, nranks)
    chunks = one_pe.chunks_in_order(dfft, spec.collective.rechunk.old, run.inputs) if alone else None
    error, slab, into = None, None, {}
    if chunks is None:
        into = {} if alone else operand_as_slab(t, dfft, nranks, rank)
        first = Leg(
            run,
            leg_spec(spec, leg_in, dfft.in_dtype, spec.in_ranks, dfft.slab_ranks(nranks, False)),
            run.inputs,
            into=into,
        )
        error = _step(engine, run, lambda: engine.execute(first, transport), None)
        slab = first.outputs.get(rank)
    clock("leg in")
    holder: list = [None]

    def middle():
        if alone:
            holder[0] = one_pe.transform(run, slab if chunks is None else chunks, error)
        else:
            holder[0] = transforms(engine, run, t, slab, error)

    error = _step(engine, run, middle, error)
    clock("transforms")
    slabs = {} if holder[0] is None else {rank: holder[0]}
    if dfft.outputs_are_slabs(spec.collective.rechunk.old, nranks, spec.out_ranks):
        outputs = {r: a for r, a in slabs.items() if spec.needed is None or spec.needed.ravel()[r]}
    else:
        ranks_out = dfft.slab_ranks(nranks, True)
        second_spec = leg_spec(spec, leg_out, dfft.out_dtype, ranks_out, spec.out_ranks, spec.needed)
        second = Leg(run, second_spec, slabs, error)
        error = _step(engine, run, lambda: engine.execute(second, transport), error)
        outputs = second.outputs
    clock("leg out")
    engine._stats["ffts kept"] = len(engine.ffts)  # (status: what lives on the heap beside the arena)
    engine._stats["last fft"] = clock.spent
    engine._stats["last fft's path"] = (
        ("one PE: cuFFT, out of place" if chunks is None else "one PE: cuFFT from the input chunks")
        if alone
        else "cuFFTMp, the leg in into its operand"
        if into
        else "cuFFTMp, the leg in copied into its operand"
    )
    if error is not None:
        raise error
    run.inputs = {}
    run.finish(outputs)


class _Clock:
    """Milliseconds of wall time per step of a run, each step ending where it is named (every
    step of several PEs waits for its GPU work, so this is the step's whole time; one PE's steps
    are queued and not waited for, `.queued`: the host's time to queue them)."""

    def __init__(self):
        self._last = time.perf_counter()
        self.spent: dict[str, float] = {}

    def __call__(self, step: str) -> None:
        now = time.perf_counter()
        self.spent[f"{step} ms"] = round((now - self._last) * 1e3, 3)
        self._last = now


def _step(engine, run, fn, error):
    """Run one step; an error of this rank (or an abort) lets the later steps run dry, unless
    nothing collective can follow (the world is not up, or a rank is gone)."""
    try:
        fn()
    except Exception as e:
        if engine.world.members != run.spec.workers or run.must_stop():
            raise
        return error or (run.failure() if run.state == "failed" else e)
    return error
