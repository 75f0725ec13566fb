"""Is the exchange slower inside the `fft` pipeline than alone (CPU, 2 worker processes, the
`dask` engine)? The bench's 16-chunk `fft` row: 256 MiB complex128 slabs to slabs, under
`dask_redist.enable(engine="dask")`, five variants around the same rechunk:

    python benchmarks/exchange_in_pipeline.py [REPS]

``bare`` (the persisted input rechunked), a producer fused into the stage tasks (``x * 1``, or
``fft2`` over axes 1 and 2), a consumer fused into the unpack tasks (``fft`` along axis 0), and
both. Each run on a fresh input, the variants taking turns, one untimed round first. Prints, per
variant, the medians of the whole run and of the exchange (the scheduler's start sent to the
last worker's executed) in ms, then every run's exchange: the machine's fast and slow modes
(docs/benchmarks.md, "Where the CPU runs' slow mode came from") show as two groups.
"""

from __future__ import annotations

import statistics
import sys
import time

import dask_redist
import numpy as np
from distributed import Client, LocalCluster, wait

from dask_redist.bench import placed_array
from dask_redist.bench.harness import timeline
from dask_redist.bench.pipeline import pipeline_case


def _fft2(b):
    return np.fft.fft2(b, axes=(1, 2))


def _fft0(b):
    return np.fft.fft(b, axis=0)


def _times_one(b):
    return b * 1


VARIANTS = {
    "bare": lambda x, new: x.rechunk(new),
    "producer x*1": lambda x, new: x.map_blocks(_times_one).rechunk(new),
    "producer fft2": lambda x, new: x.map_blocks(_fft2).rechunk(new),
    "consumer fft0": lambda x, new: x.rechunk(new).map_blocks(_fft0),
    "both": lambda x, new: x.map_blocks(_fft2).rechunk(new).map_blocks(_fft0),
}


def one_run(client, case, build, seed: int) -> tuple[float, float]:
    """(the run, its exchange) in ms."""
    x = placed_array(client, case, seed, kind="numpy")
    with dask_redist.enable(engine="dask"):
        start = time.perf_counter()
        wait(build(x, case.new).persist())
        total = (time.perf_counter() - start) * 1e3
    marks: dict[str, float] = {}
    for t, event in timeline(client, start):
        if t >= 0:
            marks.setdefault(event, t)
    executed = max(t for e, t in marks.items() if e.endswith("executed"))
    return total, executed - marks["scheduler: start sent"]


def main(reps: int) -> None:
    case = pipeline_case("fft", "256MiB", 16)
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        runs: dict[str, list] = {name: [] for name in VARIANTS}
        for rep in range(reps + 1):
            for name, build in VARIANTS.items():
                got = one_run(client, case, build, 100 + rep)
                if rep:
                    runs[name].append(got)
        print(f"{'variant':16} {'run ms':>8} {'exchange ms':>12}  every exchange")
        for name, rows in runs.items():
            total, exchange = (statistics.median(r[i] for r in rows) for i in (0, 1))
            print(f"{name:16} {total:8.1f} {exchange:12.1f}  {[round(r[1]) for r in rows]}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 7)
