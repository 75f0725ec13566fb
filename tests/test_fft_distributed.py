"""The GPU path of dask_redist.fft without GPUs: its geometry, plan, scaling and graph.

`simulate` carries a distributed FFT run out in NumPy as every rank of the cufftmp engine
would (`dask_redist.engines.cufftmp.fft`): leg in by the plan's pieces into input slabs, the
unnormalized transform of the slabs (cuFFTMp's part: here NumPy's over the gathered slabs,
cut into the output slabs), the scale for ``norm``, leg out by the plan's pieces into the output
chunks. It checks the geometry and the arithmetic around cuFFTMp, not cuFFTMp.
"""

from __future__ import annotations

import dask.array as da
import numpy as np

import dask_redist
import pytest
from distributed import wait
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.core.spec import CollectiveSpec
from dask_redist.errors import RedistError
from dask_redist.fft import gpu
from dask_redist.fft.plan import normalize
from dask_redist.config import Settings
from dask_redist.planning import RechunkSpec, make_plan
from dask_redist.engines.cufftmp.fft import agree
from dask_redist.planning.fft import slab_refusal, slab_sizes

UNNORMALIZED = {  # cuFFT's: no scaling in either direction
    ("c2c", False): lambda a, s, axes: np.fft.fftn(a, s, axes, norm="backward"),
    ("c2c", True): lambda a, s, axes: np.fft.ifftn(a, s, axes, norm="forward"),
    ("r2c", False): lambda a, s, axes: np.fft.rfftn(a, s, axes, norm="backward"),
    ("c2r", True): lambda a, s, axes: np.fft.irfftn(a, s, axes, norm="forward"),
}
NUMPY = {
    ("c2c", False): np.fft.fftn,
    ("c2c", True): np.fft.ifftn,
    ("r2c", False): np.fft.rfftn,
    ("c2r", True): np.fft.irfftn,
}


def _chunking(draw, n: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 3)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


@st.composite
def runs(draw):
    kind = draw(st.sampled_from(sorted(NUMPY)))
    nranks = draw(st.integers(1, 4))
    k = draw(st.sampled_from([2, 3]))
    batch = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 1))))
    shape = batch + tuple(draw(st.integers(nranks, nranks + 5)) for _ in range(k))
    if kind[0] == "c2r":
        odd = draw(st.booleans()) or shape[-1] == 1
        s = (*shape[-k:-1], 2 * (shape[-1] - 1) + odd)
    else:
        s = None
    op = normalize(
        shape,
        *kind,
        s=s,
        axes=tuple(range(len(shape) - k, len(shape))),
        norm=draw(st.sampled_from([None, "ortho", "forward"])),
    )
    dtype = "float64" if kind[0] == "r2c" else "complex128"
    assert gpu.transform_problem(op, dtype, 1) is None
    geometry = gpu.distributed(op, dtype, None)
    if geometry.problem(nranks):
        nranks = 1
    out_chunks = tuple(_chunking(draw, n) for n in op.out_shape)
    if geometry.last_axis_problem(out_chunks):  # (the API rechunks after the run then)
        out_chunks = (*out_chunks[:-1], (op.out_shape[-1],))
    geometry = gpu.distributed(op, dtype, out_chunks)
    chunks = tuple(_chunking(draw, n) for n in shape)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if dtype == "complex128" else 0)
    in_ranks = rng.integers(0, nranks, size=[len(c) for c in chunks])
    return op, geometry, a, chunks, nranks, in_ranks


def _move(plan, sources: dict, rechunk: RechunkSpec, dtype) -> dict:
    """The new chunks of ``rechunk`` built from ``sources`` (old flat index -> array) by the plan's pieces."""
    out = {}
    t = plan.transfers
    for i in range(len(t.src)):
        old, new = int(t.old_block[i]), int(t.new_block[i])
        lo_old, _ = rechunk.old_box(old)
        lo_new, hi_new = rechunk.new_box(new)
        if new not in out:
            out[new] = np.full([h - l for l, h in zip(lo_new, hi_new)], np.nan, dtype=dtype)
        src = tuple(slice(l - o, h - o) for l, h, o in zip(t.lo[i], t.hi[i], lo_old))
        dst = tuple(slice(l - o, h - o) for l, h, o in zip(t.lo[i], t.hi[i], lo_new))
        out[new][dst] = sources[old][src]
    return out


def simulate(op, geometry, a, chunks, nranks, in_ranks) -> dict:
    """Output chunks (flat index -> array) of the run, and check where each slab is on the way."""
    rechunk = RechunkSpec(chunks, geometry.input_space(geometry.out_chunks), a.itemsize)
    plan = CollectiveSpec("t", "in", "out", rechunk, a.dtype, Settings(), "cupy", fft=geometry).plan_run(
        in_ranks, nranks
    )
    assert (plan.in_ranks == in_ranks).all()
    leg_in, leg_out = geometry.legs(chunks, nranks)
    inputs = {f: a[tuple(slice(l, h) for l, h in zip(*rechunk.old_box(f)))] for f in range(in_ranks.size)}
    plan_in = make_plan(leg_in, in_ranks, nranks, out_ranks=geometry.slab_ranks(nranks, False))
    in_slabs = _move(plan_in, inputs, leg_in, a.dtype)
    assert [x.shape[geometry.in_axis] for _, x in sorted(in_slabs.items())] == list(
        slab_sizes(a.shape[geometry.in_axis], nranks)
    )
    for r, x in in_slabs.items():  # what the engine's operand holds (`FFTs`)
        assert x.shape[geometry.first :] == geometry.slab_shape(nranks, r, out=False)
    axes = tuple(range(geometry.first, a.ndim))
    whole = np.concatenate([in_slabs[r] for r in range(nranks)], axis=geometry.in_axis)
    # one PE as `engines.cufftmp.one_pe.transform`: the transform's own function, NumPy's norm,
    # C2R's output length
    if nranks == 1:
        s = geometry.out_shape[geometry.first :] if geometry.kind == "c2r" else None
        out = getattr(np.fft, geometry.function)(whole, s=s, axes=axes, norm=geometry.norm)
    else:  # as cuFFTMp: unnormalized, then scaled
        out = UNNORMALIZED[(op.kind, op.inverse)](whole, op.s, axes) * geometry.scale
    bounds = np.cumsum((0,) + geometry.out_slabs(nranks)[geometry.out_axis])
    out_slabs = {
        r: np.take(out, range(bounds[r], bounds[r + 1]), axis=geometry.out_axis) for r in range(nranks)
    }
    for r, y in out_slabs.items():
        assert y.shape[geometry.first :] == geometry.slab_shape(nranks, r, out=True)
    if geometry.outputs_are_slabs(chunks, nranks, plan.out_ranks):  # (the engine moves nothing then)
        return out_slabs
    plan_out = make_plan(leg_out, geometry.slab_ranks(nranks, True), nranks, out_ranks=plan.out_ranks)
    return _move(plan_out, out_slabs, leg_out, out.dtype)


@settings(max_examples=150, deadline=None)
@given(runs())
def test_a_simulated_run_equals_numpy(case):
    op, geometry, a, chunks, nranks, in_ranks = case
    expected = NUMPY[(op.kind, op.inverse)](a, op.s, op.axes, norm=op.norm)
    got = simulate(*case)
    out = RechunkSpec(geometry.out_chunks, geometry.out_chunks, 1)
    assert sorted(got) == list(range(int(np.prod(out.new_grid))))
    for flat, chunk in got.items():
        lo, hi = out.new_box(flat)
        np.testing.assert_allclose(
            chunk, expected[tuple(slice(l, h) for l, h in zip(lo, hi))], rtol=1e-10, atol=1e-9
        )


def test_slabs_are_cufftmps():
    """nvmath's Slab: the first ``X % P`` processes hold one more row."""
    assert slab_sizes(10, 4) == (3, 3, 2, 2) and slab_sizes(8, 4) == (2, 2, 2, 2) and slab_sizes(3, 1) == (3,)


@pytest.mark.parametrize(
    ("shape", "kind", "kwargs", "dtype", "match"),
    [
        ((8, 8, 8, 8), ("c2c", False), {}, "complex128", "4-D transform"),
        ((8,), ("c2c", False), {}, "complex128", "1-D transform"),
        ((8, 8, 8), ("c2c", False), {"axes": (0, 1)}, "complex128", "not the last 2 axes"),
        ((8, 8, 8), ("c2c", False), {"axes": (2, 1)}, "complex128", "not the last 2 axes"),
        ((8, 8), ("c2c", False), {"s": (8, 10)}, "complex128", "pads or crops"),
        ((8, 8), ("c2c", False), {}, "complex256", "takes complex64 or complex128"),
        ((8, 8), ("r2c", False), {}, "float16", "takes float32 or float64"),
        ((2, 8), ("c2c", False), {}, "complex64", "must each be at least the number of GPUs"),
    ],
)
def test_what_cufftmp_cannot_run_is_named(shape, kind, kwargs, dtype, match):
    op = normalize(shape, *kind, **kwargs)
    assert match in gpu.transform_problem(op, dtype, 4)


def test_the_gpu_path_is_on_by_default_and_its_key_is_checked():
    import dask

    from dask_redist.config import ConfigError

    assert gpu.enabled() is True
    with dask.config.set({"redist.fft.gpu": False}):
        assert gpu.enabled() is False
    with (
        dask.config.set({"redist.fft.gpu": "yes"}),
        pytest.raises(ConfigError, match="redist.fft.gpu must be"),
    ):
        gpu.enabled()
    with dask.config.set({"redist.fft.gpu": True}):
        x = da.ones((16, 16), chunks=4, dtype=complex)
        assert gpu.problem(x, normalize(x.shape, "c2c", False)).startswith("NumPy chunks")


def test_the_gpu_path_asks_the_scheduler_once_for_the_workers_and_the_engines(client, monkeypatch):
    """`gpu.where` for CuPy chunks (here a stand-in: an ndarray subclass from a module named cupy...)
    takes the workers from the engines' probe, asking nothing else of the scheduler, and on CPU
    workers says why the GPU path does not run."""

    class Chunk(np.ndarray):
        pass

    Chunk.__module__ = "cupy_stand_in"
    x = da.ones((8, 8, 6), chunks=(2, 8, 6), dtype=complex)
    x = da.Array(x.dask, x.name, x.chunks, meta=np.empty((0, 0, 0), dtype=complex).view(Chunk))

    def refused(*args, **kwargs):
        raise AssertionError("scheduler_info asked")

    monkeypatch.setattr(type(client), "scheduler_info", refused)
    problem, workers = gpu.where(x, normalize(x.shape, "c2c", False))
    assert workers is None and problem.startswith("CuPy chunks on CPU workers"), problem
    assert problem.endswith("collective rechunks and cupy.fft on every chunk"), problem


def _cupy_stand_in(x):
    """``x`` with the meta of CuPy chunks (an ndarray subclass from a module named cupy...)."""

    class Chunk(np.ndarray):
        pass

    Chunk.__module__ = "cupy_stand_in"
    return da.Array(x.dask, x.name, x.chunks, meta=np.empty((0,) * x.ndim, dtype=x.dtype).view(Chunk))


def test_the_gpu_path_learns_where_a_persisted_input_is_from_the_same_question(client, monkeypatch):
    """Where the GPU path runs (`gpu.where`, workers that can run cuFFTMp assumed here), a persisted
    input's holders come with the engines' probe: the transform's stage tasks are grouped by worker
    as `gpu.build` groups them on its own (checked against ``who_has`` below), and neither
    ``who_has`` nor ``scheduler_info`` is asked."""
    from dask_redist.core.spec import STAGE_PREFIX

    def stages(y) -> set:
        return {k for k in y.dask.layers[y.name].mapping if k[0].startswith(STAGE_PREFIX)}

    op = normalize((8, 8, 6), "c2c", False)
    x = da.from_array(np.ones((8, 8, 6), dtype=complex), chunks=(2, 4, 6)).persist()
    wait(x)
    x = _cupy_stand_in(x)
    asked = stages(gpu.build(x, op, None))  # (grouped as who_has says: the test below)
    assert len(asked) < x.npartitions

    def refused(*args, **kwargs):
        raise AssertionError("asked the scheduler again")

    monkeypatch.setattr(gpu, "_engine_problem", lambda *args: None)
    monkeypatch.setattr(type(client), "who_has", refused)
    monkeypatch.setattr(type(client), "scheduler_info", refused)
    problem, placement = gpu.where(x, op)
    assert problem is None and placement.workers == sorted(dask_redist.status(client)["workers"])
    assert stages(gpu.build(x, op, None, placement)) == asked
    _, unpersisted = gpu.where(_cupy_stand_in(da.ones((8, 8, 6), chunks=(2, 4, 6), dtype=complex)), op)
    assert unpersisted.groups is None  # (an input still to compute: one stage task per chunk)


def test_a_scheduler_that_takes_no_keys_still_answers_the_probe(client):
    """A scheduler whose dask-redist predates the probe's ``keys`` (its handler takes none): the
    engines' state comes all the same, without holders (the transform then stages per chunk)."""
    from dask_redist.cluster import engines_state

    def old_handler(dask_scheduler=None):
        plugin = dask_scheduler.plugins["redist"]

        async def probe(engines=None):
            return {k: v for k, v in (await plugin.probe(engines)).items() if k != "holders"}

        dask_scheduler.handlers["redist_probe"] = probe

    def new_handler(dask_scheduler=None):
        dask_scheduler.handlers["redist_probe"] = dask_scheduler.plugins["redist"].probe

    x = da.ones((4, 4), chunks=2).persist()
    wait(x)
    keys = [(x.name, i, j) for i in range(2) for j in range(2)]
    held = engines_state(client, Settings.from_config(), keys)
    assert all(len(h) == 1 for h in held.holders)
    client.run_on_scheduler(old_handler)
    try:
        state = engines_state(client, Settings.from_config(), keys)
    finally:
        client.run_on_scheduler(new_handler)
    assert state.workers == held.workers and state.holders == [[]] * 4


def test_an_fft_run_on_numpy_chunks_is_refused_by_the_scheduler(client):
    """The graph of the GPU path, built on NumPy chunks (which the API never does), carries the
    transform in its barrier, reaches the scheduler, and is refused there with a clear error."""
    from dask_redist.core.spec import BarrierTask

    x = da.from_array(np.ones((8, 8, 6), dtype=complex), chunks=(2, 8, 6))
    y = gpu.build(x, normalize(x.shape, "c2c", False), None)
    assert y.chunks == ((8,), slab_sizes(8, len(client.scheduler_info()["workers"])), (6,))
    (barrier,) = [t for t in y.dask.layers[y.name].mapping.values() if isinstance(t, BarrierTask)]
    assert barrier.spec.fft is not None and barrier.spec.fft.kind == "c2c"
    before = dask_redist.status(client)["engines"]["records"]  # (the client is shared: earlier tests' marks)
    with pytest.raises(RedistError, match="runs on the cufftmp engine with CuPy chunks only"):
        y.compute()
    # refused before any run: no engine is marked, and the next collective step runs
    assert dask_redist.status(client)["engines"]["records"] == before
    z = dask_redist.rechunk(x, (8, 2, 6))
    np.testing.assert_array_equal(z.compute(), x.compute())


# nvmath-python 1.0's rules for cuFFTMp's built-in slabs, re-encoded from its source
# (nvmath/distributed/fft/fft.py; nvmath is not installed here, and the tests must not lean on
# the package's own encoding of them):
# - _problem_spec_reducer: "2D FFT R2C only supports X-slab input", "2D FFT C2R only supports
#   Y-slab input" (3-D: any slab);
# - FFT.__init__ with redistribute=False: the result in the complementary slab
#   (result_partition_dim = 1 - partition_dim), global result extents: R2C's last n // 2 + 1,
#   C2R's last (m - 1) * 2, + 1 with last_axis_parity="odd";
# - _calculate_slab_shape_strides: along the partition dimension rank r holds S // n + 1 where
#   r < S % n, else S // n;
# - FFT.__init__: "The FFT dimension {i} has global length ... smaller than the number of
#   processes" for i in (0, 1) of the operand's global extents.
NVMATH_2D_INPUT_SLAB = {"r2c": 0, "c2r": 1}


def _nvmath_slab(extents, partition: int, rank: int, nranks: int) -> tuple[int, ...]:
    out = list(extents)
    size = extents[partition]
    out[partition] = size // nranks + 1 if rank < size % nranks else size // nranks
    return tuple(out)


def _nvmath_result_extents(kind: str, extents, odd: bool) -> tuple[int, ...]:
    out = list(extents)
    if kind == "r2c":
        out[-1] = out[-1] // 2 + 1
    elif kind == "c2r":
        out[-1] = (out[-1] - 1) * 2 + odd
    return tuple(out)


@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize(
    ("kind", "odd"),
    [
        (("c2c", False), False),
        (("c2c", True), False),
        (("r2c", False), False),
        (("c2r", True), False),
        (("c2r", True), True),
    ],
)
def test_the_slabs_follow_nvmaths_rules(kind, odd, k, nranks):
    """Per FFT type and dimension: the input slab nvmath accepts, the complementary output slab,
    every rank's slab shapes (uneven ones included), C2R's parity, as nvmath computes them."""
    shape = (2, 11, 9, 7)[-(k + 1) :]  # one batch axis; uneven slabs at 2, 3 and 4 ranks
    dtype = "float64" if kind[0] == "r2c" else "complex128"
    s = (*shape[-k:-1], 2 * (shape[-1] - 1) + odd) if kind[0] == "c2r" else None
    op = normalize(shape, *kind, s=s, axes=tuple(range(1, k + 1)))
    geometry = gpu.distributed(op, dtype, None)
    assert geometry.problem(nranks) is None
    partition = {"X": 0, "Y": 1}[geometry.distribution]
    if k == 2 and kind[0] in NVMATH_2D_INPUT_SLAB:
        assert partition == NVMATH_2D_INPUT_SLAB[kind[0]]
    extents = shape[1:]
    result = _nvmath_result_extents(kind[0], extents, odd)
    assert geometry.out_shape[1:] == result and geometry.parity == ("odd" if odd else "even")
    for rank in range(nranks):
        assert geometry.slab_shape(nranks, rank, out=False) == _nvmath_slab(extents, partition, rank, nranks)
        assert geometry.slab_shape(nranks, rank, out=True) == _nvmath_slab(
            result, 1 - partition, rank, nranks
        )
    assert geometry.in_axis == 1 + partition and geometry.out_axis == 2 - partition


def test_only_the_2d_slabs_nvmath_refuses_are_refused():
    assert "Slab.X input only" in slab_refusal("r2c", 2, "Y")
    assert "Slab.Y input only" in slab_refusal("c2r", 2, "X")
    assert slab_refusal("c2r", 3, "X") is None and slab_refusal("r2c", 3, "Y") is None
    assert slab_refusal("c2c", 2, "Y") is None and slab_refusal("c2c", 2, "X") is None


@pytest.mark.parametrize(
    ("shape", "kind", "s", "dtype", "nranks", "match"),
    [
        ((3, 8), ("c2c", False), None, "complex128", 4, "(3, 8; 3, 8 after it) must each be at least"),
        ((8, 5), ("r2c", False), None, "float64", 4, "(8, 5; 8, 3 after it) must each be at least"),
        ((8, 3), ("c2r", True), None, "complex64", 4, "(8, 3; 8, 4 after it) must each be at least"),
        ((8, 8), ("c2r", True), None, "float64", 1, "C2R takes complex64 or complex128"),
        ((8, 8), ("r2c", False), None, "float16", 1, "R2C takes float32 or float64"),
        ((8, 8), ("c2c", False), None, "float32", 1, "C2C takes complex64 or complex128"),
        ((8, 8, 8), ("c2c", False), None, "complex64", 1, None),
        ((4, 4), ("c2r", True), (4, 7), "complex128", 4, None),
    ],
)
def test_what_nvmath_refuses_is_refused_by_problem(shape, kind, s, dtype, nranks, match):
    """`DistributedFFT.problem` refuses before the run what nvmath would refuse inside it."""
    geometry = gpu.distributed(normalize(shape, *kind, s=s), dtype, None)
    problem = geometry.problem(nranks)
    assert (problem is None) if match is None else (match in problem), problem


def test_an_output_shape_cufftmp_does_not_make_is_refused():
    from dataclasses import replace

    geometry = gpu.distributed(normalize((8, 5), "c2r", True, s=(8, 8)), "complex128", None)
    assert geometry.problem(1) is None
    assert "C2R makes (8, 8)" in replace(geometry, out_shape=(8, 10)).problem(1)


def test_a_run_split_along_the_last_axis_has_every_output_key(client):
    """A 2-D transform's output slabs split the last axis (Y slabs; R2C's of the complex axis):
    the collective's grid must have every output key (it had one: 'lost dependencies' on the GPU)."""
    nworkers = len(client.scheduler_info()["workers"])
    assert nworkers > 1
    cases = [
        (("c2c", False), complex, None),
        (("r2c", False), float, None),
        (("r2c", False), float, ((8,), (1,) * 5)),
        (("c2r", True), complex, ((8,), (4, 4, 4, 4))),
    ]
    for kind, dtype, chunks in cases:
        x = da.from_array(np.ones((8, 9), dtype=dtype), chunks=(3, 4))
        y = gpu.build(x, normalize(x.shape, *kind), chunks)
        assert set(da.core.flatten(y.__dask_keys__())) <= set(y.dask), (kind, y.chunks)
        natural = slab_sizes(y.shape[1], nworkers)
        assert y.chunks[1] == (natural if chunks is None else chunks[1]) and len(y.chunks[1]) > 1


def test_chunks_asked_for_come_straight_out_unless_the_last_axis_has_too_many(client):
    x = da.from_array(np.ones((8, 6, 5), dtype=complex), chunks=(2, 6, 5))
    y = gpu.build(x, normalize(x.shape, "c2r", True), ((8,), (3, 3), (2, 2, 2, 2)))
    assert y.chunks == ((8,), (3, 3), (2, 2, 2, 2)) and len(dask_redist.explain(y).ffts[0].steps) == 1
    z = gpu.build(x, normalize(x.shape, "c2r", True), ((8,), (6,), (1,) * 8))
    steps = dask_redist.explain(z).ffts[0].steps
    assert (
        z.chunks[2] == (1,) * 8
        and "8 chunks along the last axis, more than the input's length (5)" in steps[-1]
    )


def test_a_setup_that_fails_alike_everywhere_is_refused_and_any_other_breaks_the_world():
    """`agree`: what every rank does after its FFT's setup, from every rank's outcome."""
    checks = ("fft", True, "ValueError: 2D FFT C2R only supports Y-slab input")
    before = ("operand", False, "ValueError: 2D FFT C2R only supports Y-slab input")
    assert agree([None]) == agree([None, None, None]) == "ok"
    assert agree([checks] * 4) == agree([before]) == agree([before, before]) == "refused"
    assert agree([("plan", True, "cuFFT error")] * 2) == "broken"  # cuFFTMp's collective planning
    assert agree([checks, None]) == agree([None, before]) == "broken"  # one rank has an FFT
    assert agree([checks, before]) == "broken"  # the ranks allocated differently


def test_a_refused_run_is_reported_as_such():
    from dask_redist.errors import FAILURES, RunRefusedError, failure_of

    assert failure_of(RunRefusedError("x")) == "refused" and FAILURES["refused"] is RunRefusedError
    assert failure_of(RedistError("x")) == "error"


def test_an_input_still_to_compute_is_not_searched_for_futures(client, monkeypatch):
    """Looking for futures in a graph of many layers would materialize it on the client (3.4 s
    for a 40,000-chunk ``(ones + 1) * 2``): only a one-layer graph, as a persisted array's, is."""
    import distributed

    def refuse(*args, **kwargs):
        raise AssertionError("futures_of was called")

    monkeypatch.setattr(distributed, "futures_of", refuse)
    assert gpu._persisted_keys((da.ones((8, 8), chunks=2) + 1) * 2) == []


def test_a_persisted_input_is_staged_by_one_task_per_worker(client):
    """As the rechunk's rewrite stages a persisted input (`graph.stages`): the transform of a
    persisted input has one stage task per worker holding its chunks, of the chunks that worker
    holds; an input still to be computed, one stage task per chunk."""
    from dask_redist.core.spec import STAGE_PREFIX

    def stages(y) -> dict:
        return {k: t for k, t in y.dask.layers[y.name].mapping.items() if k[0].startswith(STAGE_PREFIX)}

    op = normalize((8, 8, 6), "c2c", False)
    x = da.from_array(np.ones((8, 8, 6), dtype=complex), chunks=(2, 4, 6))
    assert len(stages(gpu.build(x, op, None))) == x.npartitions
    x = x.persist()
    wait(x)
    who_has = client.who_has(x)
    grouped = stages(gpu.build(x, op, None))
    holders = {min(w) for w in who_has.values()}
    assert len(grouped) == len(holders) < x.npartitions
    for task in grouped.values():  # each stage task's chunks are held by one worker
        held = {min(who_has[d]) for d in task.dependencies}
        assert len(held) == 1
    assert sorted(d for t in grouped.values() for d in t.dependencies) == sorted(who_has)
    with pytest.raises(RedistError, match="runs on the cufftmp engine with CuPy chunks only"):
        gpu.build(x, op, None).compute()  # (the grouped stage tasks ran and reached the barrier)
