"""The graph rewrite's own time for pipelines around a rechunk of 4096 chunks, the graph then
materialized (as the scheduler does): what fusing more steps into the unpack tasks costs where
the graph is built, beside the tasks it saves.

    python benchmarks/fuse_rewrite_time.py

Best of 3 per pipeline; no cluster (the rewrite is pure). Figures: docs/benchmarks.md ("An
anomaly fused too").
"""

from __future__ import annotations

import time

import dask.array as da
from dask.utils import ensure_dict

from dask_redist.config import Settings
from dask_redist.graph.optimize import rewrite

PIPELINES = {
    "x.rechunk(c) ** 2": lambda z: z**2,
    "x.rechunk(c).mean(axis=0)": lambda z: z.mean(axis=0),
    "z - z.mean(axis=0)": lambda z: z - z.mean(axis=0),
}


def main() -> None:
    x = da.ones((4096, 4096), chunks=(1, 4096))
    for name, step in PIPELINES.items():
        times, tasks = [], 0
        for _ in range(3):
            y = step(x.rechunk((4096, 1)))
            start = time.perf_counter()
            graph, _ = rewrite(y.__dask_graph__(), [y.__dask_keys__()], Settings())
            tasks = len(ensure_dict(graph))
            times.append(time.perf_counter() - start)
        print(f"{name:28s} rewrite + materialize {1e3 * min(times):6.0f} ms  {tasks} tasks")


if __name__ == "__main__":
    main()
