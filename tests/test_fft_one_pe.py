"""One PE's FFT from its input chunks (`dask_redist.engines.cufftmp.one_pe`), on CPU: the chunks'
transforms and the first axis's, as cuFFT's plans run them (unnormalized, out of place or in
place), replayed with NumPy, against ``numpy.fft`` of the whole array for every ``norm``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.engines.cufftmp.one_pe import chunks_in_order, from_chunks
from dask_redist.planning.fft import DistributedFFT

FORWARD, INVERSE = -1, 1  # (cuFFT's CUFFT_FORWARD and CUFFT_INVERSE)


class NumpyPlan:
    """A cuFFT plan over ``axes`` as NumPy computes it: unnormalized both ways."""

    def __init__(self, a, axes):
        self.shape, self.axes = a.shape, axes

    def fft(self, a, out, direction):
        assert a.shape == self.shape and out.shape == self.shape
        if direction == FORWARD:
            out[...] = np.fft.fftn(a, axes=self.axes)
        else:
            out[...] = np.fft.ifftn(a, axes=self.axes, norm="forward")


class Gpu(np.ndarray):
    """A NumPy array standing in for a CuPy one (`one_pe.chunks_in_order` takes GPU chunks only)."""

    @property
    def __cuda_array_interface__(self):
        return {}


def _direction(inverse: bool) -> int:
    return INVERSE if inverse else FORWARD


def _dfft(shape, inverse=False, norm=None, kind="c2c", dtype=np.complex128):
    return DistributedFFT(kind, inverse, norm, shape, shape, len(shape), (), np.dtype(dtype), np.dtype(dtype))


def _split(rng, n: int) -> tuple[int, ...]:
    cuts = np.sort(rng.choice(np.arange(1, n), min(n - 1, int(rng.integers(0, 6))), replace=False))
    return tuple(int(c) for c in np.diff([0, *cuts, n]))


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=2, max_size=3).map(tuple),
    inverse=st.booleans(),
    norm=st.sampled_from([None, "backward", "ortho", "forward"]),
    seed=st.integers(0, 2**16),
)
def test_from_chunks_equals_numpys_transform_of_the_whole_array(shape, inverse, norm, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    rows = _split(rng, shape[0]) if shape[0] > 1 else (1,)
    old = (rows, *((n,) for n in shape[1:]))
    dfft = _dfft(shape, inverse, norm)
    assert dfft.from_chunks_problem(old) is None
    bounds = np.cumsum([0, *rows])
    inputs = {
        i: np.ascontiguousarray(a[lo:hi]).view(Gpu) for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))
    }
    chunks = chunks_in_order(dfft, old, inputs)
    assert chunks is not None
    made = []

    def plan(x, axes):
        made.append(axes)
        return NumpyPlan(x, axes)

    out = from_chunks(chunks, np.empty(shape, complex), inverse, dfft.scale, plan, _direction)
    expected = (np.fft.ifftn if inverse else np.fft.fftn)(a, norm=norm)
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max())
    assert made == [(1, 2)[: len(shape) - 1]] * len(rows) + [(0,)]  # (each chunk, then the first axis)


@pytest.mark.parametrize(
    "kind, shape, old, why",
    [
        ("r2c", (8, 6), ((4, 4), (6,)), "only a C2C"),
        ("c2c", (8, 6), ((4, 4), (3, 3)), "split an axis after the first"),
    ],
)
def test_other_transforms_and_chunks_take_the_leg_in(kind, shape, old, why):
    dfft = _dfft(shape, kind=kind)
    assert why in dfft.from_chunks_problem(old)
    assert chunks_in_order(dfft, old, {}) is None


def test_a_batched_transform_takes_the_leg_in():
    dfft = DistributedFFT(
        "c2c", False, None, (3, 8, 6), (3, 8, 6), 2, (), np.dtype(complex), np.dtype(complex)
    )
    assert dfft.from_chunks_problem(((1, 1, 1), (8,), (6,))) is not None


def test_chunks_missing_strided_of_another_dtype_or_in_host_memory_take_the_leg_in():
    dfft = _dfft((4, 6))
    old = ((2, 2), (6,))
    a = np.zeros((4, 6), complex).view(Gpu)
    assert chunks_in_order(dfft, old, {0: a[:2], 1: a[2:]}) is not None
    assert chunks_in_order(dfft, old, {0: a[:2]}) is None  # (an aborted run's inputs are gone)
    assert chunks_in_order(dfft, old, {0: a[:2], 1: np.zeros((6, 2), complex).view(Gpu).T}) is None
    assert chunks_in_order(dfft, old, {0: a[:2], 1: a[2:].astype(np.complex64)}) is None
    assert chunks_in_order(dfft, old, {0: a[:2], 1: np.zeros((2, 6), complex)}) is None


def test_a_transform_whose_workspace_does_not_fit_the_heap_names_what_to_change():
    """A new FFT's first transform allocates cuFFTMp's workspace on the symmetric heap: where it
    does not fit, the error says so, with the setting, not only NVSHMEM's NULL."""
    from dask_redist.engines.cufftmp.fft import workspace_error

    error = workspace_error(_dfft((645, 645, 645)), 2, 2, MemoryError("nvshmem_malloc returned NULL"))
    said = str(error)
    assert isinstance(error, MemoryError) and "(645, 645, 645) complex128 over 2 GPUs" in said, said
    assert "nvshmem_malloc returned NULL" in said and "the 2 FFT(s) kept" in said, said
    assert "redist.nvshmem.symmetric-size (NVSHMEM_SYMMETRIC_SIZE)" in said, said
