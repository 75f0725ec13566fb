"""A distributed FFT on a world of one PE: cuFFT on one GPU, no symmetric heap, no cuFFTMp.

Two ways, both out of place and with NumPy's ``norm`` (`transform`):

* **from the input chunks**, where they split only the first axis of a C2C transform of every
  axis (`DistributedFFT.from_chunks_problem`; `chunks_in_order`): cuFFT transforms each chunk
  over the axes after the first straight into its rows of the result, then the result over the
  first axis in place. No leg in: one pass over the array less than the other way. The plans
  are CuPy's, kept in its plan cache (the one ``cupy.fft.fftn`` uses).
* **from the whole array**, which the leg in gathers (`dask_redist.engines.cufftmp.fft`): CuPy's
  ``fftn`` and kin on it.
"""

from __future__ import annotations

from dask_redist.engines.cufftmp import queued
from dask_redist.errors import RedistError


def chunks_in_order(dfft, old, inputs: dict) -> list | None:
    """The input chunks along the first axis, where the transform can start from them (every
    one here, on the GPU, C-contiguous, of the transform's dtype); else None (the leg in gathers
    them, from wherever they are)."""
    if dfft.from_chunks_problem(old) is not None:
        return None
    chunks = [inputs.get(i) for i in range(len(old[0]))]
    if any(c is None or not _usable(c, dfft.in_dtype) for c in chunks):
        return None
    return chunks


def _usable(chunk, dtype) -> bool:
    on_gpu = type(chunk).__module__.startswith("cupy") or hasattr(chunk, "__cuda_array_interface__")
    return on_gpu and chunk.flags.c_contiguous and chunk.dtype == dtype


def transform(run, data, error=None):
    """The transform of ``data``: the whole array (gathered by the leg in) or its chunks in order
    (`chunks_in_order`), queued behind their kernels and not waited for (`.queued`)."""
    dfft = run.spec.collective.fft
    run.set_phase("fft")
    if error is not None:
        raise error
    if run.state == "failed":
        raise run.failure()
    if data is None:
        raise RedistError(f"{run.name()}: no input slab")
    with queued.stream():
        return _from_chunks(dfft, data) if isinstance(data, list) else _whole(dfft, data)


def _whole(dfft, slab):
    import cupy

    axes = tuple(range(dfft.first, len(dfft.in_shape)))
    s = dfft.out_shape[dfft.first :] if dfft.kind == "c2r" else None  # (C2R: the last axis, even or odd)
    return getattr(cupy.fft, dfft.function)(slab, s=s, axes=axes, norm=dfft.norm).astype(
        dfft.out_dtype, copy=False
    )


def _from_chunks(dfft, chunks: list):
    import cupy

    out = cupy.empty(dfft.out_shape, dfft.out_dtype)
    return from_chunks(chunks, out, dfft.inverse, dfft.scale, _cupy_plan, _direction)


def _direction(inverse: bool) -> int:
    from cupy.cuda import cufft

    return cufft.CUFFT_INVERSE if inverse else cufft.CUFFT_FORWARD


def from_chunks(chunks: list, out, inverse: bool, scale: float, plan, direction):
    """``out`` (the whole array, C-contiguous) as the transform of the concatenation of
    ``chunks`` (C-contiguous, in order along the first axis): each chunk over the axes after
    the first into its rows of ``out``, then ``out`` over the first axis in place, then scaled.
    ``plan(array, axes)`` gives a plan whose ``fft(a, out, direction(inverse))`` runs the
    unnormalized transform (cuFFT's)."""
    way = direction(inverse)
    lo = 0
    for c in chunks:
        if len(c):
            plan(c, tuple(range(1, c.ndim))).fft(c, out[lo : lo + len(c)], way)
        lo += len(c)
    plan(out, (0,)).fft(out, out, way)
    if scale != 1:
        out *= scale
    return out


def _cupy_plan(a, axes):
    """CuPy's own N-D planner and plan cache (what ``cupy.fft.fftn`` uses): also for one axis, the
    first, strided (``cupyx.scipy.fftpack.get_fft_plan`` makes a ``Plan1d`` there, which
    transforms the last)."""
    from cupy.cuda import cufft
    from cupy.fft._fft import _get_cufft_plan_nd

    fft_type = cufft.CUFFT_Z2Z if a.dtype.itemsize == 16 else cufft.CUFFT_C2C
    return _get_cufft_plan_nd(a.shape, fft_type, axes=axes, order="C")
