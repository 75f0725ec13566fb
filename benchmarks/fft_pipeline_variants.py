"""Which side of the fft pipeline slows its exchange on CPU: producer and consumer varied one at a
time, 2 worker processes (1 thread each unless given), 256 MiB complex128 in 64 slabs along axis 0
rechunked to 64 along axis 1, the `dask` engine; medians of REPS, the variants interleaved.

    python benchmarks/fft_pipeline_variants.py [REPS] [THREADS] [fresh]

"fresh": a new input persisted before every run, as `dask-redist bench` places one (else one input,
persisted once, reused). Every variant but "x+0 > rc" has its producer fused into the stage tasks; "fft2 > fft1" is the
pipeline without the rechunk, its last transform as long as "fft2 > rc > fft0"'s (the bench's `without` since 2026-12-05);
"fft2 > fft0" was, until then: a transform along axis 0 of each slab, 4 long. Figures: docs/benchmarks.md ("Pipelines on
CPU", "The `fft` row's baseline").
"""

from __future__ import annotations

import statistics
import sys
import time

import dask.array as da
import numpy as np
from distributed import Client, LocalCluster, wait

import dask_redist

SHAPE, OLD, NEW = (256, 256, 256), (4, 256, 256), (256, 4, 256)


def fft2(b):
    return np.fft.fft2(b, axes=(1, 2))


def fft0(b):
    return np.fft.fft(b, axis=0)


def fft1(b):
    return np.fft.fft(b, axis=1)


def copy(b):
    return b * 1


def first(b):
    return b[:1, :1].copy()


VARIANTS = {
    "x+0 > rc": lambda x: x.rechunk(NEW),
    "copy > rc > first": lambda x: x.map_blocks(copy).rechunk(NEW).map_blocks(first, chunks=(1, 1, 1)),
    "fft2 > rc > first": lambda x: x.map_blocks(fft2).rechunk(NEW).map_blocks(first, chunks=(1, 1, 1)),
    "copy > rc > fft0": lambda x: x.map_blocks(copy).rechunk(NEW).map_blocks(fft0),
    "fft2 > rc > fft0": lambda x: x.map_blocks(fft2).rechunk(NEW).map_blocks(fft0),
    "fft2 > fft0": lambda x: x.map_blocks(fft2).map_blocks(fft0),
    "fft2 > fft1": lambda x: x.map_blocks(fft2).map_blocks(fft1),
}


def main(reps: int, threads: int, fresh: bool) -> None:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=threads, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        rng = np.random.default_rng(0)
        x = base = client.persist(da.from_array(rng.random(SHAPE) + 1j * rng.random(SHAPE), chunks=OLD))
        wait(x)
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        with dask_redist.enable(engine="dask"):
            for rep in range(reps):
                for name, build in VARIANTS.items():
                    if fresh:
                        x = client.persist(base * (rep + 1))  # (made on the workers)
                        wait(x)
                    y = build(x + 0 * rep)  # (a new graph each rep)
                    start = time.perf_counter()
                    wait(y.persist())
                    times[name].append(time.perf_counter() - start)
        for name, t in times.items():
            print(f"{name:20s} median {1e3 * statistics.median(t):7.1f} ms  min {1e3 * min(t):7.1f} ms")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(int(args[0]) if args else 5, int(args[1]) if len(args) > 1 else 1, "fresh" in args[2:])
