"""``dask_redist.fft`` as a drop-in for ``dask.array.fft`` (issue 41, item 4): its whole surface
against NumPy, NumPy 2's warning, and graphs that compute on any scheduler."""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import runs_since, scheduler_history
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_redist.fft as F
from dask_redist.fft import gpu
from dask_redist.fft.plan import normalize

NORMS = [None, "backward", "ortho", "forward"]


def test_every_function_of_dask_array_fft_is_here():
    import dask.array.fft as D

    theirs = {
        n
        for n in dir(D)
        if not n.startswith("_") and getattr(getattr(D, n), "__module__", "") == "dask.array.fft"
    }
    assert {"fft", "hfft", "fft_wrap", "fftshift"} <= theirs  # (the check finds them)
    assert theirs <= set(F.__all__), theirs - set(F.__all__)


@st.composite
def hermitian_cases(draw):
    shape = tuple(draw(st.integers(1, 9)) for _ in range(draw(st.integers(1, 3))))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    cuts = [draw(st.integers(1, n)) for n in shape]  # (a chunk size per axis: the transformed one too)
    n = draw(st.none() | st.integers(1, 12))
    complex_ = draw(st.booleans())
    single = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if complex_ else 0)
    return (
        a.astype(
            ("complex64" if single else "complex128") if complex_ else ("float32" if single else "float64")
        ),
        cuts,
        n,
        axis,
        draw(st.sampled_from(NORMS)),
    )


def _close(got, expected):
    single = expected.dtype in (np.complex64, np.float32)
    scale = float(np.abs(expected).max(initial=0.0)) or 1.0
    np.testing.assert_allclose(
        got, expected, rtol=1e-4 if single else 1e-10, atol=(1e-4 if single else 1e-10) * scale
    )


@settings(max_examples=60, deadline=None)
@given(case=hermitian_cases(), name=st.sampled_from(["hfft", "ihfft"]))
def test_hfft_and_ihfft_equal_numpy_on_chunked_axes(case, name):
    a, cuts, n, axis, norm = case
    if name == "ihfft":
        a = a.real.copy()  # (NumPy's ihfft takes real input)
    try:
        expected = getattr(np.fft, name)(a, n, axis, norm)
    except ValueError:
        with pytest.raises(ValueError):
            getattr(F, name)(da.from_array(a, chunks=cuts), n, axis, norm)
        return
    y = getattr(F, name)(da.from_array(a, chunks=cuts), n, axis, norm)
    assert y.shape == expected.shape and y.dtype == expected.dtype
    got = y.compute(scheduler="sync")
    assert got.dtype == expected.dtype
    _close(got, expected)


@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"])
def test_fft_wrap_rechunks_a_chunked_axis_and_takes_numpys_1d_functions(name):
    a = np.random.default_rng(0).standard_normal((10, 12))
    x = da.from_array(a, chunks=(5, 5))
    wrapped = F.fft_wrap(getattr(np.fft, name))
    assert wrapped.__name__ == name
    for kwargs in ({}, {"axis": 0}, {"axis": 1, "n": 7}, {"axis": None, "norm": "ortho"}):
        expected = getattr(np.fft, name)(a, **{k: v for k, v in kwargs.items() if v is not None})
        y = wrapped(x, **kwargs)
        assert y.dtype == expected.dtype
        _close(y.compute(scheduler="sync"), expected)


@pytest.mark.parametrize("name", ["fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn", "rfftn", "irfftn"])
def test_fft_wrap_of_an_nd_function(name):
    a = np.random.default_rng(1).standard_normal((6, 8, 4))
    x = da.from_array(a, chunks=(3, 3, 2))
    wrapped = F.fft_wrap(getattr(np.fft, name))
    for args in ((), (None, (0, 2)), ((5, 6), (2, 1))):
        _close(wrapped(x, *args).compute(scheduler="sync"), getattr(np.fft, name)(a, *args))
    with pytest.raises(ValueError, match="Given unknown `kind` ones"):
        F.fft_wrap(np.ones)


@pytest.mark.parametrize("name", ["fftn", "ifftn", "rfftn", "irfftn"])
def test_s_without_axes_warns_as_numpy_does(name):
    a = np.random.default_rng(2).standard_normal((6, 8))
    with pytest.warns(DeprecationWarning, match="`axes` should not be `None` if `s` is not `None`") as ours:
        y = getattr(F, name)(da.from_array(a, chunks=3), (5, 6))
    with pytest.warns(DeprecationWarning) as numpys:
        expected = getattr(np.fft, name)(a, (5, 6))
    assert [str(w.message) for w in ours] == [str(w.message) for w in numpys]
    assert ours[0].filename == __file__  # (pointing at the caller, as NumPy's does)
    _close(y.compute(scheduler="sync"), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(F, name.replace("n", "2") if name.endswith("n") else name)(da.from_array(a, chunks=3), (5, 6))
        getattr(F, name)(da.from_array(a, chunks=3), (5, 6), axes=(0, 1))


def test_the_helpers_are_dasks():
    import dask.array.fft as D

    assert (F.fftfreq, F.rfftfreq, F.fftshift, F.ifftshift) == (
        D.fftfreq,
        D.rfftfreq,
        D.fftshift,
        D.ifftshift,
    )
    np.testing.assert_allclose(F.fftfreq(7, 0.5, chunks=3).compute(), np.fft.fftfreq(7, 0.5))
    x = np.arange(24.0).reshape(4, 6)
    np.testing.assert_array_equal(
        F.fftshift(da.from_array(x, chunks=2), axes=1).compute(), np.fft.fftshift(x, axes=1)
    )


def test_a_graph_built_with_a_client_computes_on_the_local_scheduler(client):
    """Built while a distributed Client is the default (the collective rechunk in it), computed by
    ``scheduler="sync"`` (as dask's ``assert_eq`` does): Dask's rechunks run, not the collective."""
    a = np.random.default_rng(3).standard_normal((16, 12)) + 0j
    y = F.fftn(da.from_array(a, chunks=(4, 12)))
    assert any("collective rechunk" in str(e) for e in dask_redist_steps(y))
    before = scheduler_history(client)
    _close(y.compute(scheduler="sync"), np.fft.fftn(a))
    assert not runs_since(client, before)
    _close(y.compute(), np.fft.fftn(a))  # ... and the collective on the cluster
    assert len(runs_since(client, before)) == 1


def test_the_gpu_paths_graph_computes_on_the_local_scheduler(client):
    """The GPU path's graph (one collective step through cuFFTMp, built here without GPUs: it is
    only built) holds the local path too, which a local scheduler runs."""
    a = np.random.default_rng(4).standard_normal((8, 6, 4)) + 0j
    x = da.from_array(a, chunks=(2, 6, 4))
    op = normalize(x.shape, "c2c", False, None, (1, 2), None)
    y = gpu.build(x, op, None)
    assert len(_either_layers(y)) == 1
    with dask.config.set(scheduler="sync"):
        _close(y.compute(), np.fft.fftn(a, axes=(1, 2)))


def test_dask_form_is_built_only_where_a_local_scheduler_reads_it(client):
    """The collective's other form (Dask's rechunk) is built the first time it is read: a graph
    computed on the cluster never builds it; pickled (as sent to a scheduler) it travels as what
    builds it; a local scheduler then builds and runs it."""
    import pickle

    a = np.random.default_rng(5).standard_normal((16, 12)) + 0j
    y = F.fftn(da.from_array(a, chunks=(4, 12)))
    either = _either_layers(y)
    assert either
    _close(y.compute(), np.fft.fftn(a))
    assert not any(isinstance(layer._local, dict) for layer in either)
    again = pickle.loads(pickle.dumps(y))
    assert not any(isinstance(layer._local, dict) for layer in _either_layers(again))
    _close(again.compute(scheduler="sync"), np.fft.fftn(a))
    _close(y.compute(scheduler="sync"), np.fft.fftn(a))
    assert all(isinstance(layer._local, dict) for layer in either)


def _either_layers(y) -> list:
    """``y``'s layers that hold a collective and Dask's form of it (`graph.anywhere.CollectiveOrDask`)."""
    return [layer for layer in y.dask.layers.values() if type(layer).__name__ == "CollectiveOrDask"]


def dask_redist_steps(y) -> list[str]:
    from dask_redist.fft.local import ANNOTATION

    return [
        step
        for layer in y.dask.layers.values()
        for step in (layer.collection_annotations or {}).get(ANNOTATION, {}).get("steps", [])
    ]
