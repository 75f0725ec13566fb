"""The folding of box copies into (rows x contiguous bytes) jobs for the GPU's batched copy.

Checked on NumPy views, whose strides mean what CuPy's do: a job replayed byte by byte,
as the kernel (dask_redist.engines.cufftmp.copies) does, must copy exactly what
``dst[...] = src`` copies, and touch nothing else.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.engines.cufftmp.copies import fold


def in_buffer(shape, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A C-ordered array and the bytes under it."""
    buffer = np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return buffer, buffer.view(dtype).reshape(shape)


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def replay(job, dst_buffer, dst, src_buffer, src) -> None:
    """The kernel's work for one job, on the bytes."""
    n0, n1, nbytes, s0, s1, d0, d1 = job
    so, do = address(src) - address(src_buffer), address(dst) - address(dst_buffer)
    for i0 in range(n0):
        for i1 in range(n1):
            s, d = so + i0 * s0 + i1 * s1, do + i0 * d0 + i1 * d1
            dst_buffer[d : d + nbytes] = src_buffer[s : s + nbytes]


@st.composite
def boxes(draw):
    """Array shapes for source and destination, one box of each of the same shape, a dtype."""
    ndim = draw(st.integers(1, 4))
    box = [draw(st.integers(1, 5)) for _ in range(ndim)]
    src_shape = [b + draw(st.integers(0, 3)) for b in box]
    dst_shape = [b + draw(st.integers(0, 3)) for b in box]
    at_src = [draw(st.integers(0, n - b)) for n, b in zip(src_shape, box)]
    at_dst = [draw(st.integers(0, n - b)) for n, b in zip(dst_shape, box)]
    dtype = draw(st.sampled_from([np.int8, np.float16, np.float32, np.float64, np.complex128]))
    return box, src_shape, at_src, dst_shape, at_dst, dtype


@settings(max_examples=300, deadline=None)
@given(boxes())
def test_a_folded_copy_copies_what_numpy_copies(case):
    box, src_shape, at_src, dst_shape, at_dst, dtype = case
    src_buffer, src_all = in_buffer(src_shape, dtype)
    src_all[...] = (np.arange(src_all.size) % 127 + 1).reshape(src_shape)
    dst_buffer, dst_all = in_buffer(dst_shape, dtype)
    src = src_all[tuple(slice(a, a + b) for a, b in zip(at_src, box))]
    dst_slices = tuple(slice(a, a + b) for a, b in zip(at_dst, box))
    expected = dst_all.copy()
    expected[dst_slices] = src
    job = fold(dst_all[dst_slices].shape, dst_all[dst_slices].strides, src.strides, src.itemsize)
    if job is None:  # more than two outer axes that cannot merge: the engine falls back to CuPy
        assert sum(1 for b in box if b > 1) >= 3
        return
    replay(job, dst_buffer, dst_all[dst_slices], src_buffer, src)
    np.testing.assert_array_equal(dst_all, expected)


def test_contiguous_and_slab_copies_are_single_rows():
    """The common cases fold to few, long rows: a whole chunk is one row of bytes."""
    a = np.zeros((4, 64, 32))
    assert fold(a.shape, a.strides, a.strides, a.itemsize) == (1, 1, a.nbytes, 0, 0, 0, 0)
    part = a[:, 8:16, :]  # a slab of a slab: 4 rows of 8 x 32 elements
    assert fold(part.shape, part.strides, part.strides, 8)[:3] == (1, 4, 8 * 32 * 8)
