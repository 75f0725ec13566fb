"""``dask-redist demo``, ``soak`` and ``doctor``."""

from __future__ import annotations

import time

from dask_redist.cli.clusters import client_for, quiet_p2p_logs
from dask_redist.cli.output import console, progress, show, text


def demo(args) -> int:
    import dask_redist
    from dask_redist.bench import run_case, slab_case
    from dask_redist.compat import worker_info

    case = slab_case(args.size, args.chunks)
    kind = "cupy" if args.gpu else "numpy"
    with client_for(args) as client:
        console.print(f"[bold]{case.name}[/]: shape {case.shape}, {len(worker_info(client))} workers")
        text(f"dashboard: {client.dashboard_link}")
        from dask_redist.bench import placed_array

        x = placed_array(client, case, seed=0, kind=kind)
        with dask_redist.enable():
            explanation = dask_redist.explain(x.rechunk(case.new))
            text(str(explanation))
        entry = explanation[0] if len(explanation) else None
        engine = (
            entry.engine if entry is not None and entry.runs == "collective" else "auto"
        )  # as `auto` picks
        results = run_case(client, case, (f"redist-{engine}", "tasks"), reps=args.reps, kind=kind)
        with quiet_p2p_logs():
            results += run_case(client, case, ("p2p",), reps=args.reps, kind=kind)
    show([r.row() for r in results], "y = x.rechunk(new).persist(); wait(y)")
    return 0 if all(r.correct is not False for r in results) else 1


def soak(args) -> int:
    """Steps until ``--minutes`` or ``--steps``; a table per step kind; 1 on any violation."""
    import collections

    from dask.utils import parse_bytes

    from dask_redist.bench.soak import Soak

    kind = "cupy" if args.gpu and not args.numpy else "numpy"
    options = {"engine": args.engine} if args.engine else {}

    start, total = time.monotonic(), args.steps or 60 * args.minutes
    with client_for(args) as client, progress(f"soak, seed {args.seed}", total) as update:

        def step_done(line: str) -> None:  # as it goes: a stall shows where it stopped
            console.print(line, markup=False, highlight=False, soft_wrap=True)
            update(completed=len(s.report.steps) if args.steps else time.monotonic() - start)

        s = Soak(
            client,
            seed=args.seed,
            kind=kind,
            max_bytes=parse_bytes(args.max_bytes),
            steps=args.kinds,
            gpu=args.gpu,
            progress=step_done,
            **options,
        )
        report = s.run(steps=args.steps, minutes=None if args.steps else args.minutes)
    by_kind = collections.defaultdict(list)
    for step in report.steps:
        by_kind[step.kind].append(step)
    rows = [
        {
            "step": k,
            "runs": len(v),
            "with problems": sum(bool(x.problems) for x in v),
            "median s": f"{sorted(x.seconds for x in v)[len(v) // 2]:.2f}",
            "max s": f"{max(x.seconds for x in v):.2f}",
            "re-submits Dask cancelled": sum(x.cancelled_by_dask for x in v),
            "memory + MiB per step": f"{sum(x.memory_delta for x in v) / len(v) / 2**20:+.1f}",
            "peers exited (stuck GPU)": sum(len(x.exited) for x in v),
        }
        for k, v in sorted(by_kind.items())
    ]
    show(rows, f"soak: seed {args.seed}, {len(report.steps)} steps, {kind} chunks")
    memory = [
        {
            "worker": w,
            "first MiB": m[0] >> 20,
            "last MiB": m[-1] >> 20,
            "max MiB": max(m) >> 20,
            "steps": len(m),
        }
        for w, m in report.memory.items()
        if m
    ]
    if memory:
        show(memory, "process memory after the steps (workers that were killed restart at 0)")
    for line in report.problems:
        console.print(line, markup=False, highlight=False)
    console.print(f"{len(report.problems)} problems")
    return 1 if report.problems else 0


def doctor(args) -> int:
    from dask_redist.doctor import doctor as diagnose

    with client_for(args) as client:
        diagnosis = diagnose(client)
    text(str(diagnosis))
    return 0
