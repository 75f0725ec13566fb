"""The hops of one collective rechunk, run by run: when each mark of its timeline came.

On a LocalCluster of worker processes (CPU, NumPy, the ``dask`` engine), the slab case's input
(`dask_redist.bench.slab_case`) is placed and persisted, then ``x.rechunk(new).persist()`` is
timed ``--reps`` times after one warm-up, each on a fresh input. Printed: the median of every
mark of the timeline (`dask_redist.bench.harness.timeline`, ms after ``persist()``), then the
median of each hop between two marks that one message or task hand-off makes:

* graph in -> tasks created: the scheduler's ``update_graph`` (distributed's own event);
* tasks created -> first stage: the stage task sent to its worker, and run there;
* first stage -> run asked: a stage task's end, to the scheduler starting the run;
* start sent -> start message: the scheduler's start, to the worker reading it;
* barrier reply -> first unpack: the barrier task's end, to the first unpack task running;
* last unpack -> outputs in memory: the last unpack's end, to the scheduler hearing of it.

    python benchmarks/collective_hops.py --workers 1 --chunks 16 --size 1MiB --reps 15

Small sizes keep the run itself short, so that the hops are not waiting on its copies.
"""

from __future__ import annotations

import argparse
import statistics
import time

from distributed import Client, LocalCluster, wait

import dask_redist
from dask_redist.bench import placed_array, slab_case
from dask_redist.bench.harness import timeline

MARKS = [
    "graph in",
    "tasks created",
    "first stage",
    "run asked",
    "start sent",
    "start message",
    "execute",
    "barrier task",
    "barrier reply",
    "first unpack",
    "executed",
    "last unpack",
    "outputs in memory",
]
HOPS = [
    ("graph in", "tasks created"),
    ("tasks created", "first stage"),
    ("first stage", "run asked"),
    ("start sent", "start message"),
    ("barrier reply", "first unpack"),
    ("last unpack", "outputs in memory"),
]


def runs(client, case, reps: int) -> list[dict[str, float]]:
    """The marks of each timed run (ms after its ``persist()``), with its "total"."""
    rows = []
    with dask_redist.enable(engine="dask", min_bytes=0):
        for rep in range(reps + 1):  # (the first: warm-up)
            x = placed_array(client, case, seed=rep)
            time.sleep(0.05)  # (the input's messages settled)
            start = time.perf_counter()
            y = x.rechunk(case.new).persist()
            wait(y)
            total = (time.perf_counter() - start) * 1e3
            marks: dict[str, float] = {}
            for t, event in timeline(client, start):
                if t >= 0:
                    marks.setdefault(event.split(": ", 1)[1], t)  # (the first worker's)
            if rep:
                rows.append({**marks, "total": total})
            del x, y
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--size", default="1MiB")
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        rows = runs(client, slab_case(args.size, args.chunks), args.reps)
    columns = [*MARKS, "total"]
    print(f"ms after persist(), medians of {args.reps} runs")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    print(
        "| "
        + " | ".join(f"{statistics.median(r.get(c, float('nan')) for r in rows):.2f}" for c in columns)
        + " |"
    )
    for a, b in HOPS:
        gaps = [r[b] - r[a] for r in rows if a in r and b in r]
        print(f"{a} -> {b}: {statistics.median(gaps):.2f} ms")


if __name__ == "__main__":
    main()
