"""The host side of a `cufftmp` run through the arena (the direct layout), on CPU: what one rank
does between the scheduler's start and its last round queued, with NumPy stand-ins for the GPU.

The slab case of `dask-redist bench` (`bench.slab_case`, 8 GiB float64 by default) on ``--ranks``
ranks, rank 0's side timed step by step as the engine runs it (`engines/cufftmp/engine.py`):

    plan        RunSpec.plan                        the plan re-derived with the owners given
    outputs     _empty_outputs(run, xp)             rank 0's output chunks allocated (stand-ins)
    layout      choose_layout(plan, budget, ...)    the rounds and each rank's boxes
    tables      ChunkTable.of(inputs / outputs)     every local chunk's box and address
    rounds      per round: boxes, stage and unstage jobs   (what `_direct_round` builds)

The kernel launches, the reshape and the GPU's own time are not here. The table also gives,
for the first round, the copy kernel's work: jobs, and blocks of the launch (a unit is a
row's 64 KiB segment; the grid is at most 4096 units by 65535 jobs).

    python benchmarks/direct_path_profile.py --chunks 1024 4096 --ranks 1 2 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import numpy as np
from local_path_profile import StandInCuPy, chunks_of

from dask_redist.bench import slab_case
from dask_redist.config import Settings
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.engines.copies import ChunkTable
from dask_redist.engines.cufftmp.engine import _empty_outputs
from dask_redist.planning import RechunkSpec, make_plan
from dask_redist.planning.layout import choose_layout


def blocks(jobs: np.ndarray) -> tuple[int, int]:
    """The jobs of a launch of `copies.box_copy` and its blocks."""
    if not len(jobs):
        return 0, 0
    units = jobs[:, 2] * jobs[:, 3] * -(-jobs[:, 4] // 65536)
    return len(jobs), int(min(units.max(), 4096) * min(len(jobs), 65535))


def one_run(size: str, n: int, ranks: int) -> tuple[dict, dict]:
    """Seconds per step of rank 0, and the first round's kernel work."""
    case = slab_case(size, n)
    rechunk = RechunkSpec(case.old, case.new, np.dtype(case.dtype).itemsize)
    settings = Settings()
    spec = CollectiveSpec("t" * 32, "in", "out", rechunk, np.dtype(case.dtype), settings, "cupy")
    in_ranks = (np.arange(len(case.old[0])) * ranks // len(case.old[0])).reshape(rechunk.old_grid)
    chosen = make_plan(rechunk, in_ranks, ranks)
    workers = tuple(f"w{i}" for i in range(ranks))
    run_spec = RunSpec(spec, 1, 1, workers, in_ranks, chosen.out_ranks, chosen.needed, "cufftmp", "cupy")
    mine = [f for f in range(in_ranks.size) if in_ranks.ravel()[f] == 0]
    inputs = chunks_of(n, rechunk.old_box, mine, rechunk.itemsize)
    times, t0 = {}, time.perf_counter()

    def step(name):
        nonlocal t0
        now = time.perf_counter()
        times[name], t0 = now - t0, now

    plan = run_spec.plan
    step("plan")
    run = SimpleNamespace(spec=run_spec, plan=plan, inputs=inputs, rank=0, state="running")
    outputs = _empty_outputs(run, StandInCuPy())
    step("outputs")
    layout, _ = choose_layout(
        plan, settings.memory_budget, size_class_bits=settings.size_class_bits, allow_empty=False
    )
    step("layout")
    item = rechunk.itemsize
    tables = (
        ChunkTable.of(inputs, rechunk.old_box, item, boxes_of=rechunk.old_boxes),
        ChunkTable.of(outputs, rechunk.new_box, item, boxes_of=rechunk.new_boxes),
    )
    step("tables")
    work = {}
    for k in range(layout.rounds):
        ins, outs = layout.boxes(k)
        stage = tables[0].jobs(ins[0].lower, ins[0].upper, 0, into_box=True)
        unstage = tables[1].jobs(outs[0].lower, outs[0].upper, 0, into_box=False)
        if k == 0:
            work = {
                "mapping": layout.mapping,
                "rounds": layout.rounds,
                "stage": blocks(stage),
                "unstage": blocks(unstage),
            }
    step("rounds")
    return times, work


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8GiB")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    steps = ("plan", "outputs", "layout", "tables", "rounds")
    print(
        f"| chunks | ranks | layout | {' | '.join(steps)} | total | round 0: stage jobs / blocks | unstage jobs / blocks |"
    )
    print("|---|---|---|" + "---|" * (len(steps) + 3))
    for n in args.chunks:
        for ranks in args.ranks:
            runs = [one_run(args.size, n, ranks) for _ in range(args.reps)]
            ms = [statistics.median(r[0][s] for r in runs) * 1e3 for s in steps]
            w = runs[0][1]
            cells = " | ".join(f"{v:.1f}" for v in ms)
            print(
                f"| {n} | {ranks} | {w['mapping']}, {w['rounds']} rounds | {cells} | {sum(ms):.1f} | "
                f"{w['stage'][0]} / {w['stage'][1]} | {w['unstage'][0]} / {w['unstage'][1]} |"
            )
    print(f"(ms, medians of {args.reps}, rank 0's host work; stand-ins for the chunks)")


if __name__ == "__main__":
    main()
