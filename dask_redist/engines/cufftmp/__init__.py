"""The ``cufftmp`` engine: CuPy chunks GPU to GPU through NVSHMEM, one cuFFTMp reshape per round.

* `engine`: `CufftMpEngine`, a run in rounds through the symmetric arena;
* `nvshmem`: what this process's NVSHMEM can do (capabilities, version, heap) and the arena;
* `world`: the NVSHMEM world of a worker process, bootstrapped through the scheduler, and
  the scheduler's record of it;
* `remote`: NVSHMEM's remote transport, off for a world on one host without InfiniBand.
"""

from dask_redist.engines.cufftmp.engine import CufftMpEngine

__all__ = ["CufftMpEngine"]
