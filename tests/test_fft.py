"""dask_redist.fft: the path that runs everywhere (collective rechunks, local FFTs) against numpy.fft."""

from __future__ import annotations

import os

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import scheduler_history
from fft_helpers import NUMPY, OURS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_redist
import dask_redist.fft as F
from dask_redist.fft.plan import normalize, pass_chunks, passes, slab_sizes


def _chunking(draw, n: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 4)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


@st.composite
def transforms(draw, max_ndim: int = 4, max_len: int = 9):
    """(kind, inverse), the array, its chunks, s, axes, norm, chunks of the result (or None)."""
    kind = draw(st.sampled_from(sorted(NUMPY)))
    ndim = draw(st.integers(1, max_ndim))
    shape = tuple(draw(st.integers(1, max_len)) for _ in range(ndim))
    single = draw(st.booleans())
    dtype = (
        ("float32" if single else "float64")
        if kind[0] == "r2c"
        else ("complex64" if single else "complex128")
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        a = a + 1j * rng.standard_normal(shape)
    a = a.astype(dtype)
    chunks = tuple(_chunking(draw, n) for n in shape)
    axes = draw(
        st.permutations(range(ndim)).flatmap(lambda p: st.integers(1, ndim).map(lambda k: tuple(p[:k])))
    )
    axes = tuple(a - ndim if draw(st.booleans()) else a for a in axes)  # negative axes too
    s = draw(
        st.none()
        | st.lists(st.integers(1, max_len + 3) | st.just(-1), min_size=len(axes), max_size=len(axes))
    )
    norm = draw(st.sampled_from([None, "backward", "ortho", "forward"]))
    out_chunks = draw(st.booleans())
    return kind, a, chunks, s, axes, norm, out_chunks, draw


def check(kind, a, chunks, s, axes, norm, out_chunks, draw):
    """Our result equals NumPy's (or both refuse the arguments)."""
    try:
        expected = NUMPY[kind](a, s=s, axes=axes, norm=norm)
    except ValueError:
        with pytest.raises(ValueError):
            OURS[kind](da.from_array(a, chunks=chunks), s=s, axes=axes, norm=norm)
        return None
    wanted = tuple(_chunking(draw, n) for n in expected.shape) if out_chunks else None
    y = OURS[kind](da.from_array(a, chunks=chunks), s=s, axes=axes, norm=norm, chunks=wanted)
    assert y.shape == expected.shape and y.dtype == expected.dtype
    if wanted is not None:
        assert y.chunks == wanted
    got = y.compute()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    single = expected.dtype in (np.complex64, np.float32)
    scale = float(np.abs(expected).max(initial=0.0)) or 1.0
    np.testing.assert_allclose(
        got, expected, rtol=1e-4 if single else 1e-10, atol=(1e-4 if single else 1e-10) * scale
    )
    return y


@settings(max_examples=int(os.environ.get("REDIST_TEST_EXAMPLES", "200")), deadline=None)
@given(case=transforms())
def test_equals_numpy_without_a_cluster(case):
    """Every kind, norm, s (padding, cropping, -1), axes (any order, negative), uneven chunks,
    1-D to 4-D with batch axes, chunks of the result: Dask's rechunk on the local scheduler."""
    with dask.config.set(scheduler="sync"):
        check(*case)


@settings(
    max_examples=int(os.environ.get("REDIST_TEST_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=transforms(max_ndim=3, max_len=8))
def test_equals_numpy_on_a_cluster(client, case):
    """The same through the collective rechunk on a cluster of worker processes."""
    before = sum(h["outcome"] == "done" for h in scheduler_history(client))
    y = check(*case)
    if y is None:
        return
    record = _record(y)
    collective = sum("collective rechunk" in step for step in record["steps"])
    after = sum(h["outcome"] == "done" for h in scheduler_history(client))
    assert after - before == collective, (record, after - before)


def _record(y) -> dict:
    from dask_redist.fft.local import ANNOTATION

    found = [
        layer.collection_annotations[ANNOTATION]
        for layer in y.dask.layers.values()
        if ANNOTATION in (layer.collection_annotations or {})
    ]
    assert len(found) == 1
    return found[0]


def test_the_users_four_steps_are_built_with_one_rechunk(client):
    """Slabs along axis 0: axes 1 and 2 are local, one collective rechunk, then axis 0 (the
    pipeline of examples/fft_pipeline.py); the result is in slabs along axis 1."""
    a = np.random.default_rng(1).standard_normal((16, 12, 10)) + 0j
    x = da.from_array(a, chunks=(4, 12, 10))
    y = F.fftn(x)
    record = _record(y)
    assert [s.split(";")[0] for s in record["steps"]] == ["no rechunk needed", "collective rechunk"]
    assert y.chunks == ((16,), (3, 3, 3, 3), (10,))
    np.testing.assert_allclose(y.compute(), np.fft.fftn(a), rtol=1e-10, atol=1e-9)


def test_a_batch_axis_carries_the_split():
    """fft2 of a stack of images chunked along every axis: one rechunk, split along the stack."""
    x = da.zeros((32, 6, 8), chunks=(8, 3, 4), dtype=complex)
    steps, why = passes(normalize(x.shape, "c2c", False, axes=(1, 2)), x.numblocks)
    assert [(p.axes, p.split) for p in steps] == [((1, 2), 0)] and "batch axis 0" in why
    assert pass_chunks(x.chunks, steps[0], x.npartitions) == (slab_sizes(32, 16), (6,), (8,))


def test_irfftn_transforms_the_last_axis_last():
    """NumPy's irfftn: ifft over all axes but the last, then irfft over the last."""
    steps, _ = passes(normalize((8, 8, 5), "c2r", True), (2, 2, 1))
    assert [(p.function, p.axes, p.split) for p in steps] == [("ifftn", (0, 1), 2), ("irfftn", (2,), 0)]
    assert steps[1].s == (8,)


def test_rfftn_keeps_the_real_axis_in_the_first_pass():
    steps, _ = passes(normalize((8, 8, 8), "r2c", False), (1, 1, 4))
    assert steps[0].function == "rfftn" and 2 in steps[0].axes and steps[1].function == "fftn"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"norm": "unitary"}, "norm must be"),
        ({"axes": (0, 3)}, "axes: axis 3 is out of bounds"),
        ({"s": (4, 4), "axes": (0,)}, "s and axes have different lengths"),
        ({"s": (0,), "axes": (0,)}, "s: invalid number of data points"),
        ({"chunks": ((5,), (6,))}, "chunks: "),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    x = da.zeros((8, 6), chunks=4, dtype=complex)
    with pytest.raises(ValueError, match=match):
        F.fftn(x, **kwargs)


@pytest.mark.parametrize("name", ["fftn", "ifftn", "fft2", "ifft2", "rfftn", "irfftn", "rfft2", "irfft2"])
@pytest.mark.parametrize("kwargs", [{"axes": ()}, {"s": ()}, {"s": (), "axes": ()}])
@pytest.mark.parametrize("dtype", ["float32", "int64", "complex128"])
def test_no_axis_to_transform_is_what_numpy_does(name, kwargs, dtype):
    """``axes=()`` / ``s=()``: NumPy returns the input as it is (fftn, ifftn: same dtype, no
    complex) or raises (rfftn, irfftn: IndexError; fft2's two axes and ``s=()``: ValueError)."""
    import warnings

    a = np.arange(12).reshape(3, 4).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (s without axes, from both)
        try:
            expected = getattr(np.fft, name)(a, **kwargs)
        except Exception as e:
            with pytest.raises(type(e)):
                getattr(F, name)(da.from_array(a, chunks=2), **kwargs)
            return
        x = da.from_array(a, chunks=2)
        got = getattr(F, name)(x, **kwargs)
    assert got is x and got.dtype == expected.dtype
    np.testing.assert_array_equal(got.compute(scheduler="sync"), expected)


def test_no_axis_to_transform_keeps_chunks_asked_for_and_0d_arrays():
    x = da.from_array(np.arange(12.0).reshape(3, 4), chunks=2)
    assert F.fftn(x, axes=(), chunks=(3, 4)).chunks == ((3,), (4,))
    zero_d = np.array(2.0)
    np.testing.assert_array_equal(F.fftn(zero_d).compute(scheduler="sync"), np.fft.fftn(zero_d))
    with pytest.raises(IndexError):  # (as NumPy's, an AxisError)
        F.fft(zero_d)
    with pytest.raises(IndexError):
        F.rfftn(zero_d)


def test_unknown_chunk_sizes_are_refused():
    x = da.zeros((8, 6), chunks=4)
    x = x[x[:, 0] == 0]
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        F.fftn(x)


def test_numpy_input_is_taken():
    a = np.arange(12.0).reshape(3, 4)
    np.testing.assert_allclose(F.rfft2(a).compute(scheduler="sync"), np.fft.rfft2(a))


def test_explain_says_which_path_and_why(client):
    x = da.from_array(np.ones((16, 8)), chunks=(4, 4))
    y = F.rfftn(x) * 2
    text = str(dask_redist.explain(y))
    assert "rfftn over axes [0, 1]" in text
    assert "path that runs everywhere" in text and "NumPy chunks" in text


def test_explain_does_not_call_a_collective_rechunk_dasks(client):
    """dask_redist.rechunk's output keeps its rechunk layer name: explain() listed it as Dask's
    rechunk ("dask_redist is not enabled: dask's rechunk runs"), though the collective ran; so it
    did for every rechunk of an FFT."""
    x = da.from_array(np.ones((16, 12)), chunks=(4, 12))
    explanation = dask_redist.explain(dask_redist.rechunk(x, (16, 3)))
    assert [e.runs for e in explanation] == ["collective"] and "not enabled" not in str(explanation)
    e = dask_redist.explain(F.fftn(x))
    assert len(e) == 0 and e.ffts[0].steps[1].startswith("collective rechunk")


def test_under_enable_the_hook_rewrites_the_rechunks(client):
    """Under enable() the passes use plain rechunks, which the hook makes collective at submission."""
    a = np.random.default_rng(2).standard_normal((12, 10, 8))
    x = da.from_array(a, chunks=(3, 5, 8))
    with dask_redist.enable(engine="dask"):
        y = F.rfftn(x)
        steps = _record(y)["steps"]
        assert len(steps) == 2 and all(s.startswith("rechunk under enable()") for s in steps)
        assert [e.runs for e in dask_redist.explain(y)] == ["collective", "collective"]
        before = sum(h["outcome"] == "done" for h in scheduler_history(client))
        np.testing.assert_allclose(y.compute(), np.fft.rfftn(a), rtol=1e-10, atol=1e-9)
        assert sum(h["outcome"] == "done" for h in scheduler_history(client)) == before + 2


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("fftn", {"axes": (0, 0)}),
        ("fftn", {"axes": (0, 0), "s": (3, 5)}),
        ("ifftn", {"axes": (1, 0, 1), "norm": "ortho"}),
        ("rfftn", {"axes": (1, 1)}),
        ("rfftn", {"axes": (2, 0, 2), "s": (7, 4, 6)}),
        ("irfftn", {"axes": (1, 1)}),
        ("irfftn", {"axes": (2, 0, 2), "norm": "forward"}),
        ("fft2", {"axes": (0, 0)}),
        ("irfft2", {"axes": (-1, -1), "s": (4, 9)}),
    ],
)
def test_a_repeated_axis_is_transformed_again_as_numpy_does(name, kwargs):
    rng = np.random.default_rng(0)
    a = rng.random((8, 6, 5)) + (0 if name.startswith("rfft") else 1j * rng.random((8, 6, 5)))
    expected = getattr(np.fft, name)(a, **kwargs)
    got = getattr(F, name)(da.from_array(a, chunks=(4, 3, 5)), **kwargs).compute(scheduler="sync")
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
