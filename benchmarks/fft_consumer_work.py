"""What the `fft` pipeline's last transform costs per chunk, before and after the rechunk: is the
bench's ``without`` row the same work as its ``with`` row?

    python benchmarks/fft_consumer_work.py [SIZE] [REPS]

For the bench's complex128 cube of ``SIZE`` (default 256MiB, `bench.cases.slab_case`) at 16, 64,
256 and 1024 chunks, NumPy's (or with ``--gpu`` as the third argument, CuPy's) time for one
chunk's transform, the fastest of REPS (default 9): along axis 0 of a slab (``without`` before
2026-12-05), along axis 1 of a slab (``without`` since) and along axis 0 of a chunk after the
rechunk (``with``). Prints one line per chunk count, in ms.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from dask_redist.bench.cases import slab_case


def fastest(f, block, reps: int, sync) -> float:
    best = float("inf")
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        f(block)
        sync()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main(size: str = "256MiB", reps: int = 9, gpu: bool = False) -> None:
    if gpu:
        import cupy as xp

        sync = xp.cuda.Device().synchronize
    else:
        xp, sync = np, lambda: None
    print("chunks | axis 0 of a slab (old without) | axis 1 of a slab (without) | axis 0 after (with)")
    for n in (16, 64, 256, 1024):
        case = slab_case(size, n, "complex128")
        n0, n1, n2 = case.shape
        slab = xp.ones((case.old[0][0], n1, n2), dtype=xp.complex128)
        after = xp.ones((n0, case.new[1][0], n2), dtype=xp.complex128)
        times = [
            fastest(lambda b: xp.fft.fft(b, axis=0), slab, reps, sync),
            fastest(lambda b: xp.fft.fft(b, axis=1), slab, reps, sync),
            fastest(lambda b: xp.fft.fft(b, axis=0), after, reps, sync),
        ]
        print(f"{n} | " + " | ".join(f"{t:.2f}" for t in times))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "256MiB", int(args[1]) if len(args) > 1 else 9, "--gpu" in args)
