"""``dask-redist demo | bench | doctor``."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys

from rich.console import Console
from rich.table import Table

console = Console()
DEFAULT_SIZE = ["1GiB"]


def _table(rows: list[dict], title: str = "") -> Table:
    t = Table(title=title, show_lines=False)
    for h in rows[0]:
        t.add_column(h, overflow="fold")
    for r in rows:
        t.add_row(*(str(v) for v in r.values()))
    return t


@contextlib.contextmanager
def _client(args):
    """A Client to ``--scheduler``, or to a local cluster started here (CUDA with --gpu)."""
    from distributed import Client, LocalCluster

    if args.scheduler:
        try:
            connected = Client(args.scheduler, timeout=args.wait_workers)
        except OSError as e:  # (TimeoutError too)
            raise SystemExit(
                f"dask-redist: could not reach a scheduler at {args.scheduler} within {args.wait_workers:g}s "
                f"({type(e).__name__}: {e}); check the address (e.g. tcp://host:8786) and that it is running"
            ) from None
        with connected as client:
            try:
                client.wait_for_workers(1, timeout=args.wait_workers)
            except TimeoutError:
                raise SystemExit(
                    f"dask-redist: no worker joined the scheduler at {args.scheduler} within {args.wait_workers:g}s; "
                    "start workers (`dask worker` / `dask cuda worker` with that address) or wait longer (--wait-workers)"
                ) from None
            yield client
        return
    if args.gpu:
        from dask_cuda import LocalCUDACluster

        cluster = LocalCUDACluster(n_workers=args.workers, dashboard_address=None, protocol=args.protocol)
    else:
        cluster = LocalCluster(
            n_workers=args.workers, threads_per_worker=args.threads, processes=True, dashboard_address=None,
            protocol=args.protocol,
        )  # fmt: skip
    with cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers)
        yield client


def _cluster_args(p: argparse.ArgumentParser, workers: int = 2):
    p.add_argument("--scheduler", help="address of a running scheduler (default: start a local cluster)")
    p.add_argument(
        "--wait-workers", type=float, default=60.0, metavar="SECONDS",
        help="with --scheduler: how long to wait for the scheduler, then for its first worker (default 60)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=workers, help="workers of the local cluster")
    p.add_argument("--threads", type=int, default=1, help="threads per worker of the local CPU cluster")
    p.add_argument("--gpu", action="store_true", help="LocalCUDACluster and CuPy chunks")
    p.add_argument("--protocol", default="tcp", help="tcp or ucx (local cluster)")


def demo(args) -> int:
    import dask_redist
    from dask_redist.bench import run_case, slab_case

    case = slab_case(args.size, args.chunks)
    kind = "cupy" if args.gpu else "numpy"
    with _client(args) as client:
        console.print(f"[bold]{case.name}[/]: shape {case.shape}, {len(client.scheduler_info()['workers'])} workers")
        from dask_redist.bench import placed_array

        x = placed_array(client, case, seed=0, kind=kind)
        with dask_redist.enable():
            console.print(str(dask_redist.explain(x.rechunk(case.new))), markup=False, highlight=False)
        engine = "redist-cufftmp" if args.gpu else "redist-dask"
        results = run_case(client, case, (engine, "tasks", "p2p"), reps=args.reps, kind=kind)
    console.print(_table([r.row() for r in results], "y = x.rechunk(new).persist(); wait(y)"))
    return 0 if all(r.correct is not False for r in results) else 1


def bench(args) -> int:
    from dask_redist import bench as b

    command = "dask-redist bench " + " ".join(shlex.quote(a) for a in args.argv)
    if args.scale:
        return _scale(args, command)
    if args.calibrate:
        return _calibrate(args, command)
    if args.micro:
        with _client(args) as client:
            env = b.environment(client)
            rows = [b.rewrite_time(args.rewrite_chunks), b.fixed_cost(client)]
        rows = [{k: (f"{v * 1e3:.1f} ms" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
        for r in rows:
            console.print(_table([r]))
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            lines = [f"Command: `{command}`  ", f"Date: {env['date']}; machine: {env['machine']}; {env['workers']} workers", ""]
            for r in rows:
                lines += ["| " + " | ".join(r) + " |", "|" + "---|" * len(r), "| " + " | ".join(map(str, r.values())) + " |", ""]
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
    for protocol, todo in _by_cluster(args, plan):
        with contextlib.ExitStack() as stack:
            try:
                client = stack.enter_context(_client(argparse.Namespace(**{**vars(args), "protocol": protocol})))
            except Exception as e:  # e.g. no UCX stack installed: say so in every row it would have filled
                error = f"{protocol} cluster did not start: {type(e).__name__}: {e}".splitlines()[0]
                console.print(f"[red]{error}[/]")
                results.update({(c.name, m): b.Result(c.name, m, c.nbytes, 0, 0, error=error) for c, ms in todo for m in ms})
                continue
            env = env or b.environment(client) | ({"ceiling": ceiling} if ceiling else {})
            for case, methods in todo:
                console.print(f"[bold]{case.name}[/] ({protocol}): {', '.join(methods)} ...")
                done = b.run_case(client, case, methods, reps=args.reps, kind=kind, ceiling=ceiling, interleave=args.interleave)
                console.print(_table([r.row() for r in b.relate_to_floor(done)]))
                results.update({(r.case, r.method): r for r in done})
                if stem:  # after every case: a run cut short keeps what it measured
                    _write(stem, _ordered(results, plan), env, command)
    ordered = _ordered(results, plan)
    for r in ordered:
        if r.timeline:
            console.print(f"timeline of the last {r.method} run of {r.case} (ms after submit):")
            for t, e in r.timeline:
                if t > -1000:
                    console.print(f"  {t:9.2f}  {e}")
    if stem and env:
        _write(stem, ordered, env, command)
        console.print(f"wrote {stem}.md and {stem}.json")
    console.print(_table([r.row() for r in b.relate_to_floor(ordered)], "all cases"))
    return 0 if all(r.correct is not False for r in ordered) else 1


def _calibrate(args, command: str) -> int:
    """The cost model of `redist.min-bytes: auto`, measured on this cluster, written as dask config."""
    import dask

    from dask_redist import bench as b
    from dask_redist.bench.calibrate import calibrate, write_model

    kind = "cupy" if args.gpu and not args.numpy else "numpy"
    if args.size is not None and len(args.size) != 2:
        raise SystemExit("dask-redist: --calibrate takes two --size values (small and large), or none")
    with _client(args) as client:
        env = b.environment(client)
        measured = f"{env['date']}, {env['machine']}, {env['workers']} workers, dask {env['dask']}"
        model, results = calibrate(client, kind, args.reps, args.size, measured,
                                   progress=lambda line: console.print(line, markup=False, highlight=False))  # fmt: skip
    console.print(_table([r.row() for r in results], "calibration runs"))
    path = write_model(model, args.out or dask.config.PATH, command)
    if args.out:
        _write(os.path.join(args.out, args.name), results, env, command)
    console.print(f"cost model {model.name}: dask {model.dask}, collective {model.collective}")
    console.print(f"wrote {path}" + ("" if args.out else " (dask's config directory: read by every new session)"))
    return 0 if all(r.correct is not False for r in results) else 1


def _scale(args, command: str) -> int:
    """The scale model: one run's planning and bookkeeping, no cluster (dask_redist.bench.scale)."""
    import json
    import platform
    from dataclasses import asdict
    from datetime import datetime, timezone

    from dask_redist.bench import scale

    results = scale.run_model(args.cases_scale, args.ranks, args.scale_chunks, reps=args.reps, budget_s=args.budget,
                              progress=lambda line: console.print(line, markup=False, highlight=False))  # fmt: skip
    env = f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, {os.cpu_count()} CPUs, one process"
    text = scale.markdown(results, command, env)
    console.print(text, markup=False, highlight=False)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        stem = os.path.join(args.out, args.name)
        with open(stem + ".md", "w") as f:
            f.write(text)
        with open(stem + ".json", "w") as f:
            json.dump({"command": command, "environment": env, "results": [asdict(m) for m in results]}, f, indent=1)
    return 0


def _bench_plan(args) -> list:
    """(case, methods) pairs: the suite's (narrowed by --methods), or the cases the options build."""
    from dask_redist import bench as b

    if args.suite:
        return [(case, tuple(m for m in ms if not args.methods or m in args.methods)) for case, ms in b.gpu_suite()]
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
    for protocol, wanted in ((base, lambda m: not m.endswith("-ucx") or base == "ucx"), ("ucx", lambda m: m.endswith("-ucx") and base != "ucx")):
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


def _write(stem: str, results: list, env: dict, command: str) -> None:
    from dask_redist import bench as b

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    with open(stem + ".md", "w") as f:
        f.write(b.markdown(results, env, command))
    with open(stem + ".json", "w") as f:
        f.write(b.to_json(results, env, command))


def soak(args) -> int:
    """Steps until ``--minutes`` or ``--steps``; a table per step kind; 1 on any violation."""
    import collections

    from dask.utils import parse_bytes

    from dask_redist.bench.soak import Soak

    kind = "cupy" if args.gpu and not args.numpy else "numpy"
    options = {"engine": args.engine} if args.engine else {}
    with _client(args) as client:
        s = Soak(client, seed=args.seed, kind=kind, max_bytes=parse_bytes(args.max_bytes), steps=args.kinds, **options)
        report = s.run(steps=args.steps, minutes=None if args.steps else args.minutes)
    by_kind = collections.defaultdict(list)
    for step in report.steps:
        by_kind[step.kind].append(step)
    rows = [
        {"step": k, "runs": len(v), "with problems": sum(bool(x.problems) for x in v),
         "median s": f"{sorted(x.seconds for x in v)[len(v) // 2]:.2f}", "max s": f"{max(x.seconds for x in v):.2f}",
         "re-submits Dask cancelled": sum(x.cancelled_by_dask for x in v),
         "memory + MiB per step": f"{sum(x.memory_delta for x in v) / len(v) / 2**20:+.1f}",
         "peers exited (stuck GPU)": sum(len(x.exited) for x in v)}
        for k, v in sorted(by_kind.items())
    ]  # fmt: skip
    console.print(_table(rows, f"soak: seed {args.seed}, {len(report.steps)} steps, {kind} chunks"))
    memory = [{"worker": w, "first MiB": m[0] >> 20, "last MiB": m[-1] >> 20, "max MiB": max(m) >> 20, "steps": len(m)}
              for w, m in report.memory.items() if m]  # fmt: skip
    if memory:
        console.print(_table(memory, "process memory after the steps (workers that were killed restart at 0)"))
    for line in report.problems:
        console.print(line, markup=False, highlight=False)
    console.print(f"{len(report.problems)} problems")
    return 1 if report.problems else 0


def doctor(args) -> int:
    from dask_redist.doctor import doctor as diagnose

    with _client(args) as client:
        diagnosis = diagnose(client)
    console.print(str(diagnosis), markup=False, highlight=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    from dask_redist.bench.soak import STEPS

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="dask-redist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="rechunk through the collective next to dask's own rechunk")
    _cluster_args(p)
    p.add_argument("--size", default="256MiB", help="array size (default 256MiB)")
    p.add_argument("--chunks", type=int, default=16, help="slabs before and after (default 16)")
    p.add_argument("--reps", type=int, default=3)
    p.set_defaults(func=demo)

    p = sub.add_parser("bench", help="time every method on placed inputs; write Markdown and JSON")
    _cluster_args(p)
    p.add_argument("--size", nargs="+", help="array sizes (default 1GiB)")
    p.add_argument("--chunks", nargs="+", type=int, default=[16, 64])
    p.add_argument("--dtype", nargs="+", default=["float64"])
    p.add_argument("--cases", nargs="+", default=["slab"], choices=["slab", "pencil"])
    p.add_argument(
        "--methods", nargs="+",
        help="redist-cufftmp redist-dask tasks p2p, tasks-ucx p2p-ucx (on a UCX cluster), nvmath (raw Redistribute), "
        "ceiling (peer-copy bound), floor (Dask's floor: a layer of one coroutine task per output chunk over a "
        "persisted input; every row then says how many times the floor it took); default: redist-dask tasks p2p, or the suite's",
    )  # fmt: skip
    p.add_argument("--suite", choices=["gpu"], help="the whole GPU table (cases and methods of bench.gpu_suite)")
    p.add_argument("--numpy", action="store_true", help="with --gpu: NumPy chunks on the dask-cuda workers")
    p.add_argument("--append", action="store_true", help="keep the results already in --out/--name, replace re-run ones")
    p.add_argument("--reps", type=int, default=3, help="timed runs of each method, after one warm-up (default 3)")
    p.add_argument(
        "--interleave", action="store_true",
        help="the methods of a case take turns, one run each (A B A B ...): on a shared machine whose speed "
        "drifts, all slow alike",
    )  # fmt: skip
    p.add_argument("--out", help="folder for <name>.md and <name>.json")
    p.add_argument("--name", default="results")
    p.add_argument("--micro", action="store_true", help="graph rewrite time and the fixed cost of one run")
    p.add_argument(
        "--calibrate", action="store_true",
        help="measure the cost model of redist.min-bytes: auto on this cluster (the collective and Dask's tasks "
        "on the calibration cases; --size SMALL LARGE to change their sizes) and write it as the dask config file "
        "redist-cost-model-<kind>-<workers>.yaml into --out, or into dask's config directory",
    )  # fmt: skip
    p.add_argument("--rewrite-chunks", type=int, default=10_000)
    p.add_argument("--scale", action="store_true", help="the scale model: planning and bookkeeping of one run, no cluster")
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 16, 256, 1024], help="--scale: rank counts")
    p.add_argument("--scale-chunks", nargs="+", type=int, default=[1_000, 10_000, 100_000, 1_000_000])
    p.add_argument("--cases-scale", nargs="+", default=["slab", "pencil", "uneven"], choices=["slab", "pencil", "uneven"])
    p.add_argument("--budget", type=float, default=10.0, help="--scale: a part slower than this (s) stops growing")
    p.set_defaults(func=bench)

    p = sub.add_parser("soak", help="random rechunks, cancels, re-submits, two clients, kills; invariants after each")
    _cluster_args(p, workers=3)
    p.add_argument("--minutes", type=float, default=20.0, help="how long (default 20; whole cycles of every step kind)")
    p.add_argument("--steps", type=int, help="this many steps instead of --minutes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-bytes", default="1MiB", help="largest array of a step (default 1MiB)")
    p.add_argument("--numpy", action="store_true", help="with --gpu: NumPy chunks on the dask-cuda workers")
    p.add_argument("--engine", choices=["auto", "cufftmp", "dask"], help="redist.engine for every rechunk")
    p.add_argument("--kinds", nargs="+", default=list(STEPS), choices=list(STEPS), help="step kinds to draw (default all)")
    p.set_defaults(func=soak)

    p = sub.add_parser("doctor", help="check every worker: GPU, CuPy, nvmath, cuFFTMp, NVSHMEM, engine")
    _cluster_args(p)
    p.set_defaults(func=doctor)

    args = parser.parse_args(argv)
    args.argv = argv[1:]
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
