"""What ``dask_redist.enable()`` costs a rechunk it leaves to Dask: ``tasks`` against ``enabled``.

On a LocalCluster of one worker, a persisted 8 MB array of 2 row slabs is rechunked to 2 column
slabs (the packaged cost model keeps Dask's rechunk for it) again and again, the two taking
turns run by run: ``x.rechunk(new, method="tasks")`` with the collective off, and
``x.rechunk(new)`` under ``enable()``. Both run Dask's own rechunk; the difference is what
enabling adds (the settings read on the client, the rewrite's decision on the scheduler).

    python benchmarks/enabled_overhead.py --reps 150
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import dask.array as da
from distributed import Client, LocalCluster, wait

import dask_redist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=150)
    args = parser.parse_args()
    with (
        LocalCluster(n_workers=1, threads_per_worker=4, dashboard_address=None) as cluster,
        Client(cluster),
    ):
        x = da.random.random((1000, 1000), chunks=(500, 1000)).persist()
        wait(x)
        times: dict[str, list[float]] = {"tasks": [], "enabled": []}
        for _ in range(args.reps):
            for method, seconds in times.items():
                enabled = method == "enabled"
                with dask_redist.enable() if enabled else nullcontext():
                    start = time.perf_counter()
                    y = x.rechunk((1000, 500), method=None if enabled else "tasks").persist()
                    wait(y)
                    seconds.append(time.perf_counter() - start)
                del y
        for method, seconds in times.items():
            kept = seconds[5:]  # (the first runs warm up)
            print(f"{method:8s} median {1e3 * statistics.median(kept):.2f} ms, min {1e3 * min(kept):.2f} ms")


if __name__ == "__main__":
    main()
