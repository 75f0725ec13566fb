"""Hypothesis strategies and NumPy simulators for the planner and layout tests.

The simulators carry out a plan or a layout on NumPy arrays the way the
runtime would, but on *byte ids*: an array of ``shape + (itemsize,)`` that
numbers every byte of the (C-ordered) global array, so no two bytes look
alike and a byte that lands in the wrong place cannot go unnoticed. Each
output element also counts how often it was written: exactly once for the
needed chunks, never for the others.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dask_redist.planning.boxes import Box
from dask_redist.planning.layout import DirectLayout, PackedLayout
from dask_redist.planning import Chunks, Plan, RechunkSpec, Transfers, make_plan
from dask_redist.planning.geometry import chunk_nbytes

ITEMSIZES = (1, 2, 4, 8, 16)
MAX_RANKS = 6
MAX_CHUNKS = 300  # about the most chunks of a grid, so that examples stay fast

FAST = settings(max_examples=150, deadline=None)
QUICK = settings(max_examples=50, deadline=None)  # for the simpler properties


# -- strategies ------------------------------------------------------------------------


@st.composite
def chunking(draw, n: int, max_chunks: int = 7) -> tuple[int, ...]:
    """Chunks of an axis of length ``n``: regular as dask makes them, or uneven, possibly with zeros."""
    if n and draw(st.booleans()):
        size = draw(st.integers(-(-n // max_chunks), n))
        return (size,) * (n // size) + ((n % size,) if n % size else ())
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=max_chunks - 1)))
    return tuple(b - a for a, b in pairwise([0, *cuts, n]))


@st.composite
def shapes(draw, max_elements: int = 4096, max_ndim: int = 5) -> tuple[int, ...]:
    """1-D to ``max_ndim``-D shapes of at most ``max_elements`` elements, zero-length axes included."""
    ndim = draw(st.integers(1, max_ndim))
    side = int(max_elements ** (1 / ndim) + 1e-9)
    return tuple(draw(st.lists(st.integers(0, side), min_size=ndim, max_size=ndim)))


@st.composite
def rechunk_specs(draw, max_elements: int = 4096) -> RechunkSpec:
    shape = draw(shapes(max_elements))
    max_chunks = min(10, max(2, int(MAX_CHUNKS ** (1 / len(shape)))))  # per axis, per grid
    old = tuple(draw(chunking(n, max_chunks)) for n in shape)
    new = tuple(draw(chunking(n, max_chunks)) for n in shape)
    return RechunkSpec(old, new, draw(st.sampled_from(ITEMSIZES)))


def random_placements(grid: tuple[int, ...], nranks: int):
    """Any rank for every chunk of ``grid``, often from only a few of the ranks."""
    return st.integers(1, nranks).flatmap(
        lambda used: arrays(np.int64, grid, elements=st.integers(0, used - 1))
    )


@st.composite
def box_placements(draw, chunks: Chunks, nranks: int) -> np.ndarray:
    """A rank for every chunk such that each rank's non-empty chunks tile one box.

    The chunk grid is cut recursively into at most ``nranks`` boxes, which go to
    distinct ranks; empty chunks may go to any rank.
    """
    grid = tuple(len(c) for c in chunks)
    boxes = [tuple((0, g) for g in grid)]
    while len(boxes) < nranks and draw(st.booleans()):
        splittable = [i for i, b in enumerate(boxes) if any(hi - lo > 1 for lo, hi in b)]
        if not splittable:
            break
        box = list(boxes.pop(draw(st.sampled_from(splittable))))
        axis = draw(st.sampled_from([a for a, (lo, hi) in enumerate(box) if hi - lo > 1]))
        lo, hi = box[axis]
        cut = draw(st.integers(lo + 1, hi - 1))
        boxes.append((*box[:axis], (lo, cut), *box[axis + 1 :]))
        boxes.append((*box[:axis], (cut, hi), *box[axis + 1 :]))
    ranks = draw(st.permutations(range(nranks)))
    out = np.empty(grid, dtype=np.int64)
    for box, rank in zip(boxes, ranks):
        out[tuple(slice(lo, hi) for lo, hi in box)] = rank
    empty = chunk_nbytes(chunks, 1) == 0
    if empty.any() and draw(st.booleans()):
        out[empty] = draw(arrays(np.int64, int(empty.sum()), elements=st.integers(0, nranks - 1)))
    return out


@st.composite
def needed_masks(draw, grid: tuple[int, ...]) -> np.ndarray:
    """Which new chunks are needed: any few or many of them, or a slice of them along one axis."""
    mask = np.zeros(grid, dtype=bool)
    if draw(st.booleans()):
        count = draw(st.integers(0, mask.size))
        mask.flat[list(draw(st.permutations(range(mask.size)))[:count])] = True
    else:
        axis = draw(st.integers(0, len(grid) - 1))
        lo = draw(st.integers(0, grid[axis] - 1))
        hi = draw(st.integers(lo + 1, grid[axis]))
        mask[(slice(None),) * axis + (slice(lo, hi),)] = True
    return mask


@st.composite
def plans(
    draw,
    *,
    max_elements: int = 4096,
    owners: str | None = None,
    partial: bool = False,
    boxes: bool | None = False,
) -> Plan:
    """Plans of rechunks on 1 to ``MAX_RANKS`` ranks.

    ``owners`` is "given" (drawn here), "chosen" (by the planner) or None for either;
    ``partial`` draws which new chunks are needed; ``boxes`` draws box placements
    (None: sometimes).
    """
    spec = draw(rechunk_specs(max_elements))
    nranks = draw(st.integers(1, MAX_RANKS))
    if boxes is None:
        boxes = draw(st.booleans())
    place = (
        (lambda c: box_placements(c, nranks))
        if boxes
        else (lambda c: random_placements(tuple(map(len, c)), nranks))
    )
    in_ranks = draw(place(spec.old))
    if owners is None:
        owners = draw(st.sampled_from(["given", "chosen"]))
    out_ranks = draw(place(spec.new)) if owners == "given" else None
    needed = draw(needed_masks(spec.new_grid)) if partial else None
    return make_plan(spec, in_ranks, nranks, out_ranks=out_ranks, needed=needed)


# -- simulators ------------------------------------------------------------------------


def byte_ids(shape: tuple[int, ...], itemsize: int) -> np.ndarray:
    """The bytes of a C-ordered array of ``shape`` and ``itemsize``, numbered: ``shape + (itemsize,)``."""
    return np.arange(math.prod(shape) * itemsize, dtype=np.int64).reshape(*shape, itemsize)


def chunk_box(chunks: Chunks, index: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Global (lower, upper) element bounds of the chunk at ``index``: sums, the oracle for RechunkSpec.old_box/new_box."""
    lower, upper = [], []
    for c, i in zip(chunks, index):
        start = sum(c[:i])
        lower.append(start)
        upper.append(start + c[i])
    return tuple(lower), tuple(upper)


def chunk_boxes(chunks: Chunks) -> list[Box]:
    """The box of every chunk, in flat (C-order) chunk index order."""
    return [Box(*chunk_box(chunks, index)) for index in np.ndindex(*map(len, chunks))]


class InputChunks:
    """The old chunks of ``data``, in flat chunk index order."""

    def __init__(self, spec: RechunkSpec, data: np.ndarray):
        self.boxes = chunk_boxes(spec.old)
        self.chunks = [data[box.slices()].copy() for box in self.boxes]

    def piece(self, t: Transfers, i: int) -> np.ndarray:
        """Transfer ``i`` cut from its old chunk; it must be a non-empty box inside that chunk."""
        box, chunk = Box(tuple(t.lo[i].tolist()), tuple(t.hi[i].tolist())), self.boxes[int(t.old_block[i])]
        assert box.size > 0 and box.shape == tuple((t.hi[i] - t.lo[i]).tolist()), box
        assert box.intersect(chunk) == box, f"{box} is not inside its old chunk {chunk}"
        return self.chunks[int(t.old_block[i])][box.slices(chunk.lower)]


class OutputChunks:
    """The new chunks being filled, with a count of the writes into every element."""

    def __init__(self, spec: RechunkSpec):
        self.spec = spec
        self.boxes = chunk_boxes(spec.new)
        self.chunks = [np.full((*b.shape, spec.itemsize), -1, dtype=np.int64) for b in self.boxes]
        self.writes = [np.zeros(b.shape, dtype=np.int64) for b in self.boxes]

    def write(self, block: int, lower, upper, values: np.ndarray) -> None:
        """Write ``values`` (global bounds ``lower``/``upper``) into new chunk ``block``."""
        box, chunk = Box(tuple(map(int, lower)), tuple(map(int, upper))), self.boxes[int(block)]
        assert box.intersect(chunk) == box, f"{box} is not inside its new chunk {chunk}"
        assert values.shape == (*box.shape, self.spec.itemsize), (values.shape, box)
        self.chunks[int(block)][box.slices(chunk.lower)] = values
        self.writes[int(block)][box.slices(chunk.lower)] += 1

    def check(self, data: np.ndarray, needed: np.ndarray) -> None:
        """Needed chunks are ``data``'s slices, every element written once; the others untouched."""
        for block, (box, chunk, writes) in enumerate(zip(self.boxes, self.chunks, self.writes)):
            if needed.ravel()[block]:
                assert np.all(writes == 1), f"new chunk {block}: elements written {np.unique(writes)} times"
                np.testing.assert_array_equal(chunk, data[box.slices()])
            else:
                assert not writes.any(), f"new chunk {block} is not needed but was written"


def simulate_transfers(spec: RechunkSpec, transfers: Transfers, data: np.ndarray) -> OutputChunks:
    """Move every transfer straight from its old chunk into its new chunk."""
    inputs, out = InputChunks(spec, data), OutputChunks(spec)
    for i in range(len(transfers)):
        out.write(transfers.new_block[i], transfers.lo[i], transfers.hi[i], inputs.piece(transfers, i))
    return out


def assert_tiles(outer: Box, parts: list[Box], what: str) -> None:
    """Every element of ``outer`` lies in exactly one of ``parts``, and nothing outside it."""
    writes = np.zeros(outer.shape, dtype=np.int64)
    for part in parts:
        if part.size:
            assert part.intersect(outer) == part, f"{what}: {part} is not inside {outer}"
            writes[part.slices(outer.lower)] += 1
    assert np.all(writes == 1), f"{what} do not tile {outer}"


def simulate_direct(plan: Plan, layout: DirectLayout, data: np.ndarray) -> OutputChunks:
    """Run a direct layout: per round, stage input boxes, reshape, cut the output boxes into chunks."""
    spec = plan.spec
    inputs, out = InputChunks(spec, data), OutputChunks(spec)
    for k in range(layout.rounds):
        ins, outs = layout.boxes(k)
        assert_tiles(layout.slabs[k], ins, f"round {k}: input boxes")
        assert_tiles(layout.slabs[k], outs, f"round {k}: output boxes")
        reshaped = np.full(data.shape, -1, dtype=np.int64)
        for rank, box in enumerate(ins):
            # stage the rank's old chunks, cut to its input box, in one C-ordered buffer
            held = [
                (b, inputs.boxes[b].intersect(box)) for b in np.flatnonzero(plan.in_ranks.ravel() == rank)
            ]
            assert_tiles(box, [part for _, part in held], f"round {k}: rank {rank}'s old chunks")
            staged = np.full((*box.shape, spec.itemsize), -1, dtype=np.int64)
            for b, part in held:
                if part.size:
                    staged[part.slices(box.lower)] = inputs.chunks[b][part.slices(inputs.boxes[b].lower)]
            reshaped[box.slices()] = staged
        for rank, box in enumerate(outs):
            received = reshaped[box.slices()]
            owned = [(b, out.boxes[b].intersect(box)) for b in np.flatnonzero(plan.out_ranks.ravel() == rank)]
            assert_tiles(box, [part for _, part in owned], f"round {k}: rank {rank}'s new chunks")
            for b, part in owned:
                if part.size:
                    out.write(b, part.lower, part.upper, received[part.slices(box.lower)])
    return out


def simulate_packed(plan: Plan, layout: PackedLayout, data: np.ndarray) -> OutputChunks:
    """Run a packed layout: fill a (P, W) byte matrix per round, hand out column blocks, unpack."""
    spec, nranks = plan.spec, plan.nranks
    inputs, out = InputChunks(spec, data), OutputChunks(spec)
    for r in layout.packed_rounds:
        t, word = r.transfers, r.word
        rows = np.full((nranks, r.row_words * word), -1, dtype=np.int64)
        row_writes = np.zeros(rows.shape, dtype=np.int64)
        for i in range(len(t)):
            src, dst, offset, nbytes = int(t.src[i]), int(t.dst[i]), int(r.offset[i]), int(t.nbytes[i])
            assert 0 <= offset and offset + nbytes <= r.widths[dst] * word, "transfer leaves its column block"
            start = int(r.columns[dst]) * word + offset
            rows[src, start : start + nbytes] = inputs.piece(t, i).ravel()
            row_writes[src, start : start + nbytes] += 1
        assert row_writes.max(initial=0) <= 1, "transfers overlap in the packed matrix"
        for dst in range(nranks):
            block = rows[:, r.columns[dst] * word : r.columns[dst + 1] * word]  # what dst receives
            for i in np.flatnonzero(t.dst == dst):
                offset, nbytes = int(r.offset[i]), int(t.nbytes[i])
                values = block[t.src[i], offset : offset + nbytes]
                out.write(
                    t.new_block[i], t.lo[i], t.hi[i], values.reshape(*(t.hi[i] - t.lo[i]), spec.itemsize)
                )
    return out
