"""What `dask_redist.cluster.engine_for` costs the client: the question `explain`, `doctor` and
`dask_redist.fft`'s GPU path ask of a running cluster (the scheduler's plugin registered, then its
probe, which asks each worker once):

    python benchmarks/engine_for_cost.py [CALLS]

On a 2-worker `LocalCluster`, NumPy chunks; prints the median and the tenth percentile in ms.
"""

from __future__ import annotations

import statistics
import sys
import time

from distributed import Client, LocalCluster

from dask_redist.cluster import engine_for
from dask_redist.config import Settings
from dask_redist.engines import Request


def main(calls: int) -> None:
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        request = Request("numpy", Settings.from_config())
        engine_for(client, request)  # (the workers asked once)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            engine_for(client, request)
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        print(f"engine_for: median {statistics.median(times):.3f} ms, p10 {times[len(times) // 10]:.3f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
