"""The ``cufftmp`` engine: CuPy chunks GPU to GPU through NVSHMEM, one cuFFTMp reshape per round."""

from dask_redist.engines.cufftmp.engine import CufftMpEngine

__all__ = ["CufftMpEngine"]
