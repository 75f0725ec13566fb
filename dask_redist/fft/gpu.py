"""The GPU path: one collective step per transform through cuFFTMp (not built yet: every
call takes the path that runs everywhere, `dask_redist.fft.local`)."""

from __future__ import annotations

from dask_redist.fft.plan import FFTOp


def problem(x, op: FFTOp) -> str | None:
    """Why ``op`` on ``x`` takes the path that runs everywhere, or None for the GPU path."""
    if not type(x._meta).__module__.startswith("cupy"):
        return "NumPy chunks: collective rechunks and numpy.fft on every chunk"
    return "CuPy chunks: collective rechunks and cupy.fft on every chunk"


def build(x, op: FFTOp, chunks):
    raise NotImplementedError
