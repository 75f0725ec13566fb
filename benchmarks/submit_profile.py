"""Where the time before the stage tasks goes: a collective rechunk's submission, step by step.

On a LocalCluster (its scheduler runs in this process, so its steps can be timed here), for
each chunk count: the slab case's input is placed and persisted (`dask_redist.bench`), then

    y = x.rechunk(new)      client: the graph of the rechunk            "build"
    y = y.persist()         client: packing and sending the graph       "persist()"
    wait(y)

and on the scheduler: materializing the graph (dask's optimizations, of which the collective's
rewrite, `graph.optimize`), ordering it (`dask.order.order`, which `runtime.ordering` wraps),
and creating the task states (distributed's own "update-graph" metrics); then the first stage
task (the worker's timeline). ``--profile`` prints cProfile's top functions of the client's
build and of the scheduler's materialization.

    python benchmarks/submit_profile.py --size 256MiB --chunks 256 1024 4096 --reps 3
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from contextlib import contextmanager

import dask
import distributed.scheduler as dscheduler
from distributed import Client, LocalCluster, wait

import dask_redist
from dask_redist.bench import placed_array, slab_case
from dask_redist.bench.harness import timeline
from dask_redist.graph import optimize

SPANS: dict[str, float] = {}
PROFILES: dict[str, cProfile.Profile] = {}


@contextmanager
def span(name: str, profile: bool = False):
    prof = cProfile.Profile() if profile else None
    start = time.perf_counter()
    if prof:
        prof.enable()
    try:
        yield
    finally:
        if prof:
            prof.disable()
            PROFILES[name] = prof
        SPANS[name] = SPANS.get(name, 0.0) + time.perf_counter() - start


def instrument(profile: bool) -> None:
    """Time (and profile) the scheduler's steps in this process."""
    materialize = dscheduler._materialize_graph

    def timed_materialize(*args, **kwargs):
        with span("materialize", profile):
            return materialize(*args, **kwargs)

    dscheduler._materialize_graph = timed_materialize
    rewrite = optimize.rewrite

    def timed_rewrite(*args, **kwargs):
        with span("rewrite"):
            return rewrite(*args, **kwargs)

    optimize.rewrite = timed_rewrite
    order_module = dask.order

    def timed_order(*args, **kwargs):
        with span("order"):
            return current_order(*args, **kwargs)

    current_order = order_module.order
    order_module.order = timed_order  # (runtime.ordering wraps whatever it finds, once, at the first rewrite)


def one(client, case, seed: int, profile: bool) -> dict:
    SPANS.clear()
    x = placed_array(client, case, seed)
    with dask_redist.enable(engine="dask", min_bytes=0):
        start = time.perf_counter()
        with span("build", profile):
            y = x.rechunk(case.new)
        with span("persist()"):
            y = y.persist()
        wait(y)
        end = time.perf_counter()
    marks = timeline(client, start)
    first_stage = min((t for t, e in marks if e.endswith(": first stage")), default=float("nan"))
    events = [
        e
        for _, e in client.get_events("scheduler")
        if isinstance(e, dict) and e.get("action") == "update-graph"
    ]
    metrics = events[-1].get("metrics", {}) if events else {}
    del x, y
    return {
        "build": SPANS.get("build", 0) * 1e3,
        "persist()": SPANS.get("persist()", 0) * 1e3,
        "materialize": SPANS.get("materialize", 0) * 1e3,
        "of which rewrite": SPANS.get("rewrite", 0) * 1e3,
        "order": SPANS.get("order", 0) * 1e3,
        "task states": abs(metrics.get("state_initialization_duration_seconds", float("nan"))) * 1e3,
        "first stage at": first_stage,
        "end": (end - start) * 1e3,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="256MiB")
    p.add_argument("--chunks", nargs="+", type=int, default=[256, 1024, 4096])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--profile", action="store_true", help="cProfile's top functions of the last run of each count"
    )
    args = p.parse_args()
    instrument(args.profile)
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        rows = []
        for n in args.chunks:
            case = slab_case(args.size, n)
            runs = [
                one(client, case, seed, args.profile and seed == args.reps) for seed in range(args.reps + 1)
            ][1:]
            rows.append({"case": case.name, **{k: statistics.median(r[k] for r in runs) for k in runs[0]}})
            if args.profile:
                for name, prof in PROFILES.items():
                    out = io.StringIO()
                    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
                    print(f"--- {case.name}: {name} ---\n" + out.getvalue())
    head = list(rows[0])
    print("ms, medians of", args.reps, "(first stage: ms after x.rechunk was called)")
    print("| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
    for r in rows:
        print("| " + " | ".join(r["case"] if k == "case" else f"{r[k]:.1f}" for k in head) + " |")


if __name__ == "__main__":
    main()
