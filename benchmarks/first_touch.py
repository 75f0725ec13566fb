"""What filling fresh memory costs, by how long ago the process freed its last buffer.

On a VM whose freed memory goes back to its host (virtio-balloon free page reporting, as on the
CPU machine), pages freed some seconds before cost the host's page faults when touched again;
the cost shows as the thread's CPU time, not as waiting for a core.

    python benchmarks/first_touch.py --gaps 0.05 1 3 --reps 8
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=128)
    p.add_argument("--gaps", type=float, nargs="+", default=[0.05, 1.0, 3.0])
    p.add_argument("--reps", type=int, default=8)
    args = p.parse_args()
    n = args.mib * 2**20
    src = np.ones(n, np.uint8)
    for gap in args.gaps:
        runs = []
        for _ in range(args.reps):
            time.sleep(gap)
            t, c = time.perf_counter(), time.thread_time()
            buffer = np.empty(n, np.uint8)
            buffer[...] = src  # first touch
            first = ((time.perf_counter() - t) * 1e3, (time.thread_time() - c) * 1e3)
            t = time.perf_counter()
            buffer[...] = src  # the same pages again
            runs.append((*first, (time.perf_counter() - t) * 1e3))
            del buffer
        cells = ", ".join(f"{a:.0f}/{b:.0f}/{c:.0f}" for a, b, c in runs)
        print(
            f"freed {gap:g} s before: {args.mib} MiB filled (wall/CPU first touch, wall again, ms): {cells}"
        )


if __name__ == "__main__":
    main()
