"""Property tests of :mod:`dask_redist.planning.plan`, checked against NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st
from planning_helpers import (
    FAST,
    MAX_RANKS,
    QUICK,
    OutputChunks,
    box_placements,
    byte_ids,
    chunk_box,
    chunk_boxes,
    chunking,
    plans,
    random_placements,
    rechunk_specs,
    simulate_transfers,
)

from dask_redist.planning.geometry import flat_index
from dask_redist.planning.owners import BALANCE_TOLERANCE, restricted_owners
from dask_redist.planning.plan import (
    PlanError,
    RechunkSpec,
    axis_segments,
    chunk_nbytes,
    is_box_placement,
    make_plan,
)


@FAST
@given(st.integers(0, 40).flatmap(lambda n: st.tuples(chunking(n), chunking(n))))
def test_axis_segments_tile_the_axis(chunks):
    old, new = chunks
    seg = axis_segments(old, new)
    old_bounds, new_bounds = np.cumsum((0, *old)), np.cumsum((0, *new))
    assert np.all(seg.start < seg.stop) and np.all(seg.stop[:-1] == seg.start[1:])
    writes = np.zeros(sum(old), dtype=np.int64)
    for start, stop in zip(seg.start, seg.stop):
        writes[start:stop] += 1
    assert np.all(writes == 1)
    # every segment lies inside its old and its new chunk
    assert np.all(old_bounds[seg.old] <= seg.start) and np.all(seg.stop <= old_bounds[seg.old + 1])
    assert np.all(new_bounds[seg.new] <= seg.start) and np.all(seg.stop <= new_bounds[seg.new + 1])


@FAST
@given(plans())
def test_every_output_element_comes_from_exactly_one_input_element(plan):
    spec, t = plan.spec, plan.transfers
    data = byte_ids(spec.shape, spec.itemsize)
    simulate_transfers(spec, t, data).check(data, plan.needed)
    np.testing.assert_array_equal(t.src, plan.in_ranks.ravel()[t.old_block])
    np.testing.assert_array_equal(t.dst, plan.out_ranks.ravel()[t.new_block])
    assert plan.nbytes == spec.nbytes == int(chunk_nbytes(spec.new, spec.itemsize).sum())
    assert plan.traffic.sum() == plan.nbytes
    assert plan.moved_bytes == int(t.nbytes[t.src != t.dst].sum())


@FAST
@given(plans(partial=True))
def test_only_needed_chunks_are_moved_and_they_are_complete(plan):
    spec, t = plan.spec, plan.transfers
    data = byte_ids(spec.shape, spec.itemsize)
    assert plan.needed.ravel()[t.new_block].all()
    simulate_transfers(spec, t, data).check(data, plan.needed)
    sizes = chunk_nbytes(spec.new, spec.itemsize)
    assert plan.nbytes == int(sizes[plan.needed].sum())
    np.testing.assert_array_equal(
        plan.out_bytes, np.bincount(plan.out_ranks[plan.needed], sizes[plan.needed], minlength=plan.nranks)
    )


def balance_bound(plan) -> float:
    """The most bytes chosen owners may put on one rank.

    Greedy assignment, largest chunks first, never puts more than the mean plus the
    largest chunk on a rank; the planner may pick a candidate up to 10% worse. Only
    the needed chunks count: the others are not computed on.
    """
    sizes = chunk_nbytes(plan.spec.new, plan.spec.itemsize)[plan.needed]
    return BALANCE_TOLERANCE * (sizes.sum() / plan.nranks + sizes.max(initial=0)) + 1


@settings(max_examples=300, deadline=None)
@given(plans(owners="chosen", partial=True, boxes=None))
def test_chosen_owners_are_in_range_and_balanced(plan):
    assert plan.out_ranks.shape == plan.spec.new_grid
    assert plan.out_ranks.min() >= 0 and plan.out_ranks.max() < plan.nranks
    assert plan.owner_strategy != "given"
    target(plan.out_bytes.max() / balance_bound(plan))
    assert plan.out_bytes.max() <= balance_bound(plan), plan.summary()


def test_owners_balance_the_needed_chunks():
    # the needed half of the output lies all on rank 0: it must not all stay there
    spec = RechunkSpec(((1,) * 8,), ((1,) * 8,), 8)
    plan = make_plan(spec, [0, 0, 0, 0, 1, 1, 1, 1], 2, needed=[True] * 4 + [False] * 4)
    assert plan.out_bytes.max() <= balance_bound(plan) < plan.nbytes


@QUICK
@given(plans(owners="given"))
def test_given_owners_are_kept(plan):
    assert plan.owner_strategy == "given"
    for rank in range(plan.nranks):
        owned = plan.owned(rank)
        assert all(plan.out_ranks.ravel()[i] == rank for i in owned)
        assert len(owned) == int((plan.out_ranks == rank).sum())


@FAST
@given(plans(partial=True))
def test_sends_and_receives_agree_on_order(plan):
    fields = ("src", "dst", "old_block", "new_block", "lo", "hi")
    sends = [plan.sends(r) for r in range(plan.nranks)]
    receives = [plan.receives(r) for r in range(plan.nranks)]
    assert sum(map(len, sends)) == sum(map(len, receives)) == len(plan.transfers)
    for s in range(plan.nranks):
        assert np.all(sends[s].src == s) and np.all(receives[s].dst == s)
        for d in range(plan.nranks):
            out = sends[s].take(sends[s].dst == d)
            into = receives[d].take(receives[d].src == s)
            for f in fields:
                np.testing.assert_array_equal(getattr(out, f), getattr(into, f), err_msg=f"{s} -> {d}: {f}")


@settings(max_examples=100, deadline=None)
@given(plans(max_elements=256), st.integers(0, 300))
def test_split_parts_are_boxes_that_cover_each_transfer(plan, max_bytes):
    spec, t = plan.spec, plan.transfers
    parts = t.split(max_bytes)
    assert np.all(parts.nbytes > 0)
    assert np.all(parts.nbytes <= max(max_bytes, spec.itemsize))
    # a piece is the only one with its (old, new) chunk pair: parts tile their piece exactly
    piece = {(int(o), int(n)): i for i, (o, n) in enumerate(zip(t.old_block, t.new_block))}
    writes = np.zeros(spec.shape, dtype=np.int64)
    for k in range(len(parts)):
        i = piece[int(parts.old_block[k]), int(parts.new_block[k])]
        assert (parts.src[k], parts.dst[k]) == (t.src[i], t.dst[i])
        assert np.all(t.lo[i] <= parts.lo[k]) and np.all(parts.lo[k] < parts.hi[k])
        assert np.all(parts.hi[k] <= t.hi[i])
        writes[tuple(slice(lo, hi) for lo, hi in zip(parts.lo[k], parts.hi[k]))] += 1
    expected = np.zeros(spec.shape, dtype=np.int64)
    for i in range(len(t)):
        expected[tuple(slice(lo, hi) for lo, hi in zip(t.lo[i], t.hi[i]))] += 1
    np.testing.assert_array_equal(writes, expected)
    # and the parts still move the data
    data = byte_ids(spec.shape, spec.itemsize)
    simulate_transfers(spec, parts, data).check(data, plan.needed)


def _tiles_one_box_per_rank(chunks, ranks, nranks) -> bool:
    """The definition, on the elements: every rank's elements fill their bounding box."""
    owner = np.full([sum(c) for c in chunks], -1, dtype=np.int64)
    for box, rank in zip(chunk_boxes(chunks), ranks.ravel()):
        owner[box.slices()] = rank
    for rank in range(nranks):
        where = np.argwhere(owner == rank)
        if len(where):
            lo, hi = where.min(axis=0), where.max(axis=0) + 1
            if not np.all(owner[tuple(slice(a, b) for a, b in zip(lo, hi))] == rank):
                return False
    return True


@FAST
@given(rechunk_specs(), st.integers(1, MAX_RANKS), st.booleans(), st.data())
def test_is_box_placement(spec, nranks, boxes, data):
    grid = spec.old_grid
    ranks = data.draw(box_placements(spec.old, nranks) if boxes else random_placements(grid, nranks))
    expected = _tiles_one_box_per_rank(spec.old, ranks, nranks)
    assert is_box_placement(spec.old, ranks, nranks) == expected
    if boxes:
        assert expected


@QUICK
@given(plans(partial=True))
def test_summary(plan):
    s = plan.summary()
    assert s["ranks"] == plan.nranks
    assert s["pieces"] == len(plan.transfers)
    assert s["bytes"] == plan.nbytes
    assert s["bytes moved between ranks"] == plan.moved_bytes <= plan.nbytes
    assert s["box-shaped"] == plan.boxes
    assert s["output imbalance"] == round(plan.imbalance, 3)


def test_empty_array():
    spec = RechunkSpec(((0,), (3, 0, 2)), ((0,), (5,)), 8)
    plan = make_plan(spec, [[0, 1, 1]], 2)
    assert len(plan.transfers) == 0 and plan.nbytes == 0 and plan.imbalance == 1.0
    assert plan.out_ranks.shape == (1, 1)
    OutputChunks(spec).check(byte_ids(spec.shape, 8), plan.needed)


# -- errors -----------------------------------------------------------------------------


@QUICK
@given(st.integers(0, 20), st.integers(0, 20), st.data())
def test_chunks_that_do_not_sum_alike_are_rejected(n, m, data):
    if n == m:
        m += 1
    with pytest.raises(PlanError, match="sum"):
        RechunkSpec((data.draw(chunking(n)),), (data.draw(chunking(m)),), 8)


@pytest.mark.parametrize(
    "old, new, itemsize, match",
    [
        (((4, -1),), ((3,),), 8, "chunk size -1"),
        (((3,),), ((4, -1),), 8, "chunk size -1"),
        (((math.nan,),), ((3,),), 8, "NaN"),
        (((np.float64("nan"), 2),), ((3,),), 8, "NaN"),
        (((1.5, 1.5),), ((3,),), 8, "expected integers"),
        (((True, 2),), ((3,),), 8, "expected integers"),
        (((),), ((),), 8, "no chunks"),
        (((3,),), ((3,), (1,)), 8, "axes"),
        (((3,),), ((3,),), 0, "itemsize"),
        (((3,),), ((3,),), -8, "itemsize"),
        (((3,),), ((3,),), 8.0, "itemsize"),
    ],
)
def test_bad_chunks_are_rejected(old, new, itemsize, match):
    with pytest.raises(PlanError, match=match):
        RechunkSpec(old, new, itemsize)


@pytest.mark.parametrize("nranks", [0, -1, 2.0, None])
def test_bad_rank_count_is_rejected(nranks):
    with pytest.raises(PlanError, match="nranks"):
        make_plan(RechunkSpec(((2, 2),), ((4,),), 8), [0, 0], nranks)


@QUICK
@given(rechunk_specs(max_elements=64), st.integers(1, MAX_RANKS), st.data())
def test_ranks_out_of_range_are_rejected(spec, nranks, data):
    good_in = data.draw(random_placements(spec.old_grid, nranks))
    good_out = data.draw(random_placements(spec.new_grid, nranks))
    bad = data.draw(st.one_of(st.integers(-100, -1), st.integers(nranks, nranks + 100)))
    which = data.draw(st.sampled_from(["in", "out"]))
    ranks = (good_in if which == "in" else good_out).copy()
    ranks.flat[data.draw(st.integers(0, ranks.size - 1))] = bad
    with pytest.raises(PlanError, match=f"{which}put ranks"):
        if which == "in":
            make_plan(spec, ranks, nranks, out_ranks=good_out)
        else:
            make_plan(spec, good_in, nranks, out_ranks=ranks)


@FAST
@given(rechunk_specs())
def test_flat_indices_and_boxes_agree_with_the_grid(spec):
    """One index form: flat <-> N-D conversions round-trip, and boxes match the chunk sizes."""
    for chunks, grid, index_of, box_of in (
        (spec.old, spec.old_grid, spec.old_index, spec.old_box),
        (spec.new, spec.new_grid, spec.new_index, spec.new_box),
    ):
        for flat, nd in enumerate(np.ndindex(*grid)):
            assert index_of(flat) == nd and flat_index(nd, grid) == flat
            assert box_of(flat) == chunk_box(chunks, nd)
    for grid, box_of, boxes_of in (
        (spec.old_grid, spec.old_box, spec.old_boxes),
        (spec.new_grid, spec.new_box, spec.new_boxes),
    ):  # many boxes at once, in any order: each as `old_box` / `new_box` gives it
        flats = np.random.default_rng(len(grid)).permutation(math.prod(grid))
        lower, upper = boxes_of(flats)
        assert lower.shape == upper.shape == (len(flats), len(grid))
        assert [(tuple(lo), tuple(hi)) for lo, hi in zip(lower.tolist(), upper.tolist())] == [
            box_of(int(f)) for f in flats
        ]


@FAST
@given(st.one_of(plans(partial=True), plans(boxes=True)), st.randoms(use_true_random=False))
def test_outer_blocks_answer_as_their_dense_arrays(plan, rnd):
    """A rank holding a whole box of old chunks keeps its bytes as per-axis vectors
    (`Outer`): box sums, kept bytes, traffic, pairs, totals and triples equal those of the
    same blocks made dense."""
    from dask_redist.planning.local import Local, Outer

    local = plan.local
    dense = Local(
        tuple((r, lo, b.array() if isinstance(b, Outer) else b) for r, lo, b in local.blocks),
        local.grid,
        local.nranks,
    )
    grid = plan.spec.new_grid
    boxes = []
    for _ in range(8):
        box = []
        for g in grid:
            a = rnd.randint(0, g)
            box.append((a, rnd.randint(a, g)))
        boxes.append(box)
    boxes.append(None)
    np.testing.assert_array_equal(local.box_sums(boxes), dense.box_sums(boxes))
    owners = np.array([rnd.randrange(plan.nranks) for _ in range(math.prod(grid))], dtype=np.int64)
    assert local.kept(owners) == dense.kept(owners)
    np.testing.assert_array_equal(local.traffic(owners), dense.traffic(owners))
    assert (local.pairs, local.total) == (dense.pairs, dense.total)
    for got, want in zip(local.triples, dense.triples):
        np.testing.assert_array_equal(got, want)


@FAST
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=3).flatmap(
        lambda shape: st.lists(st.booleans(), min_size=math.prod(shape), max_size=math.prod(shape)).map(
            lambda cells: np.array(cells, dtype=bool).reshape(shape)
        )
    )
)
def test_a_mask_cut_into_boxes_is_covered_exactly_once(mask):
    from dask_redist.planning.local import _boxes

    boxes = _boxes(mask, 1000)
    covered = np.zeros(mask.shape, dtype=np.int64)
    for b in boxes:
        covered[b] += 1
    np.testing.assert_array_equal(covered, mask.astype(np.int64))
    assert _boxes(mask, 1) is None or len(_boxes(mask, 1)) <= 1


@FAST
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
def test_a_c_ordered_run_of_a_grid_is_a_few_boxes(shape, data):
    """What a rank holds when chunks are placed in contiguous blocks: at most 2 x ndim - 1 boxes."""
    from dask_redist.planning.local import _boxes

    n = math.prod(shape)
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a + 1, n))
    where = np.unravel_index(np.arange(a, b), shape)
    lo = [int(w.min()) for w in where]
    mask = np.zeros([int(w.max()) + 1 - l for w, l in zip(where, lo)], dtype=bool)
    mask[tuple(w - l for w, l in zip(where, lo))] = True
    boxes = _boxes(mask, 2 * len(shape) - 1)
    assert boxes is not None and sum(int(np.prod([s.stop - s.start for s in box])) for box in boxes) == b - a


def test_slabs_in_contiguous_blocks_are_kept_as_outer_blocks():
    from dask_redist.planning.local import Outer

    spec = RechunkSpec(((4,) * 64, (256,)), ((256,), (4,) * 64), 8)
    in_ranks = np.repeat(np.arange(8), 8).reshape(64, 1)
    plan = make_plan(spec, in_ranks, 8)
    assert all(isinstance(b, Outer) for _, _, b in plan.local.blocks)
    assert plan.local.dense().sum() == 256 * 256 * 8


@FAST
@given(st.one_of(plans(partial=True), plans(boxes=True)))
def test_what_is_computed_without_pieces_equals_the_pieces(plan):
    """Local bytes, traffic, totals and the piece count, computed axis by axis, equal what
    the enumerated pieces give."""
    t = plan.transfers
    n_new = int(np.prod(plan.spec.new_grid))
    local = np.bincount(t.new_block * plan.nranks + t.src, weights=t.nbytes, minlength=n_new * plan.nranks)
    np.testing.assert_array_equal(plan.local.dense(), local.astype(np.int64).reshape(n_new, plan.nranks))
    np.testing.assert_array_equal(plan.traffic, t.traffic(plan.nranks))
    assert plan.nbytes == int(t.nbytes.sum()) and plan.piece_count == len(t)


@FAST
@given(rechunk_specs())
def test_pieces_are_every_nonempty_chunk_intersection_in_c_order(spec):
    """`pieces` gives each non-empty old chunk ∩ new chunk once, with its chunks' flat indices,
    ordered by its lower corner (C order over the grid of per-axis segments), as the chunk
    boxes, intersected one pair at a time, give them."""
    from dask_redist.planning.plan import pieces

    expected = []
    for old_flat, old_box in enumerate(chunk_boxes(spec.old)):
        for new_flat, new_box in enumerate(chunk_boxes(spec.new)):
            lo = [max(a, b) for a, b in zip(old_box.lower, new_box.lower)]
            hi = [min(a, b) for a, b in zip(old_box.upper, new_box.upper)]
            if all(h > l for l, h in zip(lo, hi)):
                expected.append((tuple(lo), tuple(hi), old_flat, new_flat))
    expected.sort()
    old_flat, new_flat, lo, hi = pieces(spec)
    assert lo.shape == hi.shape == (len(expected), spec.ndim)
    got = list(zip(map(tuple, lo.tolist()), map(tuple, hi.tolist()), old_flat.tolist(), new_flat.tolist()))
    assert got == expected


@QUICK
@given(rechunk_specs())
def test_one_rank_owns_every_new_chunk_without_a_choice(spec):
    """A plan over one rank gives it every new chunk without choosing among candidates (the
    scheduler plans every run of a one-worker cluster); its bytes are counted only when asked."""
    plan = make_plan(spec, np.zeros(spec.old_grid, np.int64), 1)
    assert plan.owner_strategy == "one rank" and plan.chosen_with is None
    assert plan.out_ranks.shape == spec.new_grid and not plan.out_ranks.any()
    assert plan.moved_bytes == 0 and plan.nbytes == int(chunk_nbytes(spec.new, spec.itemsize).sum())


@FAST
@given(plans(partial=True), st.data())
def test_restricted_owners_are_allowed_and_keep_the_rest(plan, data):
    """Owners a restriction forbids move to a rank it allows (workers=, resources=); the others stay."""
    n = plan.out_ranks.size
    allowed = np.array(
        data.draw(
            st.lists(
                st.lists(st.booleans(), min_size=plan.nranks, max_size=plan.nranks), min_size=n, max_size=n
            )
        ),
        dtype=bool,
    ).reshape(n, plan.nranks)
    owners = plan.out_ranks.ravel()
    sizes = chunk_nbytes(plan.spec.new, plan.spec.itemsize).ravel()
    if not allowed.any(axis=1).all():
        with pytest.raises(PlanError, match="no rank may own new chunks"):
            restricted_owners(owners, allowed, sizes)
        return
    got = restricted_owners(owners, allowed, sizes)
    assert allowed[np.arange(n), got].all()
    ok = allowed[np.arange(n), owners]
    np.testing.assert_array_equal(got[ok], owners[ok])


def test_restricted_owners_share_the_moved_chunks_by_load():
    """Every chunk restricted to ranks 1 and 2 of 3: rank 0's chunks go to the less loaded of them."""
    owners = np.array([0, 0, 0, 0, 1, 2])
    allowed = np.array([[False, True, True]] * 6)
    got = restricted_owners(owners, allowed, np.full(6, 8))
    assert sorted(np.bincount(got, minlength=3).tolist()) == [0, 3, 3]
