"""What a GPU transform's questions to the scheduler cost: the engines' probe alone, the probe
with a persisted input's keys (its holders come back with it), and ``client.who_has`` of the
same chunks (the second question the transform asked before). LocalCluster of worker processes,
CPU; ``--reps`` calls of each, in turn; medians in ms.

    python benchmarks/probe_cost.py --chunks 16 --reps 200
"""

from __future__ import annotations

import argparse
import statistics
import time

import dask.array as da
from dask.core import flatten
from distributed import Client, LocalCluster, futures_of, wait

from dask_redist.cluster import engines_state
from dask_redist.config import Settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--chunks", type=int, default=16)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args()
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        x = da.ones((4 * args.chunks, 64, 32), chunks=(4, 64, 32), dtype=complex).persist()
        wait(x)
        keys, futures, settings = list(flatten(x.__dask_keys__())), futures_of(x), Settings.from_config()
        engines_state(client, settings)  # (the workers asked about their engines once)
        calls = {
            "probe": lambda: engines_state(client, settings),
            f"probe with {len(keys)} keys": lambda: engines_state(client, settings, keys),
            "who_has": lambda: client.who_has(futures),
        }
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.reps):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    print(" | ".join(f"{name}: {statistics.median(t) * 1e3:.3f} ms" for name, t in times.items()))


if __name__ == "__main__":
    main()
