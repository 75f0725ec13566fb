"""How many bytes of each new chunk each rank already holds: what owners are chosen on.

A piece's volume is the product of its per-axis overlaps, so the bytes rank ``r`` holds
of new chunk ``j`` come from contracting ``r``'s input mask with every axis's overlap
segments in turn, never enumerating pieces (a rechunk across the grid has n_old x n_new
of them). Each rank's contraction is cut to the box of old chunks it holds and yields a
dense *block* over the box of new chunks those touch; `Local` keeps the blocks.

Owner candidates that are boxes of new chunks (the bisection candidates) ask for
box sums: each block keeps a summed-area table, so a sum costs 2^ndim look-ups whatever
the box's size. Where every rank holds part of every new chunk (slabs across the grid)
the blocks hold ranks x new chunks values, and box sums keep the candidates from
walking them again. Only the greedy candidate needs the values one by one (`triples`),
and it is tried only while they are few (`dask_redist.planning.owners.GREEDY_MAX_PAIRS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from dask_redist.planning.geometry import RechunkSpec, axis_segments


@dataclass(frozen=True, eq=False)
class Local:
    """Per rank, the bytes it holds of each new chunk in a box of the new grid (needed chunks only)."""

    blocks: tuple[tuple[int, tuple[int, ...], np.ndarray], ...]  # (rank, lower grid index, bytes block)
    grid: tuple[int, ...]  # the new chunk grid
    nranks: int

    @cached_property
    def pairs(self) -> int:
        """How many (chunk, rank) pairs hold bytes."""
        return sum(int(np.count_nonzero(b)) for _, _, b in self.blocks)

    @property
    def total(self) -> int:
        return sum(int(b.sum()) for _, _, b in self.blocks)

    @cached_property
    def triples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flat new chunk, rank, bytes) of every pair holding bytes."""
        parts = []
        for r, lower, b in self.blocks:
            idx = np.nonzero(b)
            flat = np.ravel_multi_index(tuple(i + lo for i, lo in zip(idx, lower)), self.grid)
            parts.append((flat, np.full(len(flat), r, np.int64), b[idx]))
        if not parts:
            return (np.zeros(0, np.int64),) * 3
        return tuple(np.concatenate(c).astype(np.int64) for c in zip(*parts))

    def dense(self) -> np.ndarray:
        """As an (n_new, nranks) matrix (small cases and tests)."""
        out = np.zeros((math.prod(self.grid), self.nranks), dtype=np.int64)
        chunk, rank, nbytes = self.triples
        np.add.at(out, (chunk, rank), nbytes)
        return out

    def _region(self, lower, block, flat_owners: np.ndarray) -> np.ndarray:
        """``flat_owners`` (per new chunk) over a block's box."""
        return flat_owners.reshape(self.grid)[tuple(slice(lo, lo + n) for lo, n in zip(lower, block.shape))]

    def kept(self, owners: np.ndarray) -> int:
        """Bytes that stay where they are when ``owners[j]`` owns new chunk ``j`` (flat)."""
        return sum(int(b[self._region(lower, b, owners) == r].sum()) for r, lower, b in self.blocks)

    def traffic(self, owners: np.ndarray) -> np.ndarray:
        """Bytes sent from rank s to rank d when ``owners[j]`` owns new chunk ``j`` (flat)."""
        out = np.zeros((self.nranks, self.nranks), dtype=np.int64)
        for r, lower, b in self.blocks:
            out[r] += np.bincount(self._region(lower, b, owners).ravel(), weights=b.ravel(), minlength=self.nranks).astype(np.int64)
        return out

    @cached_property
    def _tables(self) -> list[np.ndarray]:
        """A summed-area table per block: ``S[i...] = sum of block[:i, ...]`` (one zero row in front)."""
        tables = []
        for _, _, b in self.blocks:
            s = np.zeros([n + 1 for n in b.shape], dtype=np.int64)
            s[tuple(slice(1, None) for _ in b.shape)] = b
            for axis in range(b.ndim):
                if b.shape[axis] > 1:  # along an axis of one chunk the padded table is its own sum
                    np.cumsum(s, axis=axis, out=s)
            tables.append(s)
        return tables

    def box_sums(self, boxes: Sequence[Sequence[tuple[int, int]] | None]) -> np.ndarray:
        """Bytes each rank holds of each box of new chunks (``[(lo, hi), ...]`` grid-index ranges
        per axis, or None for none), as (nboxes, nranks): 2^ndim look-ups per box and block."""
        ndim = len(self.grid)
        lo = np.array([[r[0] for r in box] if box is not None else [0] * ndim for box in boxes], dtype=np.int64).reshape(-1, ndim)
        hi = np.array([[r[1] for r in box] if box is not None else [0] * ndim for box in boxes], dtype=np.int64).reshape(-1, ndim)
        out = np.zeros((len(lo), self.nranks), dtype=np.int64)
        for (r, lower, b), table in zip(self.blocks, self._tables):
            shape = np.array(b.shape)
            a = np.clip(lo - np.array(lower), 0, shape)
            z = np.clip(hi - np.array(lower), 0, shape)
            empty = np.any(z <= a, axis=1)
            total = np.zeros(len(lo), dtype=np.int64)
            for corner in range(1 << ndim):  # inclusion-exclusion over the box's corners
                pick = [(corner >> axis) & 1 for axis in range(ndim)]
                index = tuple(np.where(p, z[:, axis], a[:, axis]) for axis, p in enumerate(pick))
                total += (-1) ** (ndim - sum(pick)) * table[index]
            out[:, r] += np.where(empty, 0, total)
        return out


def local_bytes(spec: RechunkSpec, in_ranks: np.ndarray, nranks: int, needed: np.ndarray) -> Local:
    """Bytes of every needed new chunk held by every rank (the module docstring says how)."""
    segments = [axis_segments(o, n) for o, n in zip(spec.old, spec.new)]
    blocks = []
    flat_ranks = in_ranks.ravel()
    order = np.argsort(flat_ranks, kind="stable")
    ranks, starts = np.unique(flat_ranks[order], return_index=True)
    for r, mine in zip(ranks.tolist(), np.split(order, starts[1:])):
        where = np.unravel_index(mine, in_ranks.shape)
        box = tuple(slice(int(w.min()), int(w.max()) + 1) for w in where)
        m = np.zeros([s.stop - s.start for s in box], dtype=np.int64)
        m[tuple(w - s.start for w, s in zip(where, box))] = 1
        lower = []
        for axis, seg in enumerate(segments):
            take = (seg.old >= box[axis].start) & (seg.old < box[axis].stop)
            if not take.any():  # only empty chunks along this axis
                break
            new = seg.new[take]
            lower.append(int(new.min()))
            m = _mode_product(m, axis, seg.old[take] - box[axis].start, new - new.min(), seg.stop[take] - seg.start[take], int(new.max() - new.min() + 1))
        else:
            m *= spec.itemsize * needed[tuple(slice(lo, lo + n) for lo, n in zip(lower, m.shape))]
            blocks.append((r, tuple(lower), m))
    return Local(tuple(blocks), spec.new_grid, nranks)


def _mode_product(m: np.ndarray, axis: int, old: np.ndarray, new: np.ndarray, length: np.ndarray, n_new: int):
    """``m`` with axis ``axis`` mapped from old to new chunk indices, weighted by the overlaps."""
    taken = np.take(m, old, axis=axis) * length.reshape([-1 if a == axis else 1 for a in range(m.ndim)])
    shape = list(m.shape)
    shape[axis] = n_new
    out = np.zeros(shape, dtype=np.int64)
    # segments come in increasing position, so their new chunks never decrease: sum each run
    starts = np.flatnonzero(np.concatenate([[True], new[1:] != new[:-1]]))
    out[(slice(None),) * axis + (new[starts],)] = np.add.reduceat(taken, starts, axis=axis)
    return out
