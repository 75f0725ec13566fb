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

``--pipelines``: a bare ``x.rechunk(new)`` and the pipeline ``((2 * x + 1).rechunk(new)) ** 2`` of a
persisted NumPy array (``--shape``, in N slabs along axis 0 to slabs along axis 1), each with and
without `dask_redist.enable`, runs alternating: ms per ``persist()`` on the client, and from
``persist()`` to the scheduler's ``update_graph`` done (its tasks created: what precedes the first
stage task); ``--profile`` adds cProfile's top functions of the enabled pipeline's client side
and of the scheduler's materialization. ``--fft`` also profiles the client's build of the GPU
FFT's graph (`dask_redist.fft.gpu.build`, built on CPU as tests/test_fuse.py builds it) of a
(1024, 1024, 512) complex128 array in 16 persisted slabs, and the rewrite of that graph.

    python benchmarks/submit_profile.py --pipelines --chunks 16 64 256 1024 --reps 5 --profile --fft
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import math
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


def _spans_ms() -> dict:
    """The spans of the last persist() in ms, in the order the tables print them."""
    names = {"build": "build", "persist()": "persist()", "materialize": "materialize"}
    names |= {"of which rewrite": "rewrite", "order": "order"}
    return {column: SPANS.get(span, 0) * 1e3 for column, span in names.items()}


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
        **_spans_ms(),
        "task states": abs(metrics.get("state_initialization_duration_seconds", float("nan"))) * 1e3,
        "first stage at": first_stage,
        "end": (end - start) * 1e3,
    }


GRAPHS = {
    "bare": lambda x, new: x.rechunk(new),
    "pipeline": lambda x, new: ((2 * x + 1).rechunk(new)) ** 2,
}
UPDATED: list[float] = []  # perf_counter when the scheduler's update_graph ended


def instrument_update_graph() -> None:
    """Record when each ``update_graph`` of the (in-process) scheduler is done: set before the
    scheduler is created, which binds its handler then."""
    update = dscheduler.Scheduler.update_graph

    async def timed_update_graph(self, *args, **kwargs):
        try:
            return await update(self, *args, **kwargs)
        finally:
            UPDATED.append(time.perf_counter())

    dscheduler.Scheduler.update_graph = timed_update_graph


def top(prof: cProfile.Profile, n: int = 30) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(n)
    return out.getvalue()


def pipeline_once(client, shape, n: int, graph: str, enabled: bool, seed: int, profile: bool) -> dict:
    """One submission of ``graph`` on a fresh persisted input of ``n`` slabs: ms of its steps."""
    import dask.array as da

    old = (math.ceil(shape[0] / n), shape[1], shape[2])
    new = (shape[0], math.ceil(shape[1] / n), shape[2])
    x = da.random.default_rng(seed).random(shape, chunks=old).persist()
    wait(x)
    SPANS.clear()
    UPDATED.clear()
    handle = dask_redist.enable(engine="dask", min_bytes=0) if enabled else None
    try:
        with span("build", profile):
            y = GRAPHS[graph](x, new)
        start = time.perf_counter()
        with span("persist()", profile):
            y = y.persist()
        wait(y)
    finally:
        if handle is not None:
            dask_redist.disable(handle)
    updated = UPDATED[-1] if UPDATED else float("nan")
    del x, y
    return {
        **_spans_ms(),
        "persist() to tasks created": (updated - start) * 1e3,
    }


def pipelines(args) -> None:
    with (
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        rows = []
        for n in args.chunks:
            side = max(args.shape[0], n)
            shape = (
                side,
                max(args.shape[1], n),
                max(1, args.shape[0] * args.shape[1] * args.shape[2] // side**2),
            )
            configs = [(g, e) for g in GRAPHS for e in (False, True)]
            runs: dict = {c: [] for c in configs}
            for rep in range(args.reps + 1):  # (alternating; the first round warms up)
                for g, e in configs:
                    last = args.profile and rep == args.reps and g == "pipeline" and e
                    r = pipeline_once(client, shape, n, g, e, rep, last)
                    if rep:
                        runs[(g, e)].append(r)
                    if last:
                        for name in ("build", "persist()", "materialize"):
                            if name in PROFILES:
                                print(f"--- {n} chunks, enabled pipeline: {name} ---\n" + top(PROFILES[name]))
                        PROFILES.clear()
            for (g, e), rs in runs.items():
                med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                rows.append({"graph": g, "enable()": "yes" if e else "no", "chunks": n, **med})
        head = list(rows[0])
        print(f"ms, medians of {args.reps} (shape {args.shape} at 256 chunks and fewer)")
        print("| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
        for r in rows:
            print(
                "| "
                + " | ".join(f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in head)
                + " |"
            )
        if args.fft:
            fft_build(client, args.reps)


def fft_build(client, reps: int) -> None:
    """The client's build of the GPU FFT's graph (without GPUs: only built), then the rewrite of it."""
    import pickle

    import dask.array as da

    from dask_redist.config import Settings
    from dask_redist.fft import gpu
    from dask_redist.fft.plan import normalize
    from dask_redist.graph.optimize import rewrite

    x = da.zeros((1024, 1024, 512), dtype="complex128", chunks=(64, 1024, 512)).persist()
    wait(x)
    op = normalize(x.shape, "c2c", False, None, None, None)
    times: dict[str, list] = {"gpu.build": [], "pickle": [], "rewrite": []}
    with dask_redist.enable(engine="dask", min_bytes=0):
        for rep in range(reps + 1):
            prof = cProfile.Profile() if rep == reps else None
            t0 = time.perf_counter()
            if prof:
                prof.enable()
            y = gpu.build(x, op, None)
            t1 = time.perf_counter()
            pickle.dumps(y.__dask_graph__(), protocol=5)
            t2 = time.perf_counter()
            rewrite(y.__dask_graph__(), [y.__dask_keys__()], Settings.from_config())
            t3 = time.perf_counter()
            if prof:
                prof.disable()
                print("--- GPU FFT, 16 slabs: build, pickle, rewrite ---\n" + top(prof))
            if rep:
                for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                    times[k].append(v * 1e3)
    print("GPU FFT's graph (1024, 1024, 512) complex128, 16 slabs, ms medians:")
    print({k: round(statistics.median(v), 2) for k, v in times.items()})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="256MiB")
    p.add_argument("--chunks", nargs="+", type=int, default=[256, 1024, 4096])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--profile", action="store_true", help="cProfile's top functions of the last run of each count"
    )
    p.add_argument("--pipelines", action="store_true", help="bare and pipeline, with and without enable()")
    p.add_argument("--shape", nargs=3, type=int, default=[256, 256, 64])
    p.add_argument("--fft", action="store_true", help="with --pipelines: the GPU FFT's client build too")
    args = p.parse_args()
    instrument(args.profile)
    if args.pipelines:
        instrument_update_graph()
        return pipelines(args)
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
