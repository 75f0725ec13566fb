"""How much host memory a pipeline takes with the rechunk and without it, on CPU.

    python benchmarks/pipeline_memory.py [PIPELINE] [SIZE] [CHUNKS] [ROUNDS]

A `LocalCluster` of 2 worker processes of 1 thread, the `dask` engine. For each round (default
2), the bench's pipeline (default ``weather`` of 512MiB at 1024 chunks, `bench.pipeline_cases`)
without the rechunk, then with it, each on a freshly placed input: the workers' resident memory
summed, sampled every 5 ms, its peak above what it was before ``persist()``; and what the
arrays held at once, the busiest worker's `tracemalloc` peak above what it traced before (NumPy
reports its arrays' memory to `tracemalloc`: no allocator's cache, as the GPU bench's "CuPy arrays
at most"). Prints one line per run: the time, the memory before, the peak added, and the arrays'
peak added, in MiB.
"""

from __future__ import annotations

import math
import os
import sys
import time
import tracemalloc
from functools import partial

import psutil
from distributed import Client, LocalCluster, wait

import dask_redist
from dask_redist.bench.cases import placed_array
from dask_redist.bench.gpu_state import PeakWatch
from dask_redist.bench.pipeline_cases import build, pipeline_case


def peak_added(procs, run) -> tuple[float, int, int]:
    """``run()``'s seconds, the summed RSS of ``procs`` before it, and its peak above that."""

    def rss() -> int:
        return sum(p.memory_info().rss for p in procs)

    watch = PeakWatch(rss, every=0.005, limit=math.inf)
    start = time.perf_counter()
    try:
        run()
    finally:
        peak = watch.stop()
    return time.perf_counter() - start, watch.first, peak - watch.first


def _traced_from_now() -> int:
    """(On a worker) restart `tracemalloc`'s peak; the bytes it traces now."""
    if not tracemalloc.is_tracing():
        tracemalloc.start()
    tracemalloc.reset_peak()
    return tracemalloc.get_traced_memory()[0]


def _traced_peak() -> int:
    return tracemalloc.get_traced_memory()[1]


def computed(pipeline: str, case, x, token: int, rechunk: bool) -> None:
    """The pipeline's output persisted under `dask_redist.enable` (the ``dask`` engine), then let go."""
    with dask_redist.enable(engine="dask"):
        wait(build(pipeline, case, x, token, rechunk).persist())


def main(pipeline: str = "weather", size: str = "512MiB", nchunks: int = 1024, rounds: int = 2) -> None:
    case = pipeline_case(pipeline, size, nchunks)
    print(f"{pipeline}: {case.name}, input {case.nbytes / 2**20:.0f} MiB")
    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        procs = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        for token in range(rounds):
            for rechunk in (False, True):
                x = placed_array(client, case, token)
                time.sleep(1)  # (the placement's own memory settled)

                traced = client.run(_traced_from_now)
                took, before, added = peak_added(procs, partial(computed, pipeline, case, x, token, rechunk))
                arrays = max(peak - traced[w] for w, peak in client.run(_traced_peak).items())
                name = "with" if rechunk else "without"
                print(
                    f"{name:8s} {took:6.2f} s  before {before / 2**20:6.0f} MiB  peak +{added / 2**20:6.0f} MiB"
                    f"  arrays +{arrays / 2**20:6.0f} MiB"
                )
                del x
                time.sleep(2)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        *(args[:2]),
        *(int(a) for a in args[2:4]),
    )
