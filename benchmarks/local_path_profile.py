"""The host side of a one-PE `cufftmp` run, on CPU: what a world of one PE does between the
scheduler's start and the copy kernel's launch, with NumPy stand-ins for the GPU.

The slab case of `dask-redist bench` (`bench.slab_case`, 8 GiB float64 by default), one rank
holding every input chunk, timed step by step as the worker runs it (`engines/cufftmp/engine.py`):

    scheduler   make_plan(spec, in_ranks, 1)            the owners chosen (before "start sent")
    worker      RunSpec.plan                            the plan re-derived with the owners given
                _empty_outputs(run, xp)                the output chunks allocated
                _local_jobs(run, outputs)               the copy jobs, piece by piece
                the same, a second run of the rechunk   (a table kept from the first, since 2026-12-02)

CuPy arrays are stood in by objects with the attributes the engine reads (``data.ptr``,
``flags.c_contiguous``, ``ndim``, ``shape``), so no memory is allocated; the allocation and
the kernel itself are the GPU's and are not timed here. ``--profile`` prints cProfile's top
functions of the worker's steps at the largest chunk count.

    python benchmarks/local_path_profile.py --chunks 2 16 64 256 1024 --reps 5
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import pstats
import statistics
import time
from types import SimpleNamespace

import numpy as np

from dask_redist.bench import slab_case
from dask_redist.config import Settings
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.engines.cufftmp.engine import LOCAL_MAX_PIECES, _local_jobs

try:
    from dask_redist.engines.cufftmp.engine import _empty_outputs
except ImportError:  # the tree before 2026-12-02's change
    _empty_outputs = None
from dask_redist.planning import RechunkSpec, make_plan


class StandIn:
    """What the engine reads of a C-contiguous CuPy array, at a made-up device address."""

    def __init__(self, shape, itemsize, ptr):
        self.shape, self.ndim = shape, len(shape)
        self.nbytes = int(np.prod(shape)) * itemsize
        self.data = SimpleNamespace(ptr=ptr)
        self.flags = SimpleNamespace(c_contiguous=True)


def chunks_of(count, box_of, flats, itemsize):
    out, ptr = {}, 1 << 40
    for flat in flats:
        lo, hi = box_of(flat)
        out[flat] = StandIn(tuple(h - l for l, h in zip(lo, hi)), itemsize, ptr)
        ptr += -(-out[flat].nbytes // 512) * 512
    return out


class StandInCuPy:
    """``xp.empty`` handing out stand-ins, one after the other in a made-up address space."""

    def __init__(self):
        self.ptr = 1 << 41

    def empty(self, shape, dtype):
        out = StandIn(shape, np.dtype(dtype).itemsize, self.ptr)
        self.ptr += -(-out.nbytes // 512) * 512
        return out


def _outputs(run, owned):
    """The engine's allocation of the outputs (``_empty_outputs``; before 2026-12-02, its loop)."""
    if _empty_outputs is not None:
        return _empty_outputs(run, StandInCuPy())
    xp, spec, outputs = StandInCuPy(), run.spec.collective, {}
    for flat in owned:
        lo, hi = spec.rechunk.new_box(flat)
        outputs[flat] = xp.empty(tuple(h - l for l, h in zip(lo, hi)), dtype=spec.dtype)
    return outputs


def _jobs(run, outputs, kept):
    """``_local_jobs``, with the tables of earlier runs where it keeps them (since 2026-12-02)."""
    if "kept" in inspect.signature(_local_jobs).parameters:
        return _local_jobs(run, outputs, kept)
    return _local_jobs(run, outputs)


def one_run(size, n):
    """The steps of one run and of a second run of the same rechunk (seconds each), its job table."""
    case = slab_case(size, n)
    rechunk = RechunkSpec(case.old, case.new, np.dtype(case.dtype).itemsize)
    spec = CollectiveSpec("t" * 32, "in", "out", rechunk, np.dtype(case.dtype), Settings(), "cupy")
    in_ranks = np.zeros(rechunk.old_grid, np.int64)
    times, kept = {}, {}
    t0 = time.perf_counter()
    chosen = make_plan(rechunk, in_ranks, 1)
    times["scheduler: owners"] = time.perf_counter() - t0
    for seq, step in ((1, "jobs"), (2, "jobs again")):  # the second: fresh chunks, the same rechunk
        run_spec = RunSpec(
            spec, seq, seq, ("w",), in_ranks, chosen.out_ranks, chosen.needed, "cufftmp", "cupy"
        )
        inputs = chunks_of(n, rechunk.old_box, range(len(case.old[0])), rechunk.itemsize)
        t0 = time.perf_counter()
        plan = run_spec.plan
        owned = plan.owned(0)
        times.setdefault("worker: plan + owned", time.perf_counter() - t0)
        run = SimpleNamespace(spec=run_spec, plan=plan, inputs=inputs, rank=0, state="running")
        t0 = time.perf_counter()
        outputs = _outputs(run, owned)
        times.setdefault("worker: outputs", time.perf_counter() - t0)
        t0 = time.perf_counter()
        jobs = _jobs(run, outputs, kept)
        times[f"worker: {step}"] = time.perf_counter() - t0
    return times, jobs, plan.piece_count


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8GiB")
    parser.add_argument("--chunks", type=int, nargs="+", default=[2, 16, 64, 256, 1024])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    print(f"| chunks | pieces | jobs | {' | '.join(one_run(args.size, 2)[0])} | worker total |")
    print("|---|---|---|" + "---|" * (len(one_run(args.size, 2)[0]) + 1))
    for n in args.chunks:
        runs = [one_run(args.size, n) for _ in range(args.reps)]
        steps = {k: statistics.median(r[0][k] for r in runs) * 1e3 for k in runs[0][0]}
        worker = statistics.median(
            sum(v for k, v in r[0].items() if k.startswith("worker") and "again" not in k) for r in runs
        )
        jobs = runs[0][1]
        count = "arena rounds" if jobs is None else len(jobs)
        cells = " | ".join(f"{v:.2f}" for v in steps.values())
        print(f"| {n} | {runs[0][2]} | {count} | {cells} | {worker * 1e3:.2f} |")
    print(
        f"(ms, medians of {args.reps}; one-PE runs copy chunk to chunk up to {LOCAL_MAX_PIECES} pieces; "
        '"jobs again": a second run of the same rechunk, fresh chunks; "worker total": the first run\'s)'
    )
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        one_run(args.size, max(args.chunks))
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())


if __name__ == "__main__":
    main()
