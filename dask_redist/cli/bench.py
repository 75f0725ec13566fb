"""``dask-redist bench``: every method timed on the same placed input, Markdown and JSON out."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex

from dask_redist.cli.clusters import client_for
from dask_redist.cli.output import console, progress, show, text

DEFAULT_SIZE = ["1GiB"]  # (--size: the calibration has sizes of its own)


def bench(args) -> int:
    from dask_redist import bench as b

    command = "dask-redist bench " + " ".join(shlex.quote(a) for a in args.argv)
    if args.scale:
        return _scale(args, command)
    if args.fft:
        from dask_redist.bench import fft

        return fft.main(args, command, client_for, show, write)
    if args.pipeline:
        from dask_redist.bench import pipeline

        return pipeline.main(args, command, client_for, show)
    if args.calibrate:
        return _calibrate(args, command)
    if args.micro:
        with client_for(args) as client:
            env = b.environment(client)
            rows = [b.rewrite_time(args.rewrite_chunks), b.fixed_cost(client)]
        rows = [{k: (f"{v * 1e3:.1f} ms" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
        for r in rows:
            show([r])
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            lines = [
                f"Command: `{command}`  ",
                f"Date: {env['date']}; machine: {env['machine']}; {env['workers']} workers",
                "",
            ]
            for r in rows:
                lines += [
                    "| " + " | ".join(r) + " |",
                    "|" + "---|" * len(r),
                    "| " + " | ".join(map(str, r.values())) + " |",
                    "",
                ]
            with open(os.path.join(args.out, args.name + ".md"), "w") as f:
                f.write("\n".join(lines))
        return 0
    kind = "cupy" if args.gpu and not args.numpy else "numpy"
    plan = _bench_plan(args)
    ceiling = _ceiling(host=args.numpy) if args.gpu else None
    stem = os.path.join(args.out, args.name) if args.out else None
    results, env = {}, None
    if args.append and stem and os.path.exists(stem + ".json"):
        earlier, earlier_command = b.load_json(stem + ".json")
        results = {(r.case, r.method): r for r in earlier}
        command = earlier_command + " && " + command
    clusters = _by_cluster(args, plan)
    bar = contextlib.ExitStack()
    advance = bar.enter_context(progress("bench", sum(len(todo) for _, todo in clusters)))
    for protocol, todo in clusters:
        with contextlib.ExitStack() as stack:
            try:
                client = stack.enter_context(
                    client_for(argparse.Namespace(**{**vars(args), "protocol": protocol}))
                )
            except Exception as e:  # e.g. no UCX stack installed: say so in every row it would have filled
                error = f"{protocol} cluster did not start: {type(e).__name__}: {e}".splitlines()[0]
                console.print(f"[red]{error}[/]")
                results.update(
                    {
                        (c.name, m): b.Result(c.name, m, c.nbytes, 0, 0, error=error)
                        for c, ms in todo
                        for m in ms
                    }
                )
                advance(advance=len(todo))
                continue
            env = env or b.environment(client) | ({"ceiling": ceiling} if ceiling else {})
            for case, methods in todo:
                console.print(f"[bold]{case.name}[/] ({protocol}): {', '.join(methods)} ...")
                advance(description=f"bench: {case.name} ({protocol})")
                done = b.run_case(
                    client,
                    case,
                    methods,
                    reps=args.reps,
                    kind=kind,
                    ceiling=ceiling,
                    interleave=args.interleave,
                )
                show([r.row() for r in b.relate_to_floor(done)])
                results.update({(r.case, r.method): r for r in done})
                if stem:  # after every case: a run cut short keeps what it measured
                    write(stem, _ordered(results, plan), env, command)
                advance(advance=1)
    bar.close()
    ordered = _ordered(results, plan)
    for r in ordered:
        if r.timeline:
            console.print(f"timeline of the last {r.method} run of {r.case} (ms after submit):")
            for t, e in r.timeline:
                if t > -1000:
                    console.print(f"  {t:9.2f}  {e}")
    if stem and env:
        write(stem, ordered, env, command)
        console.print(f"wrote {stem}.md and {stem}.json")
    show([r.row() for r in b.relate_to_floor(ordered)], "all cases")
    return 0 if all(r.correct is not False for r in ordered) else 1


def _calibrate(args, command: str) -> int:
    """The cost model of `redist.min-bytes: auto`, measured on this cluster, written as dask config."""
    import dask

    from dask_redist import bench as b
    from dask_redist.bench.calibrate import calibrate, write_model
    from dask_redist.config import COST_TERMS

    kind = "cupy" if args.gpu and not args.numpy else "numpy"
    if args.size is not None and len(args.size) != 2:
        raise SystemExit("dask-redist: --calibrate takes two --size values (small and large), or none")
    with client_for(args) as client:
        env = b.environment(client)
        measured = f"{env['date']}, {env['machine']}, {env['workers']} workers, dask {env['dask']}"
        model, results = calibrate(
            client,
            kind,
            args.reps,
            args.size,
            measured,
            progress=lambda line: console.print(line, markup=False, highlight=False),
        )
    show([r.row() for r in results], "calibration runs")
    path = write_model(model, args.out or dask.config.PATH, command)
    if args.out:
        write(os.path.join(args.out, args.name), results, env, command)
    lines = ", ".join(f"{method} {line}" for method, line in zip(COST_TERMS, model.lines()))
    console.print(f"cost model {model.name}: {lines}")
    console.print(
        f"wrote {path}" + ("" if args.out else " (dask's config directory: read by every new session)")
    )
    return 0 if all(r.correct is not False for r in results) else 1


def _scale(args, command: str) -> int:
    """The scale model: one run's planning and bookkeeping, no cluster (dask_redist.bench.scale)."""
    import json
    import platform
    from dataclasses import asdict
    from datetime import datetime, timezone

    from dask_redist.bench import scale

    results = scale.run_model(
        args.cases_scale,
        args.ranks,
        args.scale_chunks,
        reps=args.reps,
        budget_s=args.budget,
        progress=lambda line: console.print(line, markup=False, highlight=False),
    )
    env = f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, {os.cpu_count()} CPUs, one process"
    page = scale.markdown(results, command, env)
    text(page)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, args.name)
        with open(stem + ".md", "w") as f:
            f.write(page)
        with open(stem + ".json", "w") as f:
            json.dump(
                {"command": command, "environment": env, "results": [asdict(m) for m in results]}, f, indent=1
            )
    return 0


def _bench_plan(args) -> list:
    """(case, methods) pairs: the suite's (narrowed by --methods), or the cases the options build."""
    from dask_redist import bench as b

    if args.suite:
        return [
            (case, tuple(m for m in ms if not args.methods or m in args.methods))
            for case, ms in b.gpu_suite()
        ]
    methods = tuple(args.methods or ("redist-dask", "tasks", "p2p"))
    plan, names = [], set()
    for size in args.size or DEFAULT_SIZE:
        for dtype in args.dtype:
            for n in args.chunks:
                cases = [b.slab_case(size, n, dtype)] if "slab" in args.cases else []
                cases += [b.pencil_case(size, max(1, round(n**0.5)), dtype)] if "pencil" in args.cases else []
                for case in cases:  # (results are kept by case name: a second one would replace the first)
                    if case.name in names:
                        console.print(f"[yellow]--chunks {n}: {case.name} is planned already; run once[/]")
                        continue
                    names.add(case.name)
                    plan.append((case, methods))
    return plan


def _ceiling(host: bool = False) -> dict | None:
    """The peer-copy ceiling (and, for NumPy chunks, the host link's), or None where not measurable."""
    from dask_redist.bench.baselines import host_ceiling, link_ceiling

    ceiling = {}
    for what, measure in (("peer", link_ceiling), ("host", host_ceiling if host else None)):
        if measure is None:
            continue
        try:
            ceiling.update(measure())
        except Exception as e:
            console.print(f"[yellow]no {what} ceiling measured: {type(e).__name__}: {e}[/]")
    console.print(f"physical ceiling: {ceiling}")
    return ceiling or None


def _by_cluster(args, plan) -> list:
    """(protocol, [(case, methods)]) per cluster to start: methods named ``-ucx`` get a UCX one.

    With --scheduler every method runs on that cluster, over its own protocol; with
    ``--protocol ucx`` every method runs on a UCX cluster (``-ucx`` names are then redundant).
    """
    if args.scheduler:
        return [(args.protocol, plan)]
    groups = []
    base = args.protocol  # the cluster of methods not named -ucx
    for protocol, wanted in (
        (base, lambda m: not m.endswith("-ucx") or base == "ucx"),
        ("ucx", lambda m: m.endswith("-ucx") and base != "ucx"),
    ):
        todo = [(case, [m for m in methods if wanted(m)]) for case, methods in plan]
        if todo := [(case, methods) for case, methods in todo if methods]:
            groups.append((protocol, todo))
    return groups


def _ordered(results: dict, plan) -> list:
    """Results grouped by case (cases in the order first seen), methods in the order they ran.

    With --append, re-run results keep the place of the ones they replace.
    """
    cases: dict = {}
    for name in [r.case for r in results.values()] + [case.name for case, _ in plan]:
        cases.setdefault(name, len(cases))
    return sorted(results.values(), key=lambda r: cases[r.case])


def write(stem: str, results: list, env: dict, command: str) -> None:
    from dask_redist import bench as b

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".md", "w") as f:
        f.write(b.markdown(results, env, command))
    with open(stem + ".json", "w") as f:
        f.write(b.to_json(results, env, command))
