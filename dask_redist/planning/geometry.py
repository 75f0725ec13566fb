"""The geometry of a rechunk: chunk grids, chunk boxes, and chunk indices.

Pure: NumPy on chunk tuples, nothing from dask, distributed or a GPU library.

**One index form.** Inside dask-redist a chunk is named by its *flat* index, C order
over its grid (an ``int``): the planner's vectorized arrays, the staged chunks, the
runs' inputs and outputs and the unpack tasks all use it. N-D grid indices exist
only where dask's keys do (``(name, i, j, ...)``): `RechunkSpec.old_index` /
`new_index` and `flat_index` convert at that boundary (the graph and the
scheduler's view of the output keys), nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

Chunks = tuple[tuple[int, ...], ...]


class PlanError(ValueError):
    """The chunks, placement or rank count given to the planner are inconsistent."""


def _as_chunks(chunks: Sequence[Sequence[int]], name: str) -> Chunks:
    out = []
    for axis, c in enumerate(chunks):
        sizes = []
        for s in c:
            if isinstance(s, float) and math.isnan(s):
                raise PlanError(f"{name}: axis {axis} has unknown (NaN) chunk sizes")
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
                raise PlanError(f"{name}: axis {axis} has chunk size {s!r}; expected integers >= 0")
            sizes.append(int(s))
        if not sizes:
            raise PlanError(f"{name}: axis {axis} has no chunks")
        out.append(tuple(sizes))
    return tuple(out)


@dataclass(frozen=True)
class RechunkSpec:
    """What is rechunked: the chunks before and after and the item size in bytes."""

    old: Chunks
    new: Chunks
    itemsize: int

    def __post_init__(self):
        old = _as_chunks(self.old, "old chunks")
        new = _as_chunks(self.new, "new chunks")
        if len(old) != len(new):
            raise PlanError(f"old chunks have {len(old)} axes, new chunks {len(new)}")
        for axis, (a, b) in enumerate(zip(old, new)):
            if sum(a) != sum(b):
                raise PlanError(f"axis {axis}: old chunks sum to {sum(a)}, new chunks to {sum(b)}")
        if not isinstance(self.itemsize, (int, np.integer)) or self.itemsize <= 0:
            raise PlanError(f"itemsize must be a positive integer, got {self.itemsize!r}")
        object.__setattr__(self, "old", old)
        object.__setattr__(self, "new", new)
        object.__setattr__(self, "itemsize", int(self.itemsize))

    @property
    def ndim(self) -> int:
        return len(self.old)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(sum(c) for c in self.old)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def old_grid(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.old)

    @property
    def new_grid(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.new)

    def old_index(self, flat: int) -> tuple[int, ...]:
        """The N-D grid index (a dask key's tail) of old chunk ``flat``."""
        return tuple(int(i) for i in np.unravel_index(int(flat), self.old_grid))

    def new_index(self, flat: int) -> tuple[int, ...]:
        """The N-D grid index (a dask key's tail) of new chunk ``flat``."""
        return tuple(int(i) for i in np.unravel_index(int(flat), self.new_grid))

    def old_box(self, flat: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Global (lower, upper) bounds of old chunk ``flat``."""
        return _box(self.old, self._old_lowers, self.old_index(flat))

    def new_box(self, flat: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Global (lower, upper) bounds of new chunk ``flat``."""
        return _box(self.new, self._new_lowers, self.new_index(flat))

    def old_boxes(self, flats) -> tuple[np.ndarray, np.ndarray]:
        """Global (lower, upper) bounds of the old chunks ``flats``, ``(n, ndim)`` each: `old_box` of
        many chunks at once."""
        return _boxes(self.old, self._old_lowers, self.old_grid, flats)

    def new_boxes(self, flats) -> tuple[np.ndarray, np.ndarray]:
        """Global (lower, upper) bounds of the new chunks ``flats``, ``(n, ndim)`` each."""
        return _boxes(self.new, self._new_lowers, self.new_grid, flats)

    @cached_property
    def _old_lowers(self) -> list[np.ndarray]:
        return chunk_lowers(self.old)

    @cached_property
    def _new_lowers(self) -> list[np.ndarray]:
        return chunk_lowers(self.new)


def flat_index(index: Sequence[int], grid: Sequence[int]) -> int:
    """The flat (C order) index of grid index ``index``: the other direction of `RechunkSpec.old_index`."""
    return int(np.ravel_multi_index(tuple(int(i) for i in index), tuple(grid)))


def _box(chunks: Chunks, lowers: list[np.ndarray], index: Sequence[int]):
    lower = tuple(int(lw[i]) for lw, i in zip(lowers, index))
    return lower, tuple(lo + c[i] for lo, c, i in zip(lower, chunks, index))


def _boxes(chunks: Chunks, lowers: list[np.ndarray], grid, flats) -> tuple[np.ndarray, np.ndarray]:
    index = np.unravel_index(np.asarray(flats, dtype=np.int64).reshape(-1), grid)
    lower = np.empty((len(index[0]) if index else 0, len(grid)), dtype=np.int64)
    upper = np.empty_like(lower)
    for axis, (c, lw, i) in enumerate(zip(chunks, lowers, index)):
        lower[:, axis] = lw[i]
        upper[:, axis] = lw[i] + np.asarray(c, dtype=np.int64)[i]
    return lower, upper


def chunk_lowers(chunks: Chunks) -> list[np.ndarray]:
    """Per axis, the global start of every chunk (the sum of the chunk sizes before it)."""
    return [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64) for c in chunks]


def chunk_nbytes(chunks: Chunks, itemsize: int) -> np.ndarray:
    """Bytes of every chunk, as an array shaped like the chunk grid."""
    out = np.ones([len(c) for c in chunks], dtype=np.int64) * itemsize
    for axis, c in enumerate(chunks):
        shape = [1] * len(chunks)
        shape[axis] = len(c)
        out = out * np.asarray(c, dtype=np.int64).reshape(shape)
    return out


def rank_extents(chunks: Chunks, ranks: np.ndarray, nranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank: the lowest and (highest + 1) grid index of its non-empty chunks on every axis,
    ``(nranks, ndim)`` each (-1 for a rank holding none; ranks < 0 are nobody's), and the elements
    of its chunks. One sort of the chunks by rank: linear in the chunks, not chunks x ranks."""
    grid = tuple(len(c) for c in chunks)
    sizes = chunk_nbytes(chunks, 1).ravel()
    flat_ranks = np.asarray(ranks, dtype=np.int64).ravel()
    keep = np.flatnonzero((sizes > 0) & (flat_ranks >= 0))
    order = np.argsort(flat_ranks[keep], kind="stable")
    keep = keep[order]
    present, starts = np.unique(flat_ranks[keep], return_index=True)
    lo = np.full((nranks, len(grid)), -1, dtype=np.int64)
    hi = np.full((nranks, len(grid)), -1, dtype=np.int64)
    elements = np.zeros(nranks, dtype=np.int64)
    if len(keep):
        index = np.stack(np.unravel_index(keep, grid), axis=1)
        lo[present] = np.minimum.reduceat(index, starts, axis=0)
        hi[present] = np.maximum.reduceat(index, starts, axis=0) + 1
        elements[present] = np.add.reduceat(sizes[keep], starts)
    return lo, hi, elements


@dataclass(frozen=True, eq=False)
class AxisSegments:
    """The intersections of two chunkings of one axis, in increasing order."""

    old: np.ndarray  # old chunk index of each segment
    new: np.ndarray  # new chunk index of each segment
    start: np.ndarray  # global start of each segment
    stop: np.ndarray  # global stop of each segment

    def __len__(self) -> int:
        return len(self.start)


def axis_segments(old: Sequence[int], new: Sequence[int]) -> AxisSegments:
    """Segments where old and new chunks of one axis overlap (empty chunks have none)."""
    old_bounds = np.concatenate([[0], np.cumsum(old, dtype=np.int64)])
    new_bounds = np.concatenate([[0], np.cumsum(new, dtype=np.int64)])
    cuts = np.concatenate([old_bounds, new_bounds])  # both sorted: a merge, then the repeats out
    cuts.sort(kind="stable")
    cuts = cuts[np.concatenate([[True], cuts[1:] != cuts[:-1]])]
    start, stop = cuts[:-1], cuts[1:]
    # The chunk containing [start, stop) is the last one starting at or before start;
    # side="right" skips zero-length chunks that start at the same position.
    o = np.searchsorted(old_bounds, start, side="right") - 1
    n = np.searchsorted(new_bounds, start, side="right") - 1
    return AxisSegments(o.astype(np.int64), n.astype(np.int64), start, stop)
