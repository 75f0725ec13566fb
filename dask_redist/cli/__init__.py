"""The ``dask-redist`` command line: demo, bench, soak, doctor (``dask-redist COMMAND --help``)."""

from __future__ import annotations

import argparse
import sys

from dask_redist.cli import arguments as types
from dask_redist.cli.bench import bench
from dask_redist.cli.clusters import cluster_args
from dask_redist.cli.commands import demo, doctor, soak

#: ``dask-redist --help``'s description.
DESCRIPTION = """dask-redist: a Dask array rechunk as one collective step across the workers.

Commands: demo (the collective next to Dask's own rechunks), bench (time every method, write
Markdown and JSON), soak (random rechunks, cancels, kills; invariants checked after each step),
doctor (check every worker). `dask-redist COMMAND --help`: its options. Tables fit the
terminal, or are Markdown where the output is not one (a file, a pipe, a CI log).
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if (check := getattr(args, "check", None)) is not None:
        check(args)  # (argparse's usage error, exit 2, where what the options ask together cannot run)
    args.argv = argv[1:]
    if not hasattr(args, "log_file"):  # (no cluster: nothing logs)
        return args.func(args)
    from dask_redist.cli.output import log_path, logs_to_file

    with logs_to_file(log_path(args.command, args.log_file)):
        return args.func(args)


def parser() -> argparse.ArgumentParser:
    """The command line: every command and option, with its help."""
    from dask_redist.bench.soak import STEPS
    from dask_redist.config import BUILTIN_ENGINES, ConfigError, Settings

    try:
        engines = dict(Settings.from_config().engines)  # redist.engines: the built-in ones and any added
    except ConfigError:  # (said when a command reads the settings; --help still works)
        engines = dict(BUILTIN_ENGINES)
    parser = argparse.ArgumentParser(
        prog="dask-redist", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench,soak,doctor}")

    p = sub.add_parser("demo", help="rechunk through the collective next to dask's own rechunk")
    cluster_args(p)
    p.add_argument("--size", type=types.size, default="256MiB", help="array size (default 256MiB)")
    p.add_argument("--chunks", type=types.at_least(1), default=16, help="slabs before and after (default 16)")
    p.add_argument(
        "--reps",
        type=types.at_least(1),
        default=3,
        help="timed runs of each method, after one warm-up (default 3)",
    )
    p.set_defaults(func=demo)

    p = sub.add_parser("bench", help="time every method on placed inputs; write Markdown and JSON")
    cluster_args(p)
    p.add_argument("--size", nargs="+", type=types.size, help="array sizes, e.g. 256MiB 1GiB (default 1GiB)")
    p.add_argument(
        "--chunks",
        nargs="+",
        type=types.at_least(1),
        default=[16, 64],
        help="chunks before and after (default 16 64)",
    )
    p.add_argument(
        "--dtype",
        nargs="+",
        type=types.dtype,
        default=["float64"],
        help="NumPy dtypes of the arrays (default float64)",
    )
    p.add_argument(
        "--cases",
        nargs="+",
        default=["slab"],
        choices=["slab", "pencil"],
        help="slab: slabs along one axis to slabs along another; pencil: pencils to pencils (default slab)",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        help=f"redist-ENGINE ({', '.join(engines)}), tasks p2p, tasks-ucx p2p-ucx (on a UCX cluster), nvmath (raw "
        "Redistribute), ceiling (peer-copy bound), floor (Dask's floor: a layer of one coroutine task per output "
        "chunk over a persisted input; every row then says how many times the floor it took); default: "
        "redist-dask tasks p2p, or the suite's",
    )
    p.add_argument(
        "--suite", choices=["gpu"], help="the whole GPU table (cases and methods of bench.gpu_suite)"
    )
    p.add_argument("--numpy", action="store_true", help="with --gpu: NumPy chunks on the dask-cuda workers")
    p.add_argument(
        "--append", action="store_true", help="keep the results already in --out/--name, replace re-run ones"
    )
    p.add_argument(
        "--reps",
        type=types.at_least(1),
        default=3,
        help="timed runs of each method, after one warm-up (default 3)",
    )
    p.add_argument(
        "--interleave",
        action="store_true",
        help="the methods of a case take turns, one run each (A B A B ...): on a shared machine whose speed "
        "drifts, all slow alike",
    )
    p.add_argument(
        "--out", metavar="FOLDER", help="write <name>.md and <name>.json there (default: print only)"
    )
    p.add_argument(
        "--name", default="results", help="file name (no extension) of the --out files (default results)"
    )
    p.add_argument("--micro", action="store_true", help="graph rewrite time and the fixed cost of one run")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="measure the cost model of redist.min-bytes: auto on this cluster (the collective and Dask's tasks "
        "on the calibration cases; --size SMALL LARGE to change their sizes) and write it as the dask config file "
        "redist-cost-model-<kind>-<workers>.yaml into --out, or into dask's config directory",
    )
    p.add_argument(
        "--rewrite-chunks",
        type=types.at_least(1),
        default=10_000,
        help="--micro: chunks of the rewritten rechunk (default 10000)",
    )
    p.add_argument(
        "--scale",
        action="store_true",
        help="the scale model: planning and bookkeeping of one run, no cluster",
    )
    p.add_argument(
        "--ranks", nargs="+", type=types.at_least(1), default=[2, 16, 256, 1024], help="--scale: rank counts"
    )
    p.add_argument(
        "--scale-chunks",
        nargs="+",
        type=types.at_least(1),
        default=[1_000, 10_000, 100_000, 1_000_000],
        help="--scale: chunk counts (default 1000 10000 100000 1000000)",
    )
    p.add_argument(
        "--cases-scale",
        nargs="+",
        default=["slab", "pencil", "uneven"],
        choices=["slab", "pencil", "uneven"],
        help="--scale: the rechunk shapes (default all)",
    )
    p.add_argument(
        "--budget",
        type=types.positive_float,
        default=10.0,
        help="--scale: a part slower than this (s) stops growing",
    )
    p.add_argument(
        "--fft", action="store_true", help="dask_redist.fft.fftn against the four-step path (bench.fft)"
    )
    p.add_argument(
        "--fft-slabs",
        action="store_true",
        help="with --fft: an array of shape (2n, 2n, n) in --chunks slabs along its first axis instead of a "
        "cube in pencils",
    )
    p.add_argument(
        "--pipeline",
        action="store_true",
        help="a rechunk between other steps (bench.pipeline): per pipeline and --chunks, the pipeline without "
        "the rechunk, with it under enable(), what it adds, the bare rechunk, Dask's floor and Dask's tasks; "
        "sized by --size (--dtype is the pipelines' own)",
    )
    p.add_argument(
        "--pipelines",
        nargs="+",
        choices=["elementwise", "fft", "reduction", "generated", "weather", "fftn"],
        help="--pipeline: which pipelines (default all)",
    )
    p.add_argument(
        "--tasks-up-to",
        type=types.at_least(0),
        metavar="CHUNKS",
        help="--pipeline: time Dask's tasks rechunk only at chunk counts up to this (0: never; default: always)",
    )
    p.add_argument(
        "--engine",
        choices=["auto", *engines],
        help="--pipeline: redist.engine of the enable() the pipelines run under (default: as configured)",
    )
    p.set_defaults(func=bench, check=_checked(p, lambda args: types.methods_problem(args, engines)))

    p = sub.add_parser(
        "soak",
        help="random rechunks, cancels, re-submits, two clients, kills, pipelines; invariants after each",
    )
    cluster_args(p, workers=3)
    p.add_argument(
        "--minutes",
        type=types.positive_float,
        default=20.0,
        help="how long (default 20; whole cycles of every step kind)",
    )
    p.add_argument("--steps", type=types.at_least(1), help="this many steps instead of --minutes")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the random steps: the same seed, the same steps (default 0)",
    )
    p.add_argument(
        "--max-bytes", type=types.size, default="1MiB", help="largest array of a step (default 1MiB)"
    )
    p.add_argument("--numpy", action="store_true", help="with --gpu: NumPy chunks on the dask-cuda workers")
    p.add_argument("--engine", choices=["auto", *engines], help="redist.engine for every rechunk")
    p.add_argument(
        "--kinds",
        nargs="+",
        default=list(STEPS),
        choices=list(STEPS),
        help="step kinds to draw (default all)",
    )
    p.set_defaults(func=soak)

    p = sub.add_parser("doctor", help="check every worker: GPU, CuPy, nvmath, cuFFTMp, NVSHMEM, engine")
    cluster_args(p)
    p.set_defaults(func=doctor)

    return parser


def _checked(p: argparse.ArgumentParser, problem):
    """A check of ``p``'s parsed arguments: ``problem(args)`` (a sentence, or None) as ``p``'s usage
    error (exit 2)."""

    def check(args) -> None:
        if why := problem(args):
            p.error(why)

    return check


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
