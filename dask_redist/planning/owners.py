"""Who owns each output chunk: balanced, and keeping bytes where they already are.

Candidates:

* recursive bisection of the new chunk grid into one box per rank (boxes are what
  the direct cuFFTMp mapping needs), tried with each axis as the first cut, then
  matched to ranks greedily by the bytes each rank already holds;
* a greedy assignment of each new chunk to the rank holding most of its bytes,
  under a load cap.

Among the candidates within `BALANCE_TOLERANCE` of the best balance, the one that
moves the fewest bytes across ranks wins; near-ties go to box-shaped candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from dask_redist.planning.geometry import Chunks, PlanError, RechunkSpec, chunk_nbytes, rank_extents

if TYPE_CHECKING:
    from dask_redist.planning.local import Local

#: are considered balanced.
BALANCE_TOLERANCE = 1.10
#: Moved bytes within this fraction of the total count as a tie.
TIE_FRACTION = 0.01
#: The greedy candidate walks new chunks one by one in Python: tried up to this many
#: (chunk, holder) pairs (docs/scale.md has the cost beyond it). Past it only
#: the box candidates compete, which are also the ones the direct cuFFTMp mapping needs.
GREEDY_MAX_PAIRS = 2**20


def bisect_boxes(ranges: list[tuple[int, int]], nparts: int, lengths: Chunks, first_axis: int | None):
    """Split a box of chunk indices into ``nparts`` boxes of balanced volume (some may be empty)."""
    if nparts == 1:
        return [ranges]
    spans = [hi - lo for lo, hi in ranges]
    if first_axis is not None and spans[first_axis] > 1:
        axis = first_axis
    elif max(spans) > 1:
        axis = int(np.argmax(spans))
    else:
        return [ranges] + [None] * (nparts - 1)
    lo, hi = ranges[axis]
    n1 = nparts // 2
    sizes = np.asarray(lengths[axis][lo:hi], dtype=np.float64)
    cum = np.cumsum(sizes)
    target = cum[-1] * n1 / nparts
    # cut after k chunks, 1 <= k <= span - 1, as close to the target share as possible
    k = int(np.clip(np.argmin(np.abs(cum[:-1] - target)) + 1, 1, hi - lo - 1))
    left = list(ranges)
    right = list(ranges)
    left[axis] = (lo, lo + k)
    right[axis] = (lo + k, hi)
    return bisect_boxes(left, n1, lengths, None) + bisect_boxes(right, nparts - n1, lengths, None)


def _match_slots(local: np.ndarray) -> np.ndarray:
    """Give each slot (row) a distinct rank (column), greedily by bytes already there."""
    nslots, nranks = local.shape
    order = np.argsort(-local, axis=None, kind="stable")
    slot_rank = np.full(nslots, -1, dtype=np.int64)
    used = np.zeros(nranks, dtype=bool)
    for flat in order:
        s, r = divmod(int(flat), nranks)
        if slot_rank[s] < 0 and not used[r]:
            slot_rank[s] = r
            used[r] = True
    free = iter(np.flatnonzero(~used))
    for s in np.flatnonzero(slot_rank < 0):
        slot_rank[s] = next(free)
    return slot_rank


@dataclass(frozen=True)
class OwnerCandidate:
    name: str
    owners: np.ndarray  # rank per new chunk, shaped like the new grid
    boxes: bool  # every rank owns one box of chunks (possibly empty)
    kept: int  # bytes that stay where they are


def owner_candidates(
    spec: RechunkSpec, local: Local, nranks: int, sizes: np.ndarray | None = None
) -> Iterator[OwnerCandidate]:
    """Candidate owner maps; ``local``: bytes of each new chunk held by each rank.

    ``sizes[j]`` are the bytes of new chunk j to balance (all of them by default;
    zero for a chunk nobody needs).
    """
    grid = spec.new_grid
    if sizes is None:
        sizes = chunk_nbytes(spec.new, spec.itemsize).ravel()
    tried = set()
    for first in range(spec.ndim):
        if grid[first] <= 1 and first != 0:
            continue
        boxes = bisect_boxes([(0, g) for g in grid], nranks, spec.new, first)
        key = tuple(map(tuple, (b or () for b in boxes)))
        if key in tried:
            continue
        tried.add(key)
        slot = np.full(grid, -1, dtype=np.int64)
        for s, box in enumerate(boxes):
            if box is not None:
                slot[tuple(slice(lo, hi) for lo, hi in box)] = s
        slot_local = local.box_sums(boxes)
        match = _match_slots(slot_local)
        owners = match[slot.ravel()]
        kept = int(slot_local[np.arange(len(match)), match].sum())
        yield OwnerCandidate(f"boxes(axis {first})", owners.reshape(grid), True, kept)

    if local.pairs > GREEDY_MAX_PAIRS:
        return
    # greedy: biggest chunks first, each to the rank holding most of it, under a cap
    cap = sizes.sum() / nranks + (sizes.max() if len(sizes) else 0)
    load = np.zeros(nranks, dtype=np.int64)
    owners = np.zeros(len(sizes), dtype=np.int64)
    # each chunk's holders, most bytes first (ties: lower rank), then every other rank in order
    chunk, rank, nbytes = local.triples
    order = np.lexsort((rank, -nbytes, chunk))
    holders_of, chunk_of = rank[order], chunk[order]
    starts = np.searchsorted(chunk_of, np.arange(len(sizes)))
    stops = np.searchsorted(chunk_of, np.arange(len(sizes)), side="right")
    for j in np.argsort(-sizes, kind="stable"):
        size = sizes[j]
        r = next((int(h) for h in holders_of[starts[j] : stops[j]] if load[h] + size <= cap), None)
        if r is None:
            free = np.flatnonzero(load + size <= cap)  # holders that fit were taken above
            r = int(free[0]) if len(free) else int(np.argmin(load))
        owners[j] = r
        load[r] += size
    yield OwnerCandidate("greedy locality", owners.reshape(grid), False, local.kept(owners))


def is_box_placement(chunks: Chunks, ranks: np.ndarray, nranks: int) -> bool:
    """Does every rank's set of (non-empty) chunks tile one box of the global array?"""
    lo, hi, elements = rank_extents(chunks, ranks, nranks)
    held = lo[:, 0] >= 0 if lo.shape[1] else np.zeros(nranks, dtype=bool)
    volume = np.ones(int(held.sum()), dtype=np.int64)
    for axis, c in enumerate(chunks):
        b = np.concatenate([[0], np.cumsum(c, dtype=np.int64)])
        volume *= b[hi[held, axis]] - b[lo[held, axis]]
    return bool(np.array_equal(volume, elements[held]))


def choose_owners(spec: RechunkSpec, local: Local, needed: np.ndarray, nranks: int):
    """The owner of every new chunk, and the name of the winning candidate (module docstring);
    ``local``: bytes of each needed new chunk held by each rank."""
    sizes = chunk_nbytes(spec.new, spec.itemsize).ravel() * needed.ravel()
    total = int(sizes.sum())
    scored = []
    for cand in owner_candidates(spec, local, nranks, sizes):
        flat = cand.owners.ravel()
        load = np.bincount(flat, weights=sizes, minlength=nranks)
        scored.append((load.max(), total - cand.kept, cand))
    best_load = min(s[0] for s in scored)
    balanced = [s for s in scored if s[0] <= best_load * BALANCE_TOLERANCE + 1]
    least_moved = min(s[1] for s in balanced)
    near = [s for s in balanced if s[1] <= least_moved + TIE_FRACTION * total]
    near.sort(key=lambda s: (not s[2].boxes, s[1], s[0]))
    winner = near[0][2]
    return winner.owners, winner.name


def restricted_owners(owners: np.ndarray, allowed: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``owners`` (each new chunk's rank, flat) with every chunk whose owner ``allowed`` (chunks x
    ranks, bool) forbids moved to the least loaded rank it allows, biggest chunks first: the
    workers, hosts or resources a user restricted the rechunk's outputs to. A chunk that no rank
    may own raises `PlanError`."""
    owners = np.array(owners, dtype=np.int64)
    bad = np.flatnonzero(~allowed[np.arange(len(owners)), owners])
    if not len(bad):
        return owners
    if nowhere := np.flatnonzero(~allowed[bad].any(axis=1)).tolist():
        raise PlanError(f"no rank may own new chunks {bad[nowhere].tolist()[:8]} (their restrictions)")
    kept = np.ones(len(owners), dtype=bool)
    kept[bad] = False
    load = np.bincount(owners[kept], weights=sizes[kept], minlength=allowed.shape[1])
    for j in bad[np.argsort(-sizes[bad], kind="stable")].tolist():
        choices = np.flatnonzero(allowed[j])
        owners[j] = r = choices[np.argmin(load[choices])]
        load[r] += sizes[j]
    return owners
