"""Distributed FFTs of dask arrays: NumPy's ``numpy.fft`` functions, on chunked axes.

>>> import dask_redist.fft as rfft
>>> y = rfft.fftn(x, axes=(0, 1, 2))          # x chunked along any axes; NumPy's result
>>> y = rfft.rfftn(x, chunks=(64, -1, -1))    # and the chunks of the result, if wanted
>>> dask_redist.explain(y)                     # which path ran, and why

Two paths (`api`): the one that runs everywhere (`local`: collective rechunks bring the
transformed axes into one chunk, ``numpy.fft`` or ``cupy.fft`` on every chunk; `plan`
decides the passes), and on GPU clusters one collective step per transform through
cuFFTMp (`gpu`); computed on another scheduler than the distributed one, either path's graph
runs Dask's rechunks and local FFTs (`dask_redist.graph.anywhere`). The rest of
``dask.array.fft`` (`extras`): ``hfft``, ``ihfft``, ``fft_wrap``, and Dask's ``fftfreq``,
``rfftfreq``, ``fftshift``, ``ifftshift``: a drop-in for ``dask.array.fft``, except that
chunked axes are rechunked instead of refused.
"""

from __future__ import annotations

from dask_redist.fft.api import (
    fft,
    fft2,
    fftn,
    ifft,
    ifft2,
    ifftn,
    irfft,
    irfft2,
    irfftn,
    rfft,
    rfft2,
    rfftn,
)
from dask_redist.fft.extras import fft_wrap, fftfreq, fftshift, hfft, ifftshift, ihfft, rfftfreq

__all__ = [
    "fft",
    "fft2",
    "fft_wrap",
    "fftfreq",
    "fftn",
    "fftshift",
    "hfft",
    "ifft",
    "ifft2",
    "ifftn",
    "ifftshift",
    "ihfft",
    "irfft",
    "irfft2",
    "irfftn",
    "rfft",
    "rfft2",
    "rfftfreq",
    "rfftn",
]
