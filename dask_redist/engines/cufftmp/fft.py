"""A distributed FFT run on the cufftmp engine: leg in, the transforms, leg out.

A run whose spec carries an FFT (`dask_redist.planning.fft.DistributedFFT`) is executed by
the same engine, on the same collective thread, in the same global order as a rechunk:

1. *leg in*: the input chunks are rechunked into this rank's X slab, by the engine's own
   rechunk path (`Leg`: a run as that path sees one, with its own plan and outputs);
2. one cuFFTMp transform per batch, through nvmath-python's stateful ``FFT`` on an operand
   on the symmetric heap (``Slab.X`` in, ``Slab.Y`` out, ``redistribute=False``), kept per
   geometry for later runs (`FFTs`); each transform is queued like a round of a rechunk and
   waited for by polling (`dask_redist.engines.rounds`);
3. *leg out*: the Y slabs, scaled for ``norm``, are rechunked into the output chunks.

Every rank makes the same collective calls in the same order. An aborted run, or a rank's
own error in one step, completes the remaining steps dry (copies skipped, the collective
calls made), as a rechunk's rounds do; the error is raised at the end.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from functools import cached_property

from dask_redist.errors import RedistError

#: FFT plans (with their operands on the symmetric heap) kept for later runs.
FFTS_KEPT = 2


class Leg:
    """One rechunk of an FFT run, as the engine's rechunk path reads a run: its own ``spec``,
    ``plan``, ``inputs`` and ``outputs``; the run's rank, aborts and timeouts. ``error``: this
    rank's own error in an earlier step (the leg then runs dry and raises it)."""

    def __init__(self, run, spec, inputs: dict, error: BaseException | None = None):
        self._run = run
        self.spec = spec
        self.inputs = inputs
        self.outputs: dict = {}
        self.error = error

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
    collective = replace(spec.collective, rechunk=rechunk, dtype=dtype, op=None)
    return replace(spec, collective=collective, in_ranks=in_ranks, out_ranks=out_ranks, needed=needed)


class _Transform:
    def __init__(self, fft, operand):
        self.fft, self.operand = fft, operand


class FFTs:
    """nvmath ``FFT`` objects (planned) with their operands, one per geometry, least recently
    used first. Making and freeing them is collective: every rank does it in the same runs."""

    def __init__(self):
        self._kept: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, op, nranks: int, rank: int, stream, make_room) -> _Transform:
        key = (op.kind, op.in_shape[op.first :], op.in_dtype.str, op.parity, nranks)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        while len(self._kept) >= FFTS_KEPT:
            _free(self._kept.popitem(last=False)[1])
        make_room()  # (the arena: the legs grow it again within redist.memory-budget)
        try:
            self._kept[key] = _make(op, nranks, rank, stream)
        except Exception as e:
            raise RedistError(
                f"cuFFTMp's FFT of {op.in_shape[op.first :]} {op.in_dtype} over {nranks} GPUs could not be set up "
                f"({type(e).__name__}: {e}); its operand and workspace live on the symmetric heap next to the "
                "rechunk's arena: raise redist.nvshmem.symmetric-size"
            ) from e
        return self._kept[key]

    def release(self) -> None:
        """Free every FFT (collective; before leaving a world)."""
        while self._kept:
            _free(self._kept.popitem(last=False)[1])


def _make(op, nranks: int, rank: int, stream) -> _Transform:
    import cupy
    import nvmath.distributed.fft as nfft
    from nvmath.distributed.distribution import Slab

    shape = tuple(c[rank] if len(c) > 1 else c[0] for c in op.in_slabs(nranks)[op.first :])
    operand = nfft.allocate_operand(
        shape, cupy, input_dtype=op.in_dtype, distribution=Slab.X, fft_type=op.fft_type
    )
    options = nfft.FFTOptions(
        fft_type=op.fft_type, redistribute=False, last_axis_parity=op.parity
    )  # (1.0: not `reshape`)
    fft = nfft.FFT(operand, distribution=Slab.X, options=options, stream=stream)
    fft.plan(stream=stream)
    return _Transform(fft, operand)


def _free(t: _Transform) -> None:
    import cupy
    import nvmath.distributed

    cupy.cuda.Device().synchronize()
    t.fft.free()
    nvmath.distributed.free_symmetric_memory(t.operand)


def _direction(op):
    from nvmath.distributed.fft import FFTDirection

    return FFTDirection.INVERSE if op.inverse else FFTDirection.FORWARD


def transforms(engine, run, slab, error=None):
    """This rank's Y slab of the transforms of its X slab ``slab`` (one per batch), scaled."""
    import cupy
    from nvmath.bindings import nvshmem

    op, nranks, rank = run.spec.collective.op, len(run.spec.workers), run.rank
    run.set_phase("fft")
    t = engine.ffts.get(op, nranks, rank, engine.stream, lambda: _make_room(engine))
    out_shape = tuple(c[rank] if len(c) > 1 else c[0] for c in op.out_slabs(nranks))
    step = Leg(
        run, run.spec, {}, error if slab is not None else error or RedistError(f"{run.name()}: no X slab")
    )
    out = cupy.empty(out_shape, dtype=op.out_dtype) if step.state != "failed" else None
    result: list = []

    def exchange(k):
        result[:] = [
            t.fft.execute(direction=_direction(op), stream=engine.stream, sync_symmetric_memory=True)
        ]
        nvshmem.sync_all_on_stream(engine.stream.ptr)  # every rank is done with the operand
        engine.rounds.queued(engine._everything())

    def work(k, go):
        t.operand[...] = slab.reshape((op.batches, *slab.shape[op.first :]))[k]
        go()
        out.reshape((op.batches, *out.shape[op.first :]))[k] = result[0]

    engine.rounds.reset()
    with engine.stream:
        engine.rounds.run(step, op.batches, exchange, work)
        if out is not None and op.scale != 1.0:
            out *= op.scale
    engine.rounds.wait(step)
    return out


def _make_room(engine) -> None:
    import cupy

    cupy.cuda.Device().synchronize()
    engine.arena.release()


def execute(engine, run, transport) -> None:
    """Execute the FFT run ``run`` on ``engine`` (see the module)."""
    spec = run.spec
    op, nranks, rank = spec.collective.op, len(spec.workers), run.rank
    if problem := op.problem(nranks):
        raise RedistError(f"{run.name()}: {problem}")
    leg_in, leg_out = op.legs(spec.collective.rechunk.old, nranks)
    first = Leg(
        run, leg_spec(spec, leg_in, op.in_dtype, spec.in_ranks, op.slab_ranks(nranks, False)), run.inputs
    )
    error = _step(engine, run, lambda: engine.execute(first, transport), None)
    slab = first.outputs.get(rank)
    holder: list = [None]

    def middle():
        holder[0] = transforms(engine, run, slab, error)

    error = _step(engine, run, middle, error)
    ranks_out = op.slab_ranks(nranks, True)
    second_spec = leg_spec(spec, leg_out, op.out_dtype, ranks_out, spec.out_ranks, spec.needed)
    second = Leg(run, second_spec, {} if holder[0] is None else {rank: holder[0]}, error)
    error = _step(engine, run, lambda: engine.execute(second, transport), error)
    engine._stats["ffts kept"] = len(
        engine.ffts
    )  # (dask_redist.status: what lives on the heap beside the arena)
    if error is not None:
        raise error
    run.inputs = {}
    run.finish(second.outputs)


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
