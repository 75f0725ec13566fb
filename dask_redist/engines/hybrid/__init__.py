"""The ``hybrid`` engine: CuPy pieces through CUDA IPC within a host, over Dask's comms between hosts."""

from dask_redist.engines.hybrid.engine import HybridEngine

__all__ = ["HybridEngine"]
