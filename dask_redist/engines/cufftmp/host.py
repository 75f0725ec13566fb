"""NumPy chunks through the GPUs: host -> GPU -> NVLink -> GPU -> host, a round at a time.

nvmath-python's ``Redistribute`` takes host operands by copying them whole to the GPU
and back. Here a rank's NumPy chunks stay where Dask keeps them: each round uploads only
the parts of them that the round's input box needs, and the parts of its output box come
back into NumPy output chunks. GPU memory is the arena plus one round's parts, whatever
the size of the array, so ``redist.memory-budget`` bounds it as it does for CuPy chunks.

What it costs (first version, 2026-12-01): the copies are from and to pageable memory,
and they run only while this rank's stream holds no NVSHMEM work (the engine drains it
first). A copy from pageable memory can block the calling thread until the stream
reaches it, and a stream waiting inside a reshape for a dead peer never does: the
engine's thread must never block there (see ``CufftMpEngine._wait``). So a round's host
copies do not overlap the exchange of the previous round; pinned staging that would let
them is not built yet.

Only dtypes CuPy holds (booleans, integers, floats, complex) go this way; the scheduler
refuses others with a clear error before the run starts (`host_dtype_problem`).
"""

from __future__ import annotations

import numpy as np

from dask_redist.planning.boxes import Box


def host_dtype_problem(dtype) -> str | None:
    """Why NumPy chunks of ``dtype`` cannot go through the GPUs, or None."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biufc":
        return None
    return (
        f"redist.engine=cufftmp moves NumPy chunks of booleans, integers, floats and complex "
        f"numbers through the GPUs, not {dtype}; use redist.engine=auto or dask for this array"
    )


class HostParts:
    """Device arrays for the parts of host chunks inside one box of one round.

    ``upload``: copies of the input chunks' parts (a stage reads them); otherwise empty
    arrays that an unstage fills and `download` copies into the host chunks.
    """

    def __init__(self, arrays: dict, box_of, box: Box, upload: bool):
        import cupy

        self.host: dict[int, np.ndarray] = {}
        self.device: dict[int, object] = {}
        self._bounds: dict[int, tuple] = {}
        for flat, array in arrays.items():
            chunk = Box(*map(tuple, box_of(flat)))
            part = chunk.intersect(box)
            if not part.size:
                continue
            view = array[part.slices(chunk.lower)]
            self.host[flat] = view
            self.device[flat] = cupy.asarray(np.ascontiguousarray(view)) if upload else cupy.empty(part.shape, array.dtype)
            self._bounds[flat] = (part.lower, part.upper)

    def box_of(self, flat: int) -> tuple:
        """Global bounds of the part of chunk ``flat`` (as ``RechunkSpec.old_box`` gives a chunk's)."""
        return self._bounds[flat]

    def download(self) -> None:
        """Copy the device parts into the host chunks (the stream must have finished writing them)."""
        for flat, device in self.device.items():
            self.host[flat][...] = device.get()


def to_device(piece):
    """A device copy of a host array (a packed layout's input piece)."""
    import cupy

    return cupy.asarray(np.ascontiguousarray(piece))
