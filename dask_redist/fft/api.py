"""``fftn``, ``ifftn``, ``rfftn``, ``irfftn`` and their 1-D and 2-D forms, on dask arrays.

NumPy's signatures (``s``, ``axes``, ``norm``; ``n``, ``axis`` for 1-D) and NumPy's results,
plus ``chunks=``: the chunks of the result (default: what the transform leaves, slabs along
one axis). Chunked axes are handled: the arrays are rechunked for the transform (as one
collective step each where that can run), which ``dask.array.fft`` refuses to do.
``dask_redist.explain(y)`` says which path ran and why.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from dask_redist.fft import gpu, local
from dask_redist.fft.plan import FFTOp, normalize, repeated_axes

#: What NumPy 2 says (a DeprecationWarning) when an N-D transform gets ``s`` but no ``axes``
S_WITHOUT_AXES = (
    "`axes` should not be `None` if `s` is not `None` (Deprecated in NumPy 2.0). In a future version "
    "of NumPy, this will raise an error and `s[i]` will correspond to the size along the transformed "
    "axis specified by `axes[i]`. To retain current behaviour, pass a sequence [0, ..., k-1] to `axes` "
    "for an array of dimension k."
)


def _warn_like_numpy(s, axes) -> None:
    """NumPy 2's warning for ``s`` given without ``axes`` (to the caller of ``fftn``, ...)."""
    if s is not None and axes is None and np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        warnings.warn(S_WITHOUT_AXES, DeprecationWarning, stacklevel=3)


def as_dask(a):
    import dask.array as da

    x = a if isinstance(a, da.Array) else da.asarray(a)
    if any(isinstance(c, float) and math.isnan(c) for axis in x.chunks for c in axis):
        raise ValueError("the array's chunk sizes are unknown (NaN): call compute_chunk_sizes() first")
    return x


def _out_chunks(op: FFTOp, chunks, dtype):
    if chunks is None:
        return None
    from dask.array.core import normalize_chunks

    try:
        return normalize_chunks(chunks, shape=op.out_shape, dtype=dtype)
    except (ValueError, TypeError) as e:
        raise ValueError(f"chunks: {e} (the result's shape is {op.out_shape})") from e


def transform(a, kind: str, inverse: bool, s=None, axes=None, norm=None, chunks=None):
    """``a`` transformed as NumPy's function for (``kind``, ``inverse``) would; see the module."""
    x = as_dask(a)
    if steps := repeated_axes(x.shape, kind, s, axes):  # (an axis repeated: transformed again, as NumPy)
        for i, (step_kind, step_s, step_axes) in enumerate(steps):
            last = i == len(steps) - 1
            x = transform(x, step_kind, inverse, step_s, step_axes, norm, chunks if last else None)
        return x
    op = normalize(x.shape, kind, inverse, s, axes, norm)
    if not op.axes:  # (NumPy returns its input as it is, dtype and all)
        return x if chunks is None else x.rechunk(_out_chunks(op, chunks, x.dtype))
    out_chunks = _out_chunks(op, chunks, local.result_dtype(op.function, x.dtype))
    problem, placement = gpu.where(x, op)
    if problem is None:
        return gpu.build(x, op, out_chunks, placement)
    y, _ = local.build(x, op, out_chunks, problem)
    return y


_KINDS = {"fftn": ("c2c", False), "ifftn": ("c2c", True), "rfftn": ("r2c", False), "irfftn": ("c2r", True)}


def fftn(a, s=None, axes=None, norm=None, *, chunks=None):
    """The N-D discrete Fourier transform (as ``numpy.fft.fftn``) of a dask array.

    Parameters
    ----------
    a : array_like or dask.array.Array
        The input, real or complex, chunked along any axes (other arrays are one chunk).
    s : sequence of int, optional
        The length of the output along each transformed axis: the input is cropped or
        zero-padded to it, as NumPy does.
    axes : sequence of int, optional
        The axes to transform; None: the last ``len(s)`` axes, or every axis.
    norm : {"backward", "ortho", "forward"}, optional
        The normalization of the forward transform, as NumPy's; None: "backward" (none).
    chunks : tuple, optional
        The chunks of the result; None: what the transform leaves (slabs along one axis).

    Returns
    -------
    dask.array.Array
        The complex transform: one collective step on GPU clusters, else collective rechunks
        and ``numpy.fft`` (or ``cupy.fft``) per chunk; ``dask_redist.explain`` says which.
    """
    _warn_like_numpy(s, axes)
    return transform(a, *_KINDS["fftn"], s, axes, norm, chunks)


def ifftn(a, s=None, axes=None, norm=None, *, chunks=None):
    """The N-D inverse discrete Fourier transform (as ``numpy.fft.ifftn``) of a dask array.

    Parameters
    ----------
    a : array_like or dask.array.Array
        The spectrum, complex, chunked along any axes.
    s : sequence of int, optional
        The length of the output along each transformed axis (cropped or padded), as in `fftn`.
    axes : sequence of int, optional
        The axes to transform back; None: the last ``len(s)`` axes, or every axis.
    norm : {"backward", "ortho", "forward"}, optional
        As in `fftn`: "backward" (the default) scales this inverse by ``1/n``.
    chunks : tuple, optional
        The chunks of the result, as in `fftn`.

    Returns
    -------
    dask.array.Array
        The complex inverse transform, by the same paths as `fftn`.
    """
    _warn_like_numpy(s, axes)
    return transform(a, *_KINDS["ifftn"], s, axes, norm, chunks)


def rfftn(a, s=None, axes=None, norm=None, *, chunks=None):
    """The N-D transform of real input (as ``numpy.fft.rfftn``) of a dask array.

    Parameters
    ----------
    a : array_like or dask.array.Array
        The input, real (its imaginary part would be dropped), chunked along any axes.
    s : sequence of int, optional
        The length of the input used along each transformed axis (cropped or padded).
    axes : sequence of int, optional
        The axes to transform; the last of them is halved (``n // 2 + 1``).
    norm : {"backward", "ortho", "forward"}, optional
        The normalization, as in `fftn`.
    chunks : tuple, optional
        The chunks of the half spectrum; None: what the transform leaves.

    Returns
    -------
    dask.array.Array
        The complex half spectrum, by the same paths as `fftn`.
    """
    _warn_like_numpy(s, axes)
    return transform(a, *_KINDS["rfftn"], s, axes, norm, chunks)


def irfftn(a, s=None, axes=None, norm=None, *, chunks=None):
    """The inverse of ``rfftn`` (as ``numpy.fft.irfftn``) of a dask array.

    Parameters
    ----------
    a : array_like or dask.array.Array
        A half spectrum (complex, its last transformed axis ``n // 2 + 1`` long).
    s : sequence of int, optional
        The shape of the real output along the transformed axes; None: ``2 * (m - 1)`` along
        the last of them, where ``m`` is the half spectrum's length there.
    axes : sequence of int, optional
        The axes to transform back, the halved one last.
    norm : {"backward", "ortho", "forward"}, optional
        As in `ifftn`.
    chunks : tuple, optional
        The chunks of the real result.

    Returns
    -------
    dask.array.Array
        The real inverse transform, by the same paths as `fftn`.
    """
    _warn_like_numpy(s, axes)
    return transform(a, *_KINDS["irfftn"], s, axes, norm, chunks)


def fft2(a, s=None, axes=(-2, -1), norm=None, *, chunks=None):
    """``fftn`` over two axes (as ``numpy.fft.fft2``)."""
    return fftn(a, s, axes, norm, chunks=chunks)


def ifft2(a, s=None, axes=(-2, -1), norm=None, *, chunks=None):
    """``ifftn`` over two axes (as ``numpy.fft.ifft2``)."""
    return ifftn(a, s, axes, norm, chunks=chunks)


def rfft2(a, s=None, axes=(-2, -1), norm=None, *, chunks=None):
    """``rfftn`` over two axes (as ``numpy.fft.rfft2``)."""
    return rfftn(a, s, axes, norm, chunks=chunks)


def irfft2(a, s=None, axes=(-2, -1), norm=None, *, chunks=None):
    """``irfftn`` over two axes (as ``numpy.fft.irfft2``)."""
    return irfftn(a, s, axes, norm, chunks=chunks)


def _n(n):
    return None if n is None else (n,)


def _axis(axis):
    return (-1 if axis is None else axis,)  # (None: the last, as dask.array.fft takes it)


def fft(a, n=None, axis=-1, norm=None, *, chunks=None):
    """The 1-D transform (as ``numpy.fft.fft``); ``axis`` may be chunked."""
    return transform(a, *_KINDS["fftn"], _n(n), _axis(axis), norm, chunks)


def ifft(a, n=None, axis=-1, norm=None, *, chunks=None):
    """The 1-D inverse transform (as ``numpy.fft.ifft``)."""
    return transform(a, *_KINDS["ifftn"], _n(n), _axis(axis), norm, chunks)


def rfft(a, n=None, axis=-1, norm=None, *, chunks=None):
    """The 1-D transform of real input (as ``numpy.fft.rfft``)."""
    return transform(a, *_KINDS["rfftn"], _n(n), _axis(axis), norm, chunks)


def irfft(a, n=None, axis=-1, norm=None, *, chunks=None):
    """The inverse of ``rfft`` (as ``numpy.fft.irfft``)."""
    return transform(a, *_KINDS["irfftn"], _n(n), _axis(axis), norm, chunks)
