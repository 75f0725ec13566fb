"""``dask-redist bench --scale``: one run's planning and bookkeeping at scale, without a cluster.

Only 2 GPUs can be run here; what a run costs off the GPU on 2 .. 1024 ranks and 10^3 ..
10^6 chunks is measured instead, part by part, in this process:

* ``scheduler: owners``: the barrier handler's planning (`make_plan` choosing owners);
* ``scheduler: bookkeeping``: its per-output-key work (which outputs are needed, pinning
  every unpack task) and pickling the `RunSpec` it sends every rank;
* ``worker: plan``: a rank re-deriving the plan from the `RunSpec` (given owners);
* ``worker: cufftmp layout``: the reshape boxes and rounds (`choose_layout`);
* ``worker: dask blocks``: what the dask engine moves (input chunks cut to output boxes,
  or the pieces where the outputs do not tile boxes).

Each is timed (best of ``reps``) with its peak of Python-allocated memory (tracemalloc);
a part that took longer than ``budget_s`` is not run at larger sizes. `fit` gives the
exponent ``k`` of ``time ~ chunks^k`` per part and rank count (1: linear).
"""

from __future__ import annotations

import math
import pickle
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from dask_redist.config import Settings
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.planning import RechunkSpec, make_plan
from dask_redist.planning.boxes import box_transfers
from dask_redist.planning.layout import choose_layout, direct_layout
from dask_redist.planning.local import held_as_boxes
from dask_redist.planning.owners import is_box_placement

#: Parts that enumerate pieces (the packed cufftmp layout; the dask engine where the outputs do
#: not tile boxes) are not run past this many: a rechunk across the grid has n_old x n_new.
MAX_PIECES = 5 * 10**6
#: Tracing allocations slows Python-heavy parts several times over: parts slower than this
#: (seconds) are not traced (their memory shows as "-").
TRACE_MAX_S = 2.0
#: Choosing owners holds the bytes each rank has of each new chunk: up to ranks x new chunks
#: (chunk, rank) pairs, all of them where every rank holds part of every chunk (slabs across
#: the grid). Not run past this many pairs (a 24 GiB machine runs out of memory near 10^9).
MAX_PAIRS = 10**8

PARTS = (
    "scheduler: owners",
    "scheduler: bookkeeping",
    "worker: plan",
    "worker: cufftmp layout",
    "worker: dask blocks",
)


def _split(length: int, parts: int) -> tuple[int, ...]:
    return tuple(int(d) for d in np.diff(np.linspace(0, length, parts + 1).astype(np.int64)))


def geometry(kind: str, chunks: int, seed: int = 0) -> RechunkSpec:
    """A float64 rechunk of about ``chunks`` chunks before and after (chunk tuples only, no data),
    on the smallest array that has that many: the bytes only decide rounds, measured apart."""
    if kind == "slab":  # row slabs to column slabs: pieces = chunks^2
        return RechunkSpec((_split(chunks, chunks), (chunks,)), ((chunks,), _split(chunks, chunks)), 8)
    if kind == "pencil":  # x-y pencils to y-z pencils: pieces = chunks^1.5
        k = max(1, round(chunks**0.5))
        return RechunkSpec((_split(k, k), _split(k, k), (k,)), ((k,), _split(k, k), _split(k, k)), 8)
    if kind == "uneven":  # random chunk sizes along two axes, both grids
        rng = np.random.default_rng(seed)
        k = max(1, round(chunks**0.5))
        n = 4 * k

        def cuts():
            return tuple(
                int(d)
                for d in np.diff(
                    np.sort(np.concatenate([[0, n], rng.choice(np.arange(1, n), k - 1, replace=False)]))
                )
            )

        return RechunkSpec((cuts(), cuts()), (cuts(), cuts()), 8)
    raise ValueError(f"unknown geometry {kind!r}: slab, pencil or uneven")


@dataclass
class Measurement:
    case: str
    ranks: int
    chunks: int  # old chunks
    pieces: int
    part: str
    seconds: float | None
    peak_bytes: int | None
    note: str = ""


def _timed(fn, reps: int, memory: bool):
    """Best time of ``reps`` calls; then, with ``memory``, one more call under tracemalloc for the
    peak (tracing slows Python-heavy code several times over, so it never overlaps a timing)."""
    best, value = math.inf, None
    for _ in range(reps):
        start = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - start)
    peak = None
    if memory and best < TRACE_MAX_S:
        tracemalloc.start()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return value, best, peak


def measure(
    kind: str, ranks: int, chunks: int, reps: int = 2, skip: set = frozenset(), memory: bool = True
) -> list[Measurement]:
    """Every part of one run of ``geometry(kind, chunks)`` over ``ranks`` ranks (contiguous placement)."""
    spec = geometry(kind, chunks)
    n_old = math.prod(spec.old_grid)
    in_ranks = ((np.arange(n_old) * ranks) // n_old).reshape(spec.old_grid)
    collective = CollectiveSpec("t" * 32, "x", "y", spec, np.dtype("float64"), Settings())
    out: list[Measurement] = []
    plan = None

    def record(part, fn):
        if part in skip:
            out.append(
                Measurement(kind, ranks, n_old, 0, part, None, None, "skipped: too slow at a smaller size")
            )
            return None
        value, seconds, peak = _timed(fn, reps, memory)
        out.append(Measurement(kind, ranks, n_old, 0, part, seconds, peak))
        return value

    n_new = math.prod(spec.new_grid)
    # (where every rank holds a few boxes of old chunks the pairs are never stored: planning.local.Outer)
    too_many = ranks * n_new > MAX_PAIRS and not held_as_boxes(in_ranks)
    if too_many:
        skip = skip | {"scheduler: owners"}
    plan = record("scheduler: owners", lambda: make_plan(spec, in_ranks, ranks))
    if plan is None:  # owners as the box candidate would give them, for the parts after it
        plan = make_plan(spec, in_ranks, ranks, out_ranks=_bisected_owners(spec, ranks))
    if too_many:
        out[-1].note = f"not run: up to {ranks} x {n_new} = {ranks * n_new:.2g} (chunk, rank) pairs"

    def bookkeeping():
        keys = collective.output_keys()
        needed = {k: True for k in keys}  # the barrier asks the scheduler's task table per key
        owners = plan.out_ranks.ravel()
        pins = {k: {f"tcp://10.0.{r // 250}.{r % 250}:1"} for k, r in zip(keys, owners.tolist()) if needed[k]}
        run = RunSpec(
            collective,
            1,
            1,
            tuple(f"w{r}" for r in range(ranks)),
            plan.in_ranks,
            plan.out_ranks,
            plan.needed,
            "cufftmp",
        )
        return len(pins), len(pickle.dumps(run))

    record("scheduler: bookkeeping", bookkeeping)
    given = record("worker: plan", lambda: make_plan(spec, plan.in_ranks, ranks, out_ranks=plan.out_ranks))
    given = given or plan
    budget = spec.nbytes  # one round: the cost of rounds is linear in their number, apart from this
    direct = direct_layout(given, budget)[0] is not None
    if not direct and plan.piece_count > MAX_PIECES:
        skip = skip | {"worker: cufftmp layout"}
    record("worker: cufftmp layout", lambda: choose_layout(given, budget))
    boxes = is_box_placement(spec.new, given.out_ranks, ranks)
    if (plan.piece_count if not boxes else n_old * ranks) > MAX_PIECES:
        skip = skip | {"worker: dask blocks"}

    def blocks():
        t = box_transfers(spec.old, given.in_ranks, spec.new, given.out_ranks, ranks, 8)
        return len(t) if t is not None else len(given.transfers)

    record("worker: dask blocks", blocks)
    for m in out:
        if m.seconds is None and m.part == "worker: cufftmp layout" and not direct:
            m.note = f"not run: the packed layout enumerates {plan.piece_count:.2g} pieces"
        if m.seconds is None and m.part == "worker: dask blocks":
            m.note = (
                f"not run: up to {n_old} x {ranks} = {n_old * ranks:.2g} blocks"
                if boxes
                else f"not run: the piece path enumerates {plan.piece_count:.2g} pieces"
            )
    for m in out:
        m.pieces = plan.piece_count
    return out


def _bisected_owners(spec: RechunkSpec, ranks: int) -> np.ndarray:
    from dask_redist.planning.owners import bisect_boxes

    owners = np.zeros(spec.new_grid, dtype=np.int64)
    for r, box in enumerate(bisect_boxes([(0, g) for g in spec.new_grid], ranks, spec.new, 0)):
        if box is not None:
            owners[tuple(slice(lo, hi) for lo, hi in box)] = r
    return owners


def run_model(
    kinds=("slab", "pencil", "uneven"),
    ranks=(2, 16, 256, 1024),
    chunks=(1_000, 10_000, 100_000, 1_000_000),
    reps: int = 2,
    budget_s: float = 10.0,
    progress=print,
) -> list[Measurement]:
    """`measure` over every geometry, rank count and size; a part over ``budget_s`` stops growing."""
    results: list[Measurement] = []
    for kind in kinds:
        for r in ranks:
            skip: set[str] = set()
            for c in chunks:
                if c < r:
                    continue
                found = measure(kind, r, c, reps=reps, skip=skip)
                results += found
                skip |= {m.part for m in found if m.seconds is not None and m.seconds > budget_s}
                progress(
                    f"{kind} ranks={r} chunks={found[0].chunks}: "
                    + ", ".join(
                        f"{m.part.split(': ')[1]} {'-' if m.seconds is None else f'{m.seconds * 1e3:.1f} ms'}"
                        for m in found
                    )
                )
    return results


def fit(results: list[Measurement]) -> dict[tuple[str, str, int], float]:
    """Exponent k of time ~ chunks^k for every (case, part, ranks) measured at 3 or more sizes."""
    groups: dict[tuple[str, str, int], list[Measurement]] = {}
    for m in results:
        if m.seconds:
            groups.setdefault((m.case, m.part, m.ranks), []).append(m)
    return {
        key: float(np.polyfit(np.log([m.chunks for m in ms]), np.log([m.seconds for m in ms]), 1)[0])
        for key, ms in groups.items()
        if len({m.chunks for m in ms}) >= 3
    }


def markdown(results: list[Measurement], command: str, env: str) -> str:
    from dask.utils import format_bytes

    lines = [
        f"Command: `{command}`  ",
        f"{env}",
        "",
        "| case | ranks | old chunks | pieces | part | time | peak memory | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in results:
        t = (
            "-"
            if m.seconds is None
            else (f"{m.seconds * 1e3:.1f} ms" if m.seconds < 1 else f"{m.seconds:.2f} s")
        )
        mem = "-" if m.peak_bytes is None else format_bytes(m.peak_bytes)  # Python-allocated (NumPy included)
        lines.append(
            f"| {m.case} | {m.ranks} | {m.chunks} | {m.pieces} | {m.part} | {t} | {mem} | {m.note} |"
        )
    exponents = fit(results)
    if exponents:
        lines += [
            "",
            "Growth, time ~ chunks^k (k fitted over the sizes measured):",
            "",
            "| case | part | ranks | k |",
            "|---|---|---|---|",
        ]
        lines += [f"| {c} | {p} | {r} | {k:.2f} |" for (c, p, r), k in sorted(exponents.items())]
    return "\n".join(lines) + "\n"
