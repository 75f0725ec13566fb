"""Cutting pieces out of chunks and putting chunks together from pieces.

Works on any array that slices like NumPy (NumPy, CuPy): the array's own
namespace allocates, so CuPy chunks stay on their GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from dask_redist.errors import RedistError
from dask_redist.planning.boxes import Box


def chunk_type_of(x: Any) -> str:
    """'numpy', 'cupy', or the type's qualified name for anything else."""
    t = type(x)
    if t is np.ndarray:
        return "numpy"
    module = t.__module__.split(".")[0]
    if module == "cupy" and t.__name__ == "ndarray":
        return "cupy"
    return f"{t.__module__}.{t.__qualname__}"


def converted(x: Any, to: str, what: str = "a chunk"):
    """``x`` as a ``to`` ("numpy" or "cupy") array, or as it is for "same" and for arrays of
    other types (they fail the chunk-type check with their own name) (``redist.output-type``).
    A ``numpy.memmap`` (``np.load(mmap_mode=...)``'s, ``da.from_npy_stack``'s) is a NumPy array
    on a file: a plain ``ndarray`` view of it (no copy)."""
    if isinstance(x, np.memmap):
        x = x.view(np.ndarray)
    chunk_type = chunk_type_of(x)
    if to == "same" or chunk_type == to or chunk_type not in ("numpy", "cupy"):
        return x
    if to == "numpy":
        return x.get()  # (a CuPy array: device to host)
    try:
        import cupy
    except ImportError:
        raise RedistError(f"redist.output-type is cupy but CuPy cannot be imported for {what}") from None
    return cupy.asarray(x)


def cut(chunk, chunk_lower: Sequence[int], lower: Sequence[int], upper: Sequence[int]):
    """The part of ``chunk`` (whose first element is global ``chunk_lower``) in [lower, upper)."""
    return chunk[tuple(slice(l - o, u - o) for l, u, o in zip(lower, upper, chunk_lower))]


def parts_in(chunks: dict, box_of, box: Box) -> Iterator[tuple[int, Box, Any]]:
    """(flat index, part, view of it) for every chunk with a part inside ``box``; ``box_of(flat)``
    gives a chunk's global (lower, upper), as ``RechunkSpec.old_box`` does."""
    for flat, chunk in chunks.items():
        bounds = Box(*map(tuple, box_of(flat)))
        part = bounds.intersect(box)
        if part.size:
            yield flat, part, chunk[part.slices(bounds.lower)]


def viewed_nbytes(a) -> int:
    """The bytes of the memory ``a`` views: its own where it owns them, else its base's (an
    array, or the buffer it was read from)."""
    base = getattr(a, "base", None)
    if base is None:
        return a.nbytes
    try:
        return int(getattr(base, "nbytes", None) or memoryview(base).nbytes)
    except TypeError:
        return a.nbytes


def empty(like, shape: Sequence[int], dtype):
    """An uninitialized C-ordered array in the same namespace (and device) as ``like``."""
    return np.empty_like(like, shape=tuple(shape), dtype=dtype, order="C")


@dataclass
class Assembly:
    """An output chunk still in pieces: ``parts`` are (lower, upper, array), global bounds.

    ``shared`` marks parts that are views into a larger received buffer: those are
    always copied, so that an output chunk never pins a whole message in memory. A single
    part of this rank's own is copied too where it views at least twice its bytes (a small
    part of an input chunk), as Dask's ``getitem`` copies such a selection: a view would keep
    the whole input chunk alive, and be strided where Dask's chunk is C-ordered.
    """

    lower: tuple[int, ...]
    upper: tuple[int, ...]
    dtype: Any
    like: Any  # an array of the right namespace, for allocation
    parts: list[tuple[Sequence[int], Sequence[int], Any]]
    shared: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(u - l for l, u in zip(self.lower, self.upper))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    @property
    def copies(self) -> bool:
        """Whether `build` copies (False: one piece covering the chunk, not a small part of a
        larger array, returned as is)."""
        if len(self.parts) != 1 or self.shared:
            return True
        lo, hi, a = self.parts[0]
        if not (tuple(lo) == self.lower and tuple(hi) == self.upper):
            return True
        return a.nbytes > 0 and viewed_nbytes(a) >= 2 * a.nbytes

    def build(self):
        """The chunk; a single piece covering it is returned without a copy (`copies`)."""
        if not self.copies:
            return self.parts[0][2]
        shape = self.shape
        out = empty(self.like, shape, self.dtype)
        covered = 0
        for lo, hi, a in self.parts:  # (math.prod, not np.prod: per part of every chunk)
            out[tuple(slice(l - o, u - o) for l, u, o in zip(lo, hi, self.lower))] = a
            covered += math.prod(int(u) - int(l) for l, u in zip(lo, hi))
        if covered != math.prod(shape):
            raise RedistError(f"chunk at {self.lower} got {covered} of {math.prod(shape)} elements")
        return out
