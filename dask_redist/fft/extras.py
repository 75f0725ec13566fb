"""The rest of ``dask.array.fft``: ``hfft``, ``ihfft``, ``fft_wrap``, and the helpers.

``hfft`` and ``ihfft`` are NumPy's definitions on this package's ``irfft`` and ``rfft`` (so a
chunked axis is rechunked, not refused). ``fft_wrap`` is Dask's wrapper of any ``numpy.fft``-like
function, with the axes it transforms rechunked to one chunk first (through the collective where
eligible). ``fftfreq``, ``rfftfreq``, ``fftshift`` and ``ifftshift`` are Dask's: they need no
chunk along any axis to be whole.
"""

from __future__ import annotations

import operator

from dask.array.fft import fftfreq, fftshift, ifftshift, rfftfreq

from dask_redist.fft import api

__all__ = ["fft_wrap", "fftfreq", "fftshift", "hfft", "ifftshift", "ihfft", "rfftfreq"]

#: NumPy's ``norm`` for the transform in the other direction (``numpy.fft._pocketfft._swap_direction``)
_SWAPPED = {None: "forward", "backward": "forward", "ortho": "ortho", "forward": "backward"}


def _swap(norm):
    if norm not in _SWAPPED:  # (as the transform itself would say)
        raise ValueError(f'norm must be None, "backward", "ortho" or "forward", got {norm!r}')
    return _SWAPPED[norm]


def hfft(a, n=None, axis=-1, norm=None, *, chunks=None):
    """The FFT of a signal with Hermitian symmetry, a real spectrum (as ``numpy.fft.hfft``):
    ``irfft`` of the conjugate, in the other direction's normalization; ``axis`` may be chunked."""
    x = api.as_dask(a)
    return api.irfft(x.conj(), n, axis, _swap(norm), chunks=chunks)


def ihfft(a, n=None, axis=-1, norm=None, *, chunks=None):
    """The inverse of ``hfft`` (as ``numpy.fft.ihfft``): the conjugate of ``rfft`` in the other
    direction's normalization; ``axis`` may be chunked."""
    return api.rfft(a, n, axis, _swap(norm), chunks=chunks).conj()


def _whole(x, axes):
    """``x`` with ``axes`` in one chunk each (as `api` rechunks: the collective where eligible);
    axes Dask's function will refuse (out of range, not integers) are left to it."""
    from dask_redist.fft import local

    try:
        wanted = {operator.index(a) % x.ndim for a in axes if -x.ndim <= operator.index(a) < x.ndim}
    except TypeError:
        return x
    chunks = tuple((sum(c),) if i in wanted else c for i, c in enumerate(x.chunks))
    return local.rechunk(x, chunks)[0]


def fft_wrap(fft_func, kind=None, dtype=None, allow_fftpack=False):
    """``dask.array.fft.fft_wrap``: ``fft_func`` (``numpy.fft``-like: ``numpy.fft``, ``scipy.fft``)
    on dask arrays, its ``kind`` one of ``numpy.fft``'s function names (default: its name). The
    axes it transforms may be chunked: they are rechunked to one chunk first."""
    from dask.array.fft import fft_wrap as dasks

    inner = dasks(fft_func, kind, dtype, allow_fftpack)  # (checks kind, warns for scipy.fftpack)
    kind = kind or fft_func.__name__
    if kind.endswith("fft"):  # (Dask's 1-D signature)

        def func(a, n=None, axis=None, norm=None):
            x = api.as_dask(a)
            return inner(_whole(x, (-1 if axis is None else axis,)), n, axis, norm)

    else:

        def func(a, s=None, axes=None, norm=None):
            x = api.as_dask(a)
            if axes is not None:
                wanted = axes
            elif kind.endswith("2"):
                wanted = (-2, -1)
            else:  # (Dask's: the first len(s) axes, and NumPy's warning)
                wanted = range(x.ndim if s is None else len(s))
            return inner(_whole(x, wanted), s, axes, norm)

    func.__name__, func.__doc__ = inner.__name__, inner.__doc__
    return func
