"""Distributed FFTs of dask arrays: NumPy's ``numpy.fft`` functions, on chunked axes (docs/fft.md)."""

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
