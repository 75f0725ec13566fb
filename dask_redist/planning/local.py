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

A rank holding a whole box of old chunks (slabs placed in contiguous blocks), when every
new chunk is needed, holds of each new chunk the product of per-axis overlaps: its block
is an `Outer` product of one vector per axis, kept as the vectors. A rank holding a few
boxes (a contiguous run of a grid in C order: a partial row, whole rows, a partial row;
at most `MAX_BOXES`) gets one `Outer` block per box. Their box sums are products of
per-axis prefix sums, and a dense block exists only while `kept` or `traffic` walk it.
What that saved on the scheduler's owner choice (slabs on 256 ranks, 10^5 chunks) is in
docs/scale.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, reduce
from typing import Sequence

import numpy as np

from dask_redist.planning.geometry import RechunkSpec, axis_segments


#: Boxes a rank's old chunks may be cut into before its bytes are kept dense instead.
MAX_BOXES = 8


@dataclass(frozen=True, eq=False)
class Outer:
    """A block that is the outer product of one vector per axis (bytes along the first)."""

    factors: tuple[np.ndarray, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(f) for f in self.factors)

    def array(self) -> np.ndarray:
        return reduce(np.multiply.outer, self.factors)

    def count_nonzero(self) -> int:
        return math.prod(int(np.count_nonzero(f)) for f in self.factors)

    def sum(self) -> int:
        return math.prod(int(f.sum()) for f in self.factors)

    def box_sums(self, a: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Sums over the boxes ``[a, z)`` (one per row, clipped to the block)."""
        total = np.ones(len(a), dtype=np.int64)
        for axis, f in enumerate(self.factors):
            c = np.concatenate([[0], np.cumsum(f)])
            total *= c[z[:, axis]] - c[a[:, axis]]
        return total


def _array(block) -> np.ndarray:
    return block.array() if isinstance(block, Outer) else block


def _count_nonzero(block) -> int:
    return block.count_nonzero() if isinstance(block, Outer) else int(np.count_nonzero(block))


@dataclass(frozen=True, eq=False)
class Local:
    """Per rank, the bytes it holds of each new chunk in a box of the new grid (needed chunks only)."""

    blocks: tuple[
        tuple[int, tuple[int, ...], np.ndarray | Outer], ...
    ]  # (rank, lower grid index, bytes block)
    grid: tuple[int, ...]  # the new chunk grid
    nranks: int

    @cached_property
    def pairs(self) -> int:
        """How many (chunk, rank) pairs hold bytes; at most (a rank's blocks may overlap)."""
        return sum(_count_nonzero(b) for _, _, b in self.blocks)

    @property
    def total(self) -> int:
        return sum(int(b.sum()) for _, _, b in self.blocks)

    @cached_property
    def triples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(flat new chunk, rank, bytes) of every pair holding bytes."""
        parts = []
        for r, lower, b in self.blocks:
            b = _array(b)
            idx = np.nonzero(b)
            flat = np.ravel_multi_index(tuple(i + lo for i, lo in zip(idx, lower)), self.grid)
            parts.append((flat, np.full(len(flat), r, np.int64), b[idx]))
        if not parts:
            return (np.zeros(0, np.int64),) * 3
        chunk, rank, nbytes = (np.concatenate(c).astype(np.int64) for c in zip(*parts))
        pair = chunk * self.nranks + rank
        unique, inverse = np.unique(pair, return_inverse=True)
        if len(unique) < len(pair):  # a rank with several blocks over the same new chunks
            nbytes = np.bincount(inverse, weights=nbytes).astype(np.int64)
            chunk, rank = unique // self.nranks, unique % self.nranks
        return chunk, rank, nbytes

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
        return sum(int(_array(b)[self._region(lower, b, owners) == r].sum()) for r, lower, b in self.blocks)

    def traffic(self, owners: np.ndarray) -> np.ndarray:
        """Bytes sent from rank s to rank d when ``owners[j]`` owns new chunk ``j`` (flat)."""
        out = np.zeros((self.nranks, self.nranks), dtype=np.int64)
        for r, lower, b in self.blocks:
            weights = _array(b).ravel()
            out[r] += np.bincount(
                self._region(lower, b, owners).ravel(), weights=weights, minlength=self.nranks
            ).astype(np.int64)
        return out

    @cached_property
    def _tables(self) -> list[np.ndarray | None]:
        """A summed-area table per dense block: ``S[i...] = sum of block[:i, ...]`` (one zero row
        in front); None for an `Outer` block (its sums come from its factors)."""
        tables = []
        for _, _, b in self.blocks:
            if isinstance(b, Outer):
                tables.append(None)
                continue
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
        lo = np.array(
            [[r[0] for r in box] if box is not None else [0] * ndim for box in boxes], dtype=np.int64
        ).reshape(-1, ndim)
        hi = np.array(
            [[r[1] for r in box] if box is not None else [0] * ndim for box in boxes], dtype=np.int64
        ).reshape(-1, ndim)
        out = np.zeros((len(lo), self.nranks), dtype=np.int64)
        for (r, lower, b), table in zip(self.blocks, self._tables):
            shape = np.array(b.shape)
            a = np.clip(lo - np.array(lower), 0, shape)
            z = np.clip(hi - np.array(lower), 0, shape)
            empty = np.any(z <= a, axis=1)
            if table is None:
                out[:, r] += np.where(empty, 0, b.box_sums(a, z))
                continue
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
    all_needed = bool(needed.all())
    memo: dict = {}
    blocks = []
    for r, box, mask in _rank_masks(in_ranks):
        parts = _boxes(mask, MAX_BOXES) if all_needed else None
        if parts is not None:  # a few whole boxes: one vector per axis each (module docstring)
            for part in parts:
                sub = tuple(slice(b.start + p.start, b.start + p.stop) for b, p in zip(box, part))
                if (block := _outer_block(spec, segments, sub, memo)) is not None:
                    blocks.append((r, *block))
            continue
        m, lower = mask.astype(np.int64), []
        for axis, seg in enumerate(segments):
            if (mapped := _axis_map(seg, box[axis])) is None:  # only empty chunks along this axis
                break
            lower.append(mapped[0])
            m = _mode_product(m, axis, *mapped[1])
        else:
            m *= spec.itemsize * needed[tuple(slice(lo, lo + n) for lo, n in zip(lower, m.shape))]
            blocks.append((r, tuple(lower), m))
    return Local(tuple(blocks), spec.new_grid, nranks)


def _rank_masks(in_ranks: np.ndarray):
    """(rank, bounding box of its old chunks, which of the box's chunks it holds) per rank."""
    flat_ranks = in_ranks.ravel()
    order = np.argsort(flat_ranks, kind="stable")
    ranks, starts = np.unique(flat_ranks[order], return_index=True)
    for r, mine in zip(ranks.tolist(), np.split(order, starts[1:])):
        where = np.unravel_index(mine, in_ranks.shape)
        box = tuple(slice(int(w.min()), int(w.max()) + 1) for w in where)
        mask = np.zeros([s.stop - s.start for s in box], dtype=bool)
        mask[tuple(w - s.start for w, s in zip(where, box))] = True
        yield r, box, mask


def held_as_boxes(in_ranks: np.ndarray) -> bool:
    """Does every rank hold at most `MAX_BOXES` boxes of old chunks? Then, when every new chunk
    is needed, no (rank, new chunk) table is kept (`Outer` blocks)."""
    return all(_boxes(mask, MAX_BOXES) is not None for _, _, mask in _rank_masks(in_ranks))


def _boxes(mask: np.ndarray, limit: int) -> list[tuple[slice, ...]] | None:
    """``mask``'s true cells as at most ``limit`` disjoint boxes (runs of whole slices along the
    first axis, other slices cut recursively), or None if that takes more."""
    n = mask.shape[0]
    rest = tuple(slice(0, k) for k in mask.shape[1:])
    flat = mask.reshape(n, -1)
    full, empty = flat.all(axis=1), ~flat.any(axis=1)
    out: list[tuple[slice, ...]] = []
    i = 0
    while i < n:
        if empty[i]:
            i += 1
        elif full[i]:
            j = i + 1 + int(np.argmin(full[i + 1 :])) if not full[i + 1 :].all() else n
            out.append((slice(i, j), *rest))
            i = j
        elif mask.ndim == 1:  # (a 1-D cell is full or empty)
            i += 1
        else:
            inner = _boxes(mask[i], limit - len(out))
            if inner is None:
                return None
            out += [(slice(i, i + 1), *b) for b in inner]
            i += 1
        if len(out) > limit:
            return None
    return out


def _outer_block(spec: RechunkSpec, segments, box, memo: dict) -> tuple[tuple[int, ...], Outer] | None:
    """(lower grid index, `Outer` block) of a rank holding the whole ``box`` of old chunks; None
    if it holds only empty chunks along some axis. ``memo``: factors by (axis, old range), which
    ranks share (slabs: every rank spans the whole of the other axes)."""
    lower, factors = [], []
    for axis, seg in enumerate(segments):
        key = (axis, box[axis].start, box[axis].stop)
        if key not in memo:
            mapped = _axis_map(seg, box[axis])
            if mapped is None:
                memo[key] = None
            else:
                f = _mode_product(np.ones(box[axis].stop - box[axis].start, dtype=np.int64), 0, *mapped[1])
                memo[key] = (mapped[0], f * (spec.itemsize if axis == 0 else 1))
        if memo[key] is None:
            return None
        lower.append(memo[key][0])
        factors.append(memo[key][1])
    return tuple(lower), Outer(tuple(factors))


def _axis_map(seg, old: slice):
    """How one axis maps the old chunks ``old`` (a range of old chunk indices) to new chunks:
    (first new chunk, the `_mode_product` arguments old, new, length, n_new relative to the
    ranges' starts), or None if they hold nothing (only empty chunks). Segments come in
    increasing position, so their old and new chunks never decrease."""
    a, z = np.searchsorted(seg.old, [old.start, old.stop])
    if a == z:
        return None
    new = seg.new[a:z]
    return int(new[0]), (
        seg.old[a:z] - old.start,
        new - new[0],
        seg.stop[a:z] - seg.start[a:z],
        int(new[-1] - new[0] + 1),
    )


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
