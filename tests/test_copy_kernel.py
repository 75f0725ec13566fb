"""The GPU's copy kernel (`dask_redist.engines.copies`), its source run on the CPU.

`box_copy`'s CUDA source is compiled as C++ with the few CUDA names it uses stood in for, and
run block by block and thread by thread (its threads never wait for each other, so running
them one after another computes what the GPU computes). Each job table must copy exactly
what its rows say, whatever the rows' lengths (rows under 4 KiB several to a block, longer ones
one a block, in 64 KiB segments), alignment (16, 8, 4 or 1 byte at a time) and the grid (smaller than the
work: every loop strides). Skipped where no C++ compiler is found.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_copies import copy_rows

from dask_redist.engines.copies import _SEGMENT, _SOURCE, units_of

_SHIMS = """
#include <algorithm>
struct Dim { unsigned int x, y, z; };
static Dim blockIdx, threadIdx, gridDim, blockDim;
struct uint4 { unsigned int x, y, z, w; };
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
using std::min;
"""

_RUN = """
extern "C" void run(const long long* jobs, int njobs, unsigned gx, unsigned gy, unsigned bx) {
    gridDim = {gx, gy, 1};
    blockDim = {bx, 1, 1};
    for (unsigned y = 0; y < gy; ++y)
        for (unsigned x = 0; x < gx; ++x)
            for (unsigned t = 0; t < bx; ++t) {
                blockIdx = {x, y, 0};
                threadIdx = {t, 0, 0};
                box_copy(jobs, njobs);
            }
}
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to run the kernel's source on the CPU")
    folder = tmp_path_factory.mktemp("kernel")
    source, library = folder / "box_copy.cpp", folder / "box_copy.so"
    source.write_text(_SHIMS + _SOURCE + _RUN)
    subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-O1",
            "-fno-strict-aliasing",
            "-shared",
            "-fPIC",
            str(source),
            "-o",
            str(library),
        ],
        check=True,
        capture_output=True,
    )
    lib = ctypes.CDLL(str(library))
    lib.run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint]

    def launch(jobs: np.ndarray, gx: int | None = None, gy: int | None = None, threads: int = 256) -> None:
        jobs = np.ascontiguousarray(jobs, dtype=np.int64)
        gx = gx or max(1, min(int(units_of(jobs).max()), 4096))  # what `copies.launch` gives
        gy = gy or min(len(jobs), 65535)
        lib.run(jobs.ctypes.data, len(jobs), gx, gy, threads)

    return launch


@st.composite
def tables(draw):
    """1-3 jobs, each from its own place in a source buffer to its own region of a destination
    buffer: rows of short (under 64 KiB) or long byte runs over two outer axes, any alignment,
    destination rows apart (source rows may overlap: reading twice is allowed)."""
    jobs = []
    src_size = dst_size = 0
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            nb = draw(st.integers(1, 300)) * draw(st.sampled_from([1, 2, 4, 8, 16]))
        else:
            nb = draw(st.sampled_from([4095, 4096, 5000, _SEGMENT - 16, _SEGMENT, _SEGMENT + 8, 150_000]))
        long_rows = nb >= 4095
        n0, n1 = draw(st.integers(1, 2 if long_rows else 5)), draw(st.integers(1, 2 if long_rows else 40))
        s1 = nb * draw(st.sampled_from([0, 1, 2])) + draw(st.integers(0, 16))
        s0 = n1 * max(s1, 1) + draw(st.integers(0, 64))
        d1 = nb + draw(st.sampled_from([0, 0, 16, 3]))
        d0 = n1 * d1 + draw(st.sampled_from([0, 0, 32, 5]))
        src_at, dst_at = src_size + draw(st.integers(0, 16)), dst_size + draw(st.integers(0, 16))
        jobs.append([src_at, dst_at, n0, n1, nb, s0, s1, d0, d1])
        src_size = src_at + (n0 - 1) * s0 + (n1 - 1) * s1 + nb + 16
        dst_size = dst_at + (n0 - 1) * d0 + (n1 - 1) * d1 + nb + 16
    grid = draw(st.sampled_from(["launch", "small"]))
    return np.array(jobs, np.int64), src_size, dst_size, grid


def expected(jobs, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """What the jobs' rows say (`test_copies.copy_rows`, the reference the job tables are checked by)."""
    out = dst.copy()
    for s_at, d_at, *rows in jobs.tolist():
        copy_rows(*rows, src, s_at, out, d_at)
    return out


@settings(max_examples=120, deadline=None)
@given(tables(), st.integers(0, 2**32 - 1))
def test_the_kernel_copies_every_row_of_every_job_and_nothing_else(kernel, table, seed):
    jobs, src_size, dst_size, grid = table
    rng = np.random.default_rng(seed)
    # 16-byte aligned buffers, so the jobs' own offsets decide the alignment the kernel sees
    src_raw = np.empty(src_size + 32, np.uint8)
    src = src_raw[(-src_raw.ctypes.data) % 16 :][:src_size]
    src[:] = rng.integers(0, 256, src_size, dtype=np.uint8)
    dst_raw = np.empty(dst_size + 32, np.uint8)
    dst = dst_raw[(-dst_raw.ctypes.data) % 16 :][:dst_size]
    dst[:] = rng.integers(0, 256, dst_size, dtype=np.uint8)
    want = expected(jobs, src, dst)
    absolute = jobs.copy()
    absolute[:, 0] += src.ctypes.data
    absolute[:, 1] += dst.ctypes.data
    if grid == "small":  # fewer blocks and threads than units and bytes: every loop strides
        kernel(absolute, gx=2, gy=1, threads=32)
    else:
        kernel(absolute)
    np.testing.assert_array_equal(dst, want)


def test_short_rows_share_a_block_and_long_rows_are_cut_in_segments():
    """The units `copies.launch` sizes its grid by (one block each at a time)."""
    jobs = np.array(
        [
            [0, 0, 4096, 1, 64, 0, 0, 0, 0],  # 4096 rows of 64 bytes: 1,024 to a block
            [0, 0, 1, 4096, 512, 0, 0, 0, 0],  # 4096 rows of 512 bytes: 128 to a block
            [0, 0, 1, 100, 4095, 0, 0, 0, 0],  # 100 rows of 4095 bytes: 16 to a block
            [0, 0, 5, 1, 4096, 0, 0, 0, 0],  # rows of 4 KiB fill a block: one each
            [0, 0, 1, 3, _SEGMENT, 0, 0, 0, 0],  # rows of exactly 64 KiB: one each
            [0, 0, 2, 1, 150_000, 0, 0, 0, 0],  # 150,000 bytes: 3 segments a row
        ],
        np.int64,
    )
    assert units_of(jobs).tolist() == [4, 32, 7, 5, 3, 6]
