"""Pure layouts of a :class:`~dask_redist.planning.plan.Plan` for a reshape-style transport.

A cuFFTMp reshape takes one input box and one output box per rank, both
stored contiguously in symmetric memory, and 4, 8 or 16-byte elements. Two
ways to express a rechunk that way:

Direct
    When each rank's old chunks tile one box and its new chunks tile one box,
    the chunk grids *are* box distributions of the global array: stage the
    local chunks into the input box, reshape, cut the output box into chunks.
    No padding. N-D boxes are folded into 3-D ones by merging adjacent axes
    where every box is contiguous across the pair, and the last axis is
    counted in words of 16, 8 or 4 bytes.

Packed
    Always possible. A virtual (P, W) matrix of words: rank ``s`` packs what
    it sends to rank ``d`` into columns ``[C_d, C_d + W_d)`` of row ``s``; the
    block of ``d`` is as wide as the most any rank sends to ``d``. Input box of
    ``s``: row ``s``; output box of ``d``: column block ``d``. One reshape is
    then an all-to-all. Costs padding where the traffic matrix is uneven;
    widths are rounded up to a few size classes so that repeated rechunks of
    similar geometry reuse a (costly) reshape plan.

Rounds
    Each rank's staging memory (input box plus output box) is bounded by a
    budget. A direct run is cut into slabs of the global array along one axis,
    each round's reshape told its boxes moved to the origin so that slabs of one
    width share one plan; a packed run splits every (src, dst) stream into
    roughly equal parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from dask_redist.planning.boxes import Box, Folded, fold_boxes, rank_boxes
from dask_redist.planning.geometry import PlanError
from dask_redist.planning.plan import Plan, Transfers

# -- direct ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DirectLayout:
    """Every rank stages one input box and receives one output box per round."""

    shape: tuple[int, ...]
    itemsize: int
    in_boxes: tuple[Box | None, ...]
    out_boxes: tuple[Box | None, ...]
    slabs: tuple[Box, ...]  # one slab of the global array per round

    mapping = "direct"

    @property
    def rounds(self) -> int:
        return len(self.slabs)

    def boxes(self, round: int) -> tuple[list[Box], list[Box]]:
        """Input and output box of every rank in one round (empty boxes where none)."""
        slab = self.slabs[round]
        empty = Box(slab.lower, slab.lower)
        ins = [b.intersect(slab) if b is not None else empty for b in self.in_boxes]
        outs = [b.intersect(slab) if b is not None else empty for b in self.out_boxes]
        return ins, outs

    def arena_bytes(self, rank: int) -> int:
        """Staging memory this rank needs: its largest round."""
        return max(
            (i[rank].size + o[rank].size) * self.itemsize
            for i, o in (self.boxes(k) for k in range(self.rounds))
        )

    @cached_property
    def folded(self) -> list[Folded]:
        """Per round, the 3-D word boxes (inputs of all ranks, then outputs)."""
        out = []
        for k in range(self.rounds):
            ins, outs = self.boxes(k)
            allb = ins + outs
            f = fold_boxes(self.shape, [b.lower for b in allb], [b.upper for b in allb], self.itemsize)
            assert f is not None, "direct layouts are only built when they fold"
            out.append(f)
        return out

    @cached_property
    def reshapes(self) -> list[Folded]:
        """Per round, what its reshape is told: `folded` moved to the origin (`Folded.at_origin`),
        so that rounds of one slab width share one reshape plan."""
        return [f.at_origin() for f in self.folded]

    padding = 0


def _slab_rounds(shape, itemsize, in_boxes, out_boxes, budget) -> tuple[Box, ...] | None:
    """Fewest slabs along one axis such that each rank's boxes in a slab fit the budget."""
    ndim = len(shape)
    full = Box((0,) * ndim, tuple(shape))
    need = max(((i.size if i else 0) + (o.size if o else 0)) * itemsize for i, o in zip(in_boxes, out_boxes))
    if need <= budget:
        return (full,)
    best = None
    for axis in range(ndim):
        n = shape[axis]
        r = max(2, math.ceil(need / budget))
        while r <= n:
            cuts = [k * n // r for k in range(r + 1)]
            slabs = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                lo, hi = list(full.lower), list(full.upper)
                lo[axis], hi[axis] = a, b
                slabs.append(Box(tuple(lo), tuple(hi)))
            worst = max(
                ((i.intersect(s).size if i else 0) + (o.intersect(s).size if o else 0)) * itemsize
                for s in slabs
                for i, o in zip(in_boxes, out_boxes)
            )
            if worst <= budget:
                if best is None or len(slabs) < len(best):
                    best = tuple(slabs)
                break
            r = max(r + 1, math.ceil(r * worst / budget))
    return best


def direct_layout(plan: Plan, budget: int, *, allow_empty: bool = True) -> tuple[DirectLayout | None, str]:
    """The direct layout of ``plan`` within ``budget`` bytes per rank, or None and why not."""
    if not plan.boxes:
        return None, "placement is not one box per rank"
    if not plan.needed.all():
        return None, "only part of the output is needed"
    spec = plan.spec
    in_boxes = rank_boxes(spec.old, plan.in_ranks, plan.nranks)
    out_boxes = rank_boxes(spec.new, plan.out_ranks, plan.nranks)
    slabs = _slab_rounds(spec.shape, spec.itemsize, in_boxes, out_boxes, budget)
    if slabs is None:
        return None, "no slab split fits the memory budget"
    layout = DirectLayout(spec.shape, spec.itemsize, tuple(in_boxes), tuple(out_boxes), slabs)
    for k in range(layout.rounds):
        ins, outs = layout.boxes(k)
        if not allow_empty and any(b.size == 0 for b in ins + outs):
            return None, "a rank would have an empty box"
        allb = ins + outs
        if fold_boxes(spec.shape, [b.lower for b in allb], [b.upper for b in allb], spec.itemsize) is None:
            return None, "boxes do not fold into 3-D words"
    return layout, "placement is one box per rank"


# -- packed ----------------------------------------------------------------------------


def size_class(n: int, bits: int) -> int:
    """Round ``n`` up to ``m * 2**e`` with ``m`` of ``bits`` significant bits (0: exact)."""
    if bits <= 0 or n <= (1 << bits):
        return int(n)
    step = 1 << (int(n).bit_length() - bits)
    return -(-int(n) // step) * step


@dataclass(frozen=True, eq=False)
class PackedRound:
    """One all-to-all through a (P, W) word matrix.

    Transfer ``i`` sits in row ``src[i]`` at byte ``columns[dst[i]] * word + offset[i]``.
    """

    transfers: Transfers
    offset: np.ndarray  # byte offset of each transfer inside its (src, dst) segment
    widths: np.ndarray  # words per column block, per destination rank
    word: int

    @cached_property
    def columns(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.widths)]).astype(np.int64)

    @property
    def row_words(self) -> int:
        return int(self.columns[-1])

    def arena_bytes(self, rank: int) -> int:
        nranks = len(self.widths)
        return (self.row_words + nranks * int(self.widths[rank])) * self.word

    @property
    def padding(self) -> int:
        """Bytes moved by the reshape that carry no data."""
        return len(self.widths) * self.row_words * self.word - int(self.transfers.nbytes.sum())


def _pack_round(t: Transfers, nranks: int, word: int, bits: int) -> PackedRound:
    t = t.take(t.canonical_order())
    padded = -(-t.nbytes // word) * word
    # offset of each transfer inside its (src, dst) segment: exclusive cumsum per segment
    seg = t.src * nranks + t.dst
    cum = np.cumsum(padded) - padded
    first = np.searchsorted(seg, seg, side="left")  # canonical order groups segments
    offset = cum - cum[first]
    seg_words = np.zeros((nranks, nranks), dtype=np.int64)
    np.add.at(seg_words, (t.src, t.dst), padded // word)
    widths = np.array([size_class(int(w), bits) for w in seg_words.max(axis=0)], dtype=np.int64)
    widths = np.maximum(widths, 1)  # a column block is never empty
    return PackedRound(t, offset, widths, word)


@dataclass(frozen=True, eq=False)
class PackedLayout:
    packed_rounds: tuple[PackedRound, ...]  # each round's pieces, packed
    word: int

    mapping = "packed"

    @property
    def rounds(self) -> int:
        """How many rounds (as `DirectLayout.rounds`)."""
        return len(self.packed_rounds)

    def arena_bytes(self, rank: int) -> int:
        return max(r.arena_bytes(rank) for r in self.packed_rounds)

    @property
    def padding(self) -> int:
        return sum(r.padding for r in self.packed_rounds)


def packed_word(itemsize: int) -> int:
    """Word of the packed matrix: 16 bytes for 16-byte items, else 8."""
    return 16 if itemsize % 16 == 0 else 8


def packed_layout(plan: Plan, budget: int, *, size_class_bits: int = 4) -> PackedLayout:
    """The packed layout of ``plan`` in as few rounds as fit ``budget`` bytes per rank."""
    nranks, word = plan.nranks, packed_word(plan.spec.itemsize)
    t = plan.transfers
    if len(t) == 0:
        return PackedLayout((_pack_round(t, nranks, word, size_class_bits),), word)
    # smallest budget that can work: one word per segment, each row and column block
    floor = 2 * nranks * word * 2
    if budget < floor:
        raise PlanError(f"memory budget of {budget} bytes is below the minimum of {floor} for {nranks} ranks")
    one = _pack_round(t, nranks, word, size_class_bits)
    if max(one.arena_bytes(r) for r in range(nranks)) <= budget:
        return PackedLayout((one,), word)

    traffic = t.traffic(nranks)
    rounds = max(2, math.ceil(max(one.arena_bytes(r) for r in range(nranks)) / budget))
    while True:
        quota = np.maximum(-(-traffic // rounds), 1)
        quantum = max(word, int(quota[traffic > 0].min()) // 4)
        parts = t.split(quantum)
        parts = parts.take(parts.canonical_order())
        seg = parts.src * nranks + parts.dst
        cum = np.cumsum(parts.nbytes) - parts.nbytes
        first = np.searchsorted(seg, seg, side="left")
        before = cum - cum[first]
        which = np.minimum(before // quota[parts.src, parts.dst], rounds - 1)
        packed = tuple(
            _pack_round(parts.take(which == k), nranks, word, size_class_bits) for k in range(rounds)
        )
        worst = max(p.arena_bytes(r) for p in packed for r in range(nranks))
        if worst <= budget:
            return PackedLayout(packed, word)
        if rounds * t.itemsize >= int(traffic.max()):
            # every round already holds at most one part (one item, or up to a word) per stream
            raise PlanError(f"cannot fit the rechunk into a memory budget of {budget} bytes per rank")
        rounds = max(rounds + 1, math.ceil(rounds * worst / budget))


def choose_layout(
    plan: Plan, budget: int, *, size_class_bits: int = 4, allow_empty: bool = True
) -> tuple[DirectLayout | PackedLayout, str]:
    """Direct when the placement allows it, else packed; with the reason."""
    direct, why = direct_layout(plan, budget, allow_empty=allow_empty)
    if direct is not None:
        return direct, why
    return packed_layout(plan, budget, size_class_bits=size_class_bits), why


__all__ = [
    "Box",
    "DirectLayout",
    "Folded",
    "PackedLayout",
    "PackedRound",
    "choose_layout",
    "direct_layout",
    "fold_boxes",
    "packed_layout",
    "rank_boxes",
    "size_class",
]
