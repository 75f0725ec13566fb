"""The one-PE FFT's leg in, on one GPU: is a copy of the slabs into one buffer and then the 3-D
transform (what the engine does: `dask_redist.engines.cufftmp.fft.local_transform`) slower than
transforming each slab over its last axes straight into the buffer and then the first axis in
place (no copy)? Issue 40's 3-D FFT: the leg in took 6-7 ms of 48 at 8 GiB.

    python benchmarks/fft_one_pe_leg_in.py [SLABS] [REPS]

An input of (1024, 1024, 512) complex128 (8 GiB) in SLABS slabs along axis 0 (default 16); each
way timed REPS times (default 10) with CUDA events, medians, and checked against the first way.
"""

from __future__ import annotations

import statistics
import sys

import cupy
from cupy.cuda import cufft
from cupy.fft._fft import _get_cufft_plan_nd

SHAPE = (1024, 1024, 512)


def copy_then_fftn(slabs, buffer):
    """As the engine does: the leg in copies the slabs into one array, then cuFFT out of place."""
    lo = 0
    for s in slabs:
        buffer[lo : lo + len(s)] = s
        lo += len(s)
    return cupy.fft.fftn(buffer)


def slabs_into_buffer(slabs, buffer, plans):
    """Each slab over axes (1, 2) into its part of the buffer (out of place), then axis 0 in place."""
    slab_plan, first_plan = plans
    lo = 0
    for s in slabs:
        slab_plan.fft(s, buffer[lo : lo + len(s)], cufft.CUFFT_FORWARD)
        lo += len(s)
    first_plan.fft(buffer, buffer, cufft.CUFFT_FORWARD)
    return buffer


def plan(a, axes):
    """CuPy's own N-D planner (``cupy.fft.fftn``'s), also for the first axis alone, strided
    (``cupyx.scipy.fftpack.get_fft_plan`` makes a ``Plan1d`` there, which transforms the last)."""
    return _get_cufft_plan_nd(a.shape, cufft.CUFFT_Z2Z, axes=axes, order="C", to_cache=False)


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps + 1):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, end))
    return out[1:]


def main() -> None:
    nslabs = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rows = SHAPE[0] // nslabs
    rng = cupy.random.default_rng(0)
    slabs = [
        rng.standard_normal((rows, *SHAPE[1:])) + 1j * rng.standard_normal((rows, *SHAPE[1:]))
        for _ in range(nslabs)
    ]
    buffer = cupy.empty(SHAPE, complex)
    expected = copy_then_fftn(slabs, buffer)
    plans = (plan(slabs[0], (1, 2)), plan(buffer, (0,)))
    got = slabs_into_buffer(slabs, cupy.empty(SHAPE, complex), plans)
    error = float(cupy.abs(got - expected).max() / cupy.abs(expected).max())
    del got, expected
    a = timed(lambda: copy_then_fftn(slabs, buffer), reps)
    into = cupy.empty(SHAPE, complex)
    b = timed(lambda: slabs_into_buffer(slabs, into, plans), reps)
    print(f"{SHAPE} complex128 in {nslabs} slabs, medians of {reps}, relative error {error:.1e}")
    print("| way | median ms | min .. max |\n|---|---|---|")
    for name, t in (("copy, then fftn out of place", a), ("slabs into the buffer, then axis 0 in place", b)):
        print(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f} .. {max(t):.2f} |")


if __name__ == "__main__":
    main()
