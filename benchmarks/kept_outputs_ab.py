"""Output chunks that a fused consumer reads: in kept buffers (B, `engines.exchange.output_allocator`)
or in fresh memory (A, as before), the bench's own pipeline runs alternating in one cluster.

Each repetition runs, in turn, ``without``, ``with`` under A and under B (each first every other
repetition) and ``bare``
(`dask_redist.bench.pipeline`: each run has an input of its own, and each is checked). The script
prints the medians, what the rechunk adds under each side against issue 40's CPU limit
(1.1 x bare + 10 ms), and B / A pair by pair.

    python benchmarks/kept_outputs_ab.py --pipelines fft elementwise --size 256MiB --chunks 16 64 --reps 8
"""

from __future__ import annotations

import argparse
import statistics
import time


def mode(which, dask_worker=None):
    """A: output chunks in fresh memory (``empty`` like the received arrays); B: as shipped."""
    import dask_redist.engines.dask as de
    from dask_redist.core.assemble import empty

    if not hasattr(de, "_ab_real"):
        de._ab_real = de.output_allocator
    if which == "A":
        de.output_allocator = lambda run, like: lambda shape: empty(like, shape, run.spec.collective.dtype)
    else:
        de.output_allocator = de._ab_real


def main() -> None:
    from argparse import Namespace

    from dask_redist.bench import pipeline as bp
    from dask_redist.cli.clusters import client_for

    p = argparse.ArgumentParser()
    p.add_argument("--pipelines", nargs="+", default=["fft", "elementwise"])
    p.add_argument("--size", default="256MiB")
    p.add_argument("--chunks", nargs="+", type=int, default=[16, 64])
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    args = Namespace(
        scheduler=None,
        workers=a.workers,
        threads=1,
        gpu=False,
        pes_per_gpu=0,
        protocol="tcp",
        wait_workers=60,
    )
    print(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), vars(a), flush=True)
    with client_for(args) as client:
        opts = bp.Options("dask", "numpy", a.reps, 0, True, a.workers)
        for pipeline in a.pipelines:
            for n in a.chunks:
                case = bp.pipeline_case(pipeline, a.size, n)
                rows = {m: bp._row(case, pipeline, m) for m in ("without", "A", "B", "bare")}
                for rep in range(a.reps + 1):
                    for m in ("without", *("AB" if rep % 2 else "BA"), "bare"):  # (A and B take turns first)
                        if m in "AB":
                            client.run(mode, m)
                        method = m if m in ("without", "bare") else "with"
                        bp._one_run(client, pipeline, case, method, rows[m], opts, timed=rep > 0)
                client.run(mode, "B")
                report(pipeline, n, rows)


def report(pipeline: str, n: int, rows: dict) -> None:
    errors = {m: r.error for m, r in rows.items() if r.error or r.correct is False}
    if errors:
        print(f"{pipeline} {n}: failed {errors}", flush=True)
        return
    med = {m: statistics.median(r.times) * 1e3 for m, r in rows.items()}
    limit = 1.1 * med["bare"] + 10
    ratios = [b / a for a, b in zip(rows["A"].times, rows["B"].times)]
    print(
        f"{pipeline} {n} chunks: without {med['without']:.1f}, with A {med['A']:.1f}, with B {med['B']:.1f}, "
        f"bare {med['bare']:.1f} ms; adds A {med['A'] - med['without']:.1f}, B {med['B'] - med['without']:.1f} "
        f"against {limit:.1f}; B/A pair by pair: median {statistics.median(ratios):.3f} "
        f"({min(ratios):.3f}-{max(ratios):.3f}); runs A {[round(t * 1e3) for t in rows['A'].times]}, "
        f"B {[round(t * 1e3) for t in rows['B'].times]}",
        flush=True,
    )


if __name__ == "__main__":
    main()
