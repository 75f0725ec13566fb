"""The GPU path of dask_redist.fft without GPUs: its geometry, plan, scaling and graph.

`simulate` carries a distributed FFT run out in NumPy as every rank of the cufftmp engine
would (`dask_redist.engines.cufftmp.fft`): leg in by the plan's pieces into X slabs, the
unnormalized transform of the slabs (cuFFTMp's part: here NumPy's over the gathered slabs,
cut into Y slabs), the scale for ``norm``, leg out by the plan's pieces into the output
chunks. It checks the geometry and the arithmetic around cuFFTMp, not cuFFTMp.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.core.spec import CollectiveSpec
from dask_redist.errors import RedistError
from dask_redist.fft import gpu
from dask_redist.fft.plan import normalize
from dask_redist.config import Settings
from dask_redist.planning import RechunkSpec, make_plan
from dask_redist.planning.fft import slab_sizes

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
    out_chunks = tuple(_chunking(draw, n) for n in op.out_shape[:-1]) + ((op.out_shape[-1],),)
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
    plan = CollectiveSpec("t", "in", "out", rechunk, a.dtype, Settings(), "cupy", op=geometry).plan_run(
        in_ranks, nranks
    )
    assert (plan.in_ranks == in_ranks).all()
    leg_in, leg_out = geometry.legs(chunks, nranks)
    inputs = {f: a[tuple(slice(l, h) for l, h in zip(*rechunk.old_box(f)))] for f in range(in_ranks.size)}
    plan_in = make_plan(leg_in, in_ranks, nranks, out_ranks=geometry.slab_ranks(nranks, False))
    x_slabs = _move(plan_in, inputs, leg_in, a.dtype)
    assert [x.shape[geometry.first] for _, x in sorted(x_slabs.items())] == list(
        slab_sizes(a.shape[geometry.first], nranks)
    )
    axes = tuple(range(geometry.first, a.ndim))
    whole = np.concatenate([x_slabs[r] for r in range(nranks)], axis=geometry.first)
    out = UNNORMALIZED[(op.kind, op.inverse)](whole, op.s, axes) * geometry.scale
    y_bounds = np.cumsum((0,) + geometry.out_slabs(nranks)[geometry.first + 1])
    y_slabs = {
        r: np.take(out, range(y_bounds[r], y_bounds[r + 1]), axis=geometry.first + 1) for r in range(nranks)
    }
    plan_out = make_plan(leg_out, geometry.slab_ranks(nranks, True), nranks, out_ranks=plan.out_ranks)
    return _move(plan_out, y_slabs, leg_out, out.dtype)


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


def test_the_gpu_path_is_off_by_default_and_its_key_is_checked():
    import dask

    from dask_redist.config import ConfigError

    assert gpu.enabled() is False
    with (
        dask.config.set({"redist.fft.gpu": "yes"}),
        pytest.raises(ConfigError, match="redist.fft.gpu must be"),
    ):
        gpu.enabled()
    with dask.config.set({"redist.fft.gpu": True}):
        x = da.ones((16, 16), chunks=4, dtype=complex)
        assert gpu.problem(x, normalize(x.shape, "c2c", False)).startswith("NumPy chunks")


def test_an_fft_run_on_numpy_chunks_is_refused_by_the_scheduler(client):
    """The graph of the GPU path, built on NumPy chunks (which the API never does), carries the
    transform in its barrier, reaches the scheduler, and is refused there with a clear error."""
    from dask_redist.core.spec import BarrierTask

    x = da.from_array(np.ones((8, 8, 6), dtype=complex), chunks=(2, 8, 6))
    y = gpu.build(x, normalize(x.shape, "c2c", False), None)
    assert y.chunks == ((8,), slab_sizes(8, len(client.scheduler_info()["workers"])), (6,))
    (barrier,) = [t for t in y.dask.layers[y.name].mapping.values() if isinstance(t, BarrierTask)]
    assert barrier.spec.op is not None and barrier.spec.op.kind == "c2c"
    with pytest.raises(RedistError, match="runs on the cufftmp engine with CuPy chunks only"):
        y.compute()
