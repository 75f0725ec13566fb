"""Property tests of :mod:`dask_redist.planning.layout`, checked against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings, target
from hypothesis import strategies as st
from planning_helpers import FAST, ITEMSIZES, QUICK, byte_ids, plans, shapes, simulate_direct, simulate_packed

from dask_redist.planning.boxes import WORDS, Box, fold_boxes
from dask_redist.planning.layout import (
    DirectLayout,
    PackedLayout,
    choose_layout,
    direct_layout,
    packed_layout,
    packed_word,
    size_class,
)
from dask_redist.planning import PlanError, RechunkSpec, make_plan


def check_folded(shape, itemsize, boxes: list[Box], folded) -> None:
    """The 3-D word boxes select the same bytes, in the same order, as the N-D boxes."""
    assert folded is not None
    assert len(folded.shape) == 3 and folded.word in WORDS
    assert folded.lower.shape == folded.upper.shape == (len(boxes), 3)
    data = byte_ids(shape, itemsize)
    words = data.reshape(*folded.shape, folded.word)  # the same bytes, as 3-D words
    for box, lo, hi in zip(boxes, folded.lower, folded.upper):
        selected = words[tuple(slice(a, b) for a, b in zip(lo, hi))]
        np.testing.assert_array_equal(selected.ravel(), data[box.slices()].ravel(), err_msg=str(box))


def check_at_origin(shape, itemsize, folded, moved) -> None:
    """``moved`` is ``folded`` moved by one offset to the origin: each box selects the same
    words of the bounding box of them all as of the whole array (what a reshape moves)."""
    nonempty = np.all(folded.upper > folded.lower, axis=1)
    assert moved.word == folded.word
    assert np.array_equal(np.all(moved.upper > moved.lower, axis=1), nonempty)
    assert not moved.lower[~nonempty].any() and not moved.upper[~nonempty].any()
    if not nonempty.any():
        return
    assert moved.lower.min() == 0 and np.array_equal(moved.upper.max(axis=0), moved.shape)
    words = byte_ids(shape, itemsize).reshape(*folded.shape, folded.word)
    origin = folded.lower[nonempty].min(axis=0)
    bounding = words[tuple(slice(o, o + n) for o, n in zip(origin, moved.shape))]
    for i in np.flatnonzero(nonempty):
        there = words[tuple(slice(a, b) for a, b in zip(folded.lower[i], folded.upper[i]))]
        here = bounding[tuple(slice(a, b) for a, b in zip(moved.lower[i], moved.upper[i]))]
        np.testing.assert_array_equal(here, there)


# -- direct ------------------------------------------------------------------------------


@FAST
@given(plans(boxes=True), st.data())
def test_direct_layout_moves_every_element(plan, data):
    spec = plan.spec
    budget = data.draw(st.integers(max(1, spec.nbytes // 32), 2 * spec.nbytes + 64), label="budget")
    layout, why = direct_layout(plan, budget)
    event(why)
    if layout is None:
        return
    assert layout.rounds >= 1 and layout.padding == 0
    assert all(layout.arena_bytes(r) <= budget for r in range(plan.nranks))
    ids = byte_ids(spec.shape, spec.itemsize)
    simulate_direct(plan, layout, ids).check(ids, plan.needed)
    for k in range(layout.rounds):
        ins, outs = layout.boxes(k)
        check_folded(spec.shape, spec.itemsize, ins + outs, layout.folded[k])
        check_at_origin(spec.shape, spec.itemsize, layout.folded[k], layout.reshapes[k])
    strict, _ = direct_layout(plan, budget, allow_empty=False)
    for k in range(strict.rounds if strict is not None else 0):
        ins, outs = strict.boxes(k)
        assert all(b.size > 0 for b in ins + outs)


def test_direct_layout_of_a_simple_split():
    spec = RechunkSpec(((4, 4), (6,)), ((2, 2, 2, 2), (3, 3)), 8)
    plan = make_plan(spec, [[0], [1]], 2, out_ranks=[[0, 0], [0, 0], [1, 1], [1, 1]])
    for budget in (10_000, 300, 100):
        layout, why = direct_layout(plan, budget)
        assert isinstance(layout, DirectLayout), why
        assert all(layout.arena_bytes(r) <= budget for r in range(2))
        ids = byte_ids(spec.shape, spec.itemsize)
        simulate_direct(plan, layout, ids).check(ids, plan.needed)
    assert direct_layout(plan, 10_000)[0].rounds == 1
    assert direct_layout(plan, 100)[0].rounds > 1


@pytest.mark.parametrize("nranks", [4, 8])
def test_rounds_of_one_slab_width_share_one_reshape_plan(nranks):
    """Slabs to slabs in rounds of one slab width (the GPU suite's 1 GiB in 1 MiB rounds, here
    scaled down): every round's reshape is told the same boxes, so one plan serves them all.
    (Told the boxes where they lie, 4 PEs made 512 plans, collectively, before the first round.)"""
    spec = RechunkSpec(((8,) * 8, (64,), (64,)), ((64,), (8,) * 8, (64,)), 8)
    plan = make_plan(spec, [i * nranks // 8 for i in range(8)], nranks)
    layout, why = choose_layout(plan, 2 * 64 * 64 * 64 * 8 // nranks // 8, allow_empty=False)
    assert isinstance(layout, DirectLayout) and layout.rounds == 8, (why, layout.rounds)
    geometries = {
        (f.word, f.lower.tobytes(), f.upper.tobytes()) for f in (layout.reshapes[k] for k in range(8))
    }
    assert len(geometries) == 1
    ids = byte_ids(spec.shape, spec.itemsize)
    simulate_direct(plan, layout, ids).check(ids, plan.needed)


def test_direct_layout_needs_box_placements_and_the_whole_output():
    spec = RechunkSpec(((2, 2, 2),), ((3, 3),), 8)
    assert direct_layout(make_plan(spec, [0, 1, 0], 2), 10_000)[0] is None
    plan = make_plan(spec, [0, 0, 1], 2, needed=[True, False])
    assert direct_layout(plan, 10_000)[0] is None


@st.composite
def boxes_in(draw, shape) -> list[Box]:
    """Boxes of ``shape``, some empty, often spanning whole axes (so that they fold)."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        lower, upper = [], []
        for n in shape:
            if draw(st.booleans()):
                lo, hi = 0, n
            else:
                lo = draw(st.integers(0, n))
                hi = draw(st.integers(lo, n))
            lower.append(lo)
            upper.append(hi)
        out.append(Box(tuple(lower), tuple(upper)))
    return out


@FAST
@given(shapes().flatmap(lambda s: st.tuples(st.just(s), boxes_in(s))), st.sampled_from(ITEMSIZES))
def test_fold_boxes_selects_the_same_bytes(shape_boxes, itemsize):
    shape, boxes = shape_boxes
    folded = fold_boxes(shape, [b.lower for b in boxes], [b.upper for b in boxes], itemsize)
    event("folds" if folded is not None else "does not fold")
    if folded is not None:
        check_folded(shape, itemsize, boxes, folded)
    # the whole array folds into one axis whenever its bytes are whole words
    whole = Box((0,) * len(shape), tuple(shape))
    total = int(np.prod(shape)) * itemsize
    assert (fold_boxes(shape, [whole.lower], [whole.upper], itemsize) is not None) == (total % WORDS[-1] == 0)


# -- packed ------------------------------------------------------------------------------


def budget_floor(plan) -> int:
    """The smallest budget ``packed_layout`` documents it can meet: a word per segment, twice."""
    return 2 * plan.nranks * packed_word(plan.spec.itemsize) * 2


@settings(max_examples=100, deadline=None)
@given(plans(max_elements=512, partial=True), st.integers(0, 5), st.data())
def test_packed_layout_moves_every_element(plan, bits, data):
    spec, word, floor = plan.spec, packed_word(plan.spec.itemsize), budget_floor(plan)
    budget = data.draw(
        st.integers(floor, 3 * floor) | st.integers(floor, floor + 4 * plan.nbytes), label="budget"
    )
    layout = packed_layout(plan, budget, size_class_bits=bits)
    event(f"{min(layout.rounds, 3)}{'+' if layout.rounds > 2 else ''} rounds")
    assert isinstance(layout, PackedLayout) and layout.word == word
    assert all(layout.arena_bytes(r) <= budget for r in range(plan.nranks))
    assert layout.padding >= 0
    for r in layout.packed_rounds:
        assert r.word == word and len(r.widths) == plan.nranks and np.all(r.widths >= 1)
        assert r.padding >= 0
        np.testing.assert_array_equal(r.transfers.src, plan.in_ranks.ravel()[r.transfers.old_block])
        np.testing.assert_array_equal(r.transfers.dst, plan.out_ranks.ravel()[r.transfers.new_block])
    ids = byte_ids(spec.shape, spec.itemsize)
    simulate_packed(plan, layout, ids).check(ids, plan.needed)


@settings(max_examples=100, deadline=None)
@given(plans(max_elements=256), st.data())
def test_packed_layout_fits_budgets_near_the_floor(plan, data):
    floor = budget_floor(plan)
    budget = data.draw(st.integers(floor, 3 * floor), label="budget")
    layout = packed_layout(plan, budget)
    target(float(layout.rounds), label="rounds")
    assert all(layout.arena_bytes(r) <= budget for r in range(plan.nranks))


def test_packed_layout_fits_every_budget_from_the_floor():
    # a hundred 1-byte pieces, each padded to a word: it takes far more rounds than bytes // word
    spec = RechunkSpec(((1,) * 100,), ((100,),), 1)
    plan = make_plan(spec, [0] * 100, 1)
    ids = byte_ids(spec.shape, spec.itemsize)
    for budget in range(32, 200, 3):
        layout = packed_layout(plan, budget)
        assert layout.arena_bytes(0) <= budget
        simulate_packed(plan, layout, ids).check(ids, plan.needed)


def test_packed_layout_rejects_a_budget_that_no_rounds_can_meet():
    # 24-byte items are 3 words each: one item per round needs 48 bytes, above the floor of 32
    plan = make_plan(RechunkSpec(((1, 1),), ((2,),), 24), [0, 0], 1)
    with pytest.raises(PlanError, match="cannot fit"):
        packed_layout(plan, 47)
    ids = byte_ids(plan.spec.shape, 24)
    simulate_packed(plan, packed_layout(plan, 48), ids).check(ids, plan.needed)


@QUICK
@given(plans(max_elements=512, partial=True), st.data())
def test_packed_layout_rejects_a_budget_below_the_floor(plan, data):
    floor = budget_floor(plan)
    budget = data.draw(st.integers(0, floor - 1), label="budget")
    if len(plan.transfers) == 0:
        assert packed_layout(plan, budget).rounds == 1  # nothing to move: nothing to fit
    else:
        with pytest.raises(PlanError, match="below the minimum"):
            packed_layout(plan, budget)


@QUICK
@given(plans(max_elements=512, partial=True), st.data())
def test_choose_layout(plan, data):
    budget = data.draw(st.integers(64 * plan.nranks, 64 * plan.nranks + 2 * plan.spec.nbytes), label="budget")
    layout, why = choose_layout(plan, budget)
    direct, direct_why = direct_layout(plan, budget)
    assert why == direct_why
    assert layout.mapping == ("direct" if direct is not None else "packed")
    assert all(layout.arena_bytes(r) <= budget for r in range(plan.nranks))


# -- size classes ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 8))
def test_size_class(n, m, bits):
    c = size_class(n, bits)
    assert c >= n
    if bits == 0:
        assert c == n
    else:
        # at most a 2**-(bits - 1) fraction more, and of at most ``bits`` significant bits
        assert (c - n) * 2 ** (bits - 1) < n + 2 ** (bits - 1)
        assert c <= 2**bits or c // (c & -c) < 2**bits
    lo, hi = sorted((n, m))
    assert size_class(lo, bits) <= size_class(hi, bits)
