"""Boxes of the global array, and folding N-D boxes into the 3-D word boxes a reshape takes.

A cuFFTMp reshape takes 3-D boxes of 4, 8 or 16-byte elements. N-D boxes are folded
into 3-D ones by merging adjacent axes where every box is contiguous across the
pair, and the last axis is counted in words of 16, 8 or 4 bytes (`fold_boxes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from dask_redist.planning.geometry import Chunks, rank_extents
from dask_redist.planning.owners import is_box_placement
from dask_redist.planning.plan import Transfers

WORDS = (16, 8, 4)  # element sizes a cuFFTMp reshape accepts, largest first


@dataclass(frozen=True)
class Box:
    """A box of the global array: ``lower <= index < upper`` on every axis."""

    lower: tuple[int, ...]
    upper: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(max(0, u - l) for l, u in zip(self.lower, self.upper))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def intersect(self, other: Box) -> Box:
        lo = tuple(max(a, b) for a, b in zip(self.lower, other.lower))
        hi = tuple(max(l, min(a, b)) for l, a, b in zip(lo, self.upper, other.upper))
        return Box(lo, hi)

    def slices(self, origin: Sequence[int] | None = None) -> tuple[slice, ...]:
        """Slices selecting this box inside an array whose first element is ``origin``."""
        origin = origin or (0,) * len(self.lower)
        return tuple(slice(l - o, u - o) for l, u, o in zip(self.lower, self.upper, origin))


def rank_boxes(chunks: Chunks, ranks: np.ndarray, nranks: int) -> list[Box | None]:
    """The box each rank's non-empty chunks cover (None for a rank holding no data).

    Callers check :func:`~dask_redist.plan.is_box_placement` first: this is the
    bounding box, equal to the union only for box placements.
    """
    bounds = [np.concatenate([[0], np.cumsum(c)]) for c in chunks]
    lo, hi, _ = rank_extents(chunks, ranks, nranks)
    return [
        None
        if l[0] < 0
        else Box(tuple(int(b[i]) for b, i in zip(bounds, l)), tuple(int(b[i]) for b, i in zip(bounds, h)))
        for l, h in zip(lo.tolist(), hi.tolist())
    ]


# -- folding N-D boxes into 3-D word boxes ----------------------------------------------


@dataclass(frozen=True)
class Folded:
    """Boxes folded to 3-D, in words: what a cuFFTMp reshape is told."""

    shape: tuple[int, int, int]
    lower: np.ndarray  # (nboxes, 3)
    upper: np.ndarray  # (nboxes, 3)
    word: int

    def at_origin(self) -> Folded:
        """The same boxes moved together so that the non-empty ones start at 0 on every axis
        (empty ones at 0), ``shape`` their bounding box.

        A reshape moves the same data between boxes moved together by one offset: it takes
        no global shape, only each rank's box. Told the boxes at the origin, the rounds of a
        direct layout (slabs of one width at different offsets) share one reshape plan;
        told them where they lie, it made a plan per round (each one collective), all before its
        first round (`DirectLayout.reshapes`; docs/gpu-testing.md, the cancel mid-run at 4 PEs).
        """
        nonempty = np.all(self.upper > self.lower, axis=1)
        if not nonempty.any():
            zeros = np.zeros_like(self.lower)
            return Folded((0, 0, 0), zeros, zeros.copy(), self.word)
        origin = self.lower[nonempty].min(axis=0)
        lower = np.where(nonempty[:, None], self.lower - origin, 0)
        upper = np.where(nonempty[:, None], self.upper - origin, 0)
        return Folded(tuple(int(n) for n in upper.max(axis=0)), lower, upper, self.word)


def fold_boxes(shape: Sequence[int], lower: np.ndarray, upper: np.ndarray, itemsize: int) -> Folded | None:
    """Fold N-D boxes into at most 3 axes of 4/8/16-byte words, or None if impossible.

    Adjacent axes ``i, i+1`` merge when every non-empty box either spans one index
    along ``i`` or all of axis ``i+1``; then each box stays contiguous in C order,
    so a C-ordered N-D box buffer *is* the folded 3-D box buffer.
    """
    shape = [int(s) for s in shape]
    lo = np.array(lower, dtype=np.int64).reshape(-1, len(shape))
    hi = np.array(upper, dtype=np.int64).reshape(-1, len(shape))
    if not shape:
        shape, lo, hi = [1], np.zeros((len(lo), 1), np.int64), np.ones((len(hi), 1), np.int64)
    nonempty = np.all(hi > lo, axis=1)
    # count the last axis in bytes
    shape[-1] *= itemsize
    lo[:, -1] *= itemsize
    hi[:, -1] *= itemsize

    def mergeable(i):
        l, h = lo[nonempty], hi[nonempty]
        return bool(np.all((h[:, i] - l[:, i] <= 1) | ((l[:, i + 1] == 0) & (h[:, i + 1] == shape[i + 1]))))

    def merge(i):
        nonlocal lo, hi, shape
        n = shape[i + 1]
        new_lo = lo[:, i] * n + lo[:, i + 1]
        new_hi = (hi[:, i] - 1) * n + hi[:, i + 1]
        new_lo = np.where(nonempty, new_lo, 0)
        new_hi = np.where(nonempty, new_hi, 0)
        lo = np.concatenate([lo[:, :i], new_lo[:, None], lo[:, i + 2 :]], axis=1)
        hi = np.concatenate([hi[:, :i], new_hi[:, None], hi[:, i + 2 :]], axis=1)
        shape = shape[:i] + [shape[i] * n] + shape[i + 2 :]

    def word():
        for w in WORDS:
            if shape[-1] % w == 0 and np.all(lo[:, -1] % w == 0) and np.all(hi[:, -1] % w == 0):
                return w
        return None

    while True:
        if len(shape) <= 3 and word() is not None:
            break
        # merge the innermost mergeable pair: it fixes word alignment first
        for i in range(len(shape) - 2, -1, -1):
            if mergeable(i):
                merge(i)
                break
        else:
            return None
    w = word()
    shape[-1] //= w
    lo[:, -1] //= w
    hi[:, -1] //= w
    while len(shape) < 3:
        shape.insert(0, 1)
        lo = np.concatenate([np.zeros((len(lo), 1), np.int64), lo], axis=1)
        hi = np.concatenate([np.where(nonempty, 1, 0)[:, None], hi], axis=1)
    return Folded(tuple(shape), lo, hi, w)


# -- input chunks cut to output boxes (the dask engine's box mapping) -----------------------


def box_transfers(
    chunks_in: Chunks,
    in_ranks: np.ndarray,
    chunks_out: Chunks,
    out_ranks: np.ndarray,
    nranks: int,
    itemsize: int,
):
    """What moves when every rank's (needed) output chunks tile one box: each input chunk cut
    to each rank's output box, as `dask_redist.planning.plan.Transfers` (``new_block`` -1);
    None when the outputs do not tile boxes. ``out_ranks`` is -1 for chunks nobody needs.

    The pieces of a rechunk (``old chunk ∩ new chunk``) can number in the millions (1024
    row slabs to 1024 column slabs: 1024 x 1024); these blocks number at most the input
    chunks times the ranks each one touches, so moving them costs one copy per block on
    each side and one copy per output chunk, in calls that follow the chunks, not the pieces.
    """
    if not is_box_placement(chunks_out, out_ranks, nranks):
        return None
    outs = rank_boxes(chunks_out, out_ranks, nranks)
    grid = tuple(len(c) for c in chunks_in)
    bounds = [np.concatenate([[0], np.cumsum(c, dtype=np.int64)]) for c in chunks_in]
    index = np.indices(grid, dtype=np.int64).reshape(len(grid), -1)
    lo = np.stack([b[i] for b, i in zip(bounds, index)], axis=1)
    hi = np.stack([b[i + 1] for b, i in zip(bounds, index)], axis=1)
    flat, src = np.arange(lo.shape[0], dtype=np.int64), np.asarray(in_ranks, dtype=np.int64).ravel()
    parts = []
    for d, box in enumerate(outs):
        if box is None:
            continue
        plo, phi = np.maximum(lo, box.lower), np.minimum(hi, box.upper)
        keep = np.all(phi > plo, axis=1)
        n = int(keep.sum())
        parts.append((src[keep], np.full(n, d, np.int64), flat[keep], plo[keep], phi[keep]))
    if not parts:
        empty = np.zeros(0, np.int64)
        return Transfers(
            empty,
            empty,
            empty,
            empty,
            np.zeros((0, len(grid)), np.int64),
            np.zeros((0, len(grid)), np.int64),
            itemsize,
        )
    s, d, f, plo, phi = (np.concatenate(c) for c in zip(*parts))
    return Transfers(s, d, f, np.full(len(s), -1, np.int64), plo, phi, itemsize)
