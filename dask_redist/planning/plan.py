"""Pure planning of a collective rechunk: which bytes go where.

This module imports nothing from dask, distributed or any GPU library; it is
plain NumPy on chunk tuples, so it is property-tested on its own and runs the
same on the client (``explain``), on the scheduler (choosing owners) and on
every worker (each rank derives its share of the plan locally).

Algorithm
---------
A rechunk from chunk grid ``old`` to chunk grid ``new`` is a set of *pieces*:
the non-empty boxes ``old_chunk ∩ new_chunk``. Along one axis two chunkings
intersect in *segments* (the runs between consecutive boundaries of either
chunking); every segment lies in exactly one old and one new chunk. Chunk
grids are tensor products of their axes, so the pieces are exactly the
Cartesian product of the per-axis segments. They are kept as index arrays,
not objects: a rechunk of 10,000 chunks into 10,000 others has a few tens of
thousands of pieces and planning it stays vectorized.

The *placement* says which rank holds each old chunk (known only at run time,
when the stage tasks have run). The planner then picks an *owner* for every
new chunk. Owners must be balanced (the output is what the user computes on
next) and should keep bytes local. Candidates:

* recursive bisection of the new chunk grid into one box per rank (boxes are
  what the direct cuFFTMp mapping needs), tried with each axis as the first
  cut, then matched to ranks greedily by the bytes each rank already holds;
* a greedy assignment of each new chunk to the rank holding most of its
  bytes, under a load cap.

Among the candidates within 10% of the best balance, the one that moves the
fewest bytes across ranks wins; near-ties go to box-shaped candidates.

Owners are chosen in :mod:`dask_redist.planning.owners`. The result is a :class:`Plan`: pieces with a source and destination rank,
the traffic matrix and a short report. How the plan is laid out for a
particular transport (boxes, a packed word matrix, rounds) lives in
:mod:`dask_redist.planning.layout`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import numpy as np

from dask_redist.planning.geometry import PlanError, RechunkSpec, axis_segments, chunk_nbytes
from dask_redist.planning.local import Local, local_bytes
from dask_redist.planning.owners import choose_owners, is_box_placement


@dataclass(frozen=True, eq=False)
class Transfers:
    """Boxes of the global array moving from a source rank to a destination rank.

    A transfer is a piece ``old_chunk ∩ new_chunk``, or part of one when a run is
    split into rounds. ``lo``/``hi`` are global element bounds, shape (n, ndim);
    ``old_block``/``new_block`` are flat (C-order) chunk indices.
    """

    src: np.ndarray
    dst: np.ndarray
    old_block: np.ndarray
    new_block: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    itemsize: int

    def __len__(self) -> int:
        return len(self.src)

    @cached_property
    def nbytes(self) -> np.ndarray:
        return box_volumes(self.lo, self.hi) * self.itemsize

    def take(self, index) -> Transfers:
        return Transfers(
            self.src[index],
            self.dst[index],
            self.old_block[index],
            self.new_block[index],
            self.lo[index],
            self.hi[index],
            self.itemsize,
        )

    def traffic(self, nranks: int) -> np.ndarray:
        """Bytes sent from rank s to rank d, as an (nranks, nranks) matrix."""
        flat = np.bincount(self.src * nranks + self.dst, weights=self.nbytes, minlength=nranks * nranks)
        return flat.astype(np.int64).reshape(nranks, nranks)

    def canonical_order(self) -> np.ndarray:
        """Order by (src, dst, new chunk, position): the order both ends agree on."""
        keys = [self.lo[:, a] for a in range(self.lo.shape[1] - 1, -1, -1)]
        return np.lexsort(keys + [self.old_block, self.new_block, self.dst, self.src])

    def split(self, max_bytes: int) -> Transfers:
        """Cut every box larger than ``max_bytes`` into boxes of at most that size.

        A box is cut along its outermost axis with more than one element into slabs of as
        many rows as fit; a one-row slab still too big is cut along its next axis, and so
        on, so the parts stay boxes; a single element is never cut. Vectorized: one pass
        per axis, whatever the number of boxes (a packed layout in rounds splits every piece).
        """
        max_bytes = max(int(max_bytes), self.itemsize)
        big = self.nbytes > max_bytes
        if not big.any():
            return self
        done, todo = self.take(~big), self.take(big)
        parts = [done]
        while len(todo):
            ext = todo.hi - todo.lo
            axis = np.argmax(ext > 1, axis=1)  # outermost axis longer than one
            rows = np.take_along_axis(ext, axis[:, None], axis=1)[:, 0]
            row_bytes = todo.nbytes // rows
            per = np.maximum(1, max_bytes // row_bytes)  # rows per slab
            count = -(-rows // per)
            which = np.repeat(np.arange(len(todo)), count)
            k = np.arange(len(which)) - np.repeat(np.cumsum(count) - count, count)
            lo, hi = todo.lo[which].copy(), todo.hi[which].copy()
            a, start = axis[which], todo.lo[which, axis[which]]
            lo[np.arange(len(which)), a] = start + k * per[which]
            hi[np.arange(len(which)), a] = np.minimum(start + (k + 1) * per[which], todo.hi[which, a])
            cut = Transfers(
                todo.src[which],
                todo.dst[which],
                todo.old_block[which],
                todo.new_block[which],
                lo,
                hi,
                self.itemsize,
            )
            still = cut.nbytes > max_bytes  # one row of more than max_bytes: on to the next axis
            parts.append(cut.take(~still))
            todo = cut.take(still)
        return concat_transfers(parts)


def box_volumes(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Elements in each box [lo, hi) (rows); a column loop: numpy's product over a short axis is slow."""
    out = np.ones(len(lo), dtype=np.int64)
    for column in (hi - lo).T:
        out *= column
    return out


def concat_transfers(parts: Sequence[Transfers]) -> Transfers:
    return Transfers(
        *(
            np.concatenate([getattr(p, f) for p in parts])
            for f in ("src", "dst", "old_block", "new_block", "lo", "hi")
        ),
        parts[0].itemsize,
    )


def pieces(spec: RechunkSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All pieces of a rechunk: (old_block, new_block, lo, hi), flat indices and bounds, in C order
    over the grid of per-axis segments. Each column is one axis's segment values broadcast over
    that grid (no index grid gathered from, no (n, ndim) array stacked)."""
    axes = [axis_segments(o, n) for o, n in zip(spec.old, spec.new)]
    counts = [len(a) for a in axes]
    total = math.prod(counts)
    ndim = spec.ndim
    lo, hi = np.empty((total, ndim), np.int64), np.empty((total, ndim), np.int64)
    old_flat, new_flat = np.zeros(counts, np.int64), np.zeros(counts, np.int64)
    lo_grid, hi_grid = lo.reshape(*counts, ndim), hi.reshape(*counts, ndim)
    old_stride, new_stride = 1, 1
    for axis in range(ndim - 1, -1, -1):  # flat chunk indices: C order over the chunk grids
        a, shape = axes[axis], [1] * ndim
        shape[axis] = counts[axis]
        old_flat += (a.old * old_stride).reshape(shape)
        new_flat += (a.new * new_stride).reshape(shape)
        lo_grid[..., axis] = a.start.reshape(shape)
        hi_grid[..., axis] = a.stop.reshape(shape)
        old_stride *= spec.old_grid[axis]
        new_stride *= spec.new_grid[axis]
    return old_flat.reshape(total), new_flat.reshape(total), lo, hi


# -- the plan -------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Plan:
    """Where every byte of a rechunk comes from and goes to, for ``nranks`` ranks.

    ``in_ranks``/``out_ranks`` are shaped like the old and new chunk grids.
    ``needed`` marks the new chunks somebody asked for; only they are moved.
    """

    spec: RechunkSpec
    nranks: int
    in_ranks: np.ndarray
    out_ranks: np.ndarray
    needed: np.ndarray
    owner_strategy: str = "given"
    chosen_with: Local | None = field(repr=False, default=None)  # the local bytes the owners were chosen on

    @cached_property
    def local(self) -> Local:
        """Bytes of each needed new chunk that each rank holds (computed when first asked: a rank
        re-deriving its plan needs the boxes and owners, not this)."""
        if self.chosen_with is not None:
            return self.chosen_with
        return local_bytes(self.spec, self.in_ranks, self.nranks, self.needed)

    @cached_property
    def transfers(self) -> Transfers:
        """Every piece with its ranks: enumerated only when a transport moves pieces (a rechunk
        across the grid has n_old x n_new of them; everything else here is computed without)."""
        old_flat, new_flat, lo, hi = pieces(self.spec)
        if not self.needed.all():
            keep = self.needed.ravel()[new_flat]
            old_flat, new_flat, lo, hi = old_flat[keep], new_flat[keep], lo[keep], hi[keep]
        src, dst = self.in_ranks.ravel()[old_flat], self.out_ranks.ravel()[new_flat]
        return Transfers(src, dst, old_flat, new_flat, lo, hi, self.spec.itemsize)

    @cached_property
    def traffic(self) -> np.ndarray:
        """Bytes sent from rank s to rank d, as an (nranks, nranks) matrix."""
        return self.local.traffic(self.out_ranks.ravel())

    @property
    def nbytes(self) -> int:
        return self.local.total

    @cached_property
    def piece_count(self) -> int:
        """How many pieces the needed chunks have (counted per axis, not enumerated)."""
        per_axis = [
            np.bincount(axis_segments(o, n).new, minlength=len(n))
            for o, n in zip(self.spec.old, self.spec.new)
        ]
        counts = functools.reduce(np.multiply.outer, per_axis) if per_axis else np.ones(())
        return int(counts[self.needed].sum())

    @property
    def moved_bytes(self) -> int:
        """Bytes that cross from one rank to another."""
        t = self.traffic
        return int(t.sum() - np.trace(t))

    @cached_property
    def out_bytes(self) -> np.ndarray:
        """Bytes each rank owns after the rechunk (needed chunks only)."""
        sizes = chunk_nbytes(self.spec.new, self.spec.itemsize).ravel()
        return np.bincount(
            self.out_ranks.ravel()[self.needed.ravel()],
            weights=sizes[self.needed.ravel()],
            minlength=self.nranks,
        ).astype(np.int64)

    @property
    def imbalance(self) -> float:
        """Largest rank's output over the mean (1.0 is perfectly balanced)."""
        total = self.out_bytes.sum()
        return float(self.out_bytes.max() * self.nranks / total) if total else 1.0

    @cached_property
    def boxes(self) -> bool:
        """Inputs and outputs both tile one box per rank: the direct mapping applies."""
        return is_box_placement(self.spec.old, self.in_ranks, self.nranks) and is_box_placement(
            self.spec.new, np.where(self.needed, self.out_ranks, -1), self.nranks
        )

    def sends(self, rank: int) -> Transfers:
        """What ``rank`` sends (its local pieces included), in canonical order."""
        t = self.transfers.take(self.transfers.src == rank)
        return t.take(t.canonical_order())

    def receives(self, rank: int) -> Transfers:
        """What ``rank`` receives (its local pieces included), in canonical order."""
        t = self.transfers.take(self.transfers.dst == rank)
        return t.take(t.canonical_order())

    def owned(self, rank: int) -> list[int]:
        """Flat indices of the needed new chunks that ``rank`` owns."""
        return np.flatnonzero((self.out_ranks == rank) & self.needed).tolist()

    def summary(self) -> dict:
        t = self.traffic
        return {
            "ranks": self.nranks,
            "old chunks": math.prod(self.spec.old_grid),
            "new chunks": math.prod(self.spec.new_grid),
            "pieces": self.piece_count,
            "bytes": self.nbytes,
            "bytes moved between ranks": self.moved_bytes,
            "largest send by one rank": int((t.sum(axis=1) - np.diag(t)).max(initial=0)),
            "owners": self.owner_strategy,
            "output imbalance": round(self.imbalance, 3),
            "box-shaped": self.boxes,
        }


def make_plan(
    spec: RechunkSpec,
    in_ranks: np.ndarray | Sequence,
    nranks: int,
    *,
    out_ranks: np.ndarray | None = None,
    needed: np.ndarray | None = None,
) -> Plan:
    """Plan a rechunk given which rank holds each old chunk.

    Owners of the new chunks are chosen here unless ``out_ranks`` is given.
    """
    if not isinstance(nranks, (int, np.integer)) or nranks < 1:
        raise PlanError(f"nranks must be a positive integer, got {nranks!r}")
    in_ranks = np.asarray(in_ranks, dtype=np.int64).reshape(spec.old_grid)
    if in_ranks.size and (in_ranks.min() < 0 or in_ranks.max() >= nranks):
        raise PlanError(f"input ranks must lie in [0, {nranks}), got {in_ranks.min()}..{in_ranks.max()}")
    needed = (
        np.ones(spec.new_grid, dtype=bool)
        if needed is None
        else np.asarray(needed, dtype=bool).reshape(spec.new_grid)
    )
    local, strategy = None, "given"
    if out_ranks is None and nranks == 1:  # (a world of one: nothing to choose, no bytes to count)
        out_ranks, strategy = np.zeros(spec.new_grid, dtype=np.int64), "one rank"
    elif out_ranks is None:
        local = local_bytes(spec, in_ranks, int(nranks), needed)
        out_ranks, strategy = choose_owners(spec, local, needed, nranks)
    else:
        out_ranks = np.asarray(out_ranks, dtype=np.int64).reshape(spec.new_grid)
        if out_ranks.size and (out_ranks.min() < 0 or out_ranks.max() >= nranks):
            raise PlanError(f"output ranks must lie in [0, {nranks})")
    return Plan(spec, int(nranks), in_ranks, out_ranks, needed, strategy, local)
