"""The benchmark's results as files: Markdown tables (with the per-chunk cost as a line through
the medians, and the phases of the last run's timeline) and JSON, the command, the machine and
the date beside every figure."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from dask.utils import format_bytes

from dask_redist.bench.floor import relate_to_floor
from dask_redist.bench.harness import Result


def load_json(path: str) -> tuple[list[Result], str]:
    """The results and the command of a file written by `to_json`."""
    with open(path) as f:
        data = json.load(f)
    names = {f.name for f in dataclasses.fields(Result)}
    return [Result(**{k: v for k, v in r.items() if k in names}) for r in data["results"]], data["command"]


def markdown(results: list[Result], env: dict, command: str) -> str:
    rows = [r.row() for r in relate_to_floor(results)]
    head = list(rows[0])
    lines = [
        f"Command: `{command}`  ",
        f"Date: {env['date']}; machine: {env['machine']}; {env['workers']} workers; "
        + ", ".join(
            f"{k} {env[k]}"
            for k in ("dask", "distributed", "numpy", "cupy", "dask_cuda", "nvmath")
            if k in env
        ),
    ]
    c = env.get("ceiling") or {}
    if "peer GB/s per direction" in c:
        lines[-1] += "  "
        lines.append(
            f"Physical ceiling, measured in the benchmark process: peer copy {c['peer GB/s per direction']:.0f} GB/s "
            f"per direction with both directions busy, local copy {c['local copy GB/s (read + write)']:.0f} GB/s "
            '(read + write). "of ceiling": the bytes the collective\'s plan moves in the busiest direction at the '
            'peer rate, over the median. "GPU mem +": the most GPU memory one worker had in use more after the '
            "warm-up run than before it, CuPy's cached blocks freed first (the pool keeps freed blocks, so "
            "temporaries count; the NVSHMEM symmetric heap, reserved once, does not)."
        )
    if "pinned H2D GB/s" in c:
        lines[-1] += "  "
        lines.append(
            "Host link, measured in the benchmark process on its GPU (1 thread): "
            + ", ".join(
                f"{k.replace(' GB/s', '')} {v:.1f} GB/s"
                for k, v in c.items()
                if k.endswith("GB/s") and "peer" not in k and "local" not in k
            )
            + "."
        )
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    for title, table in (("Cost per added chunk", slopes(results)), ("Where the time goes", phases(results))):
        if table:
            lines += [
                "",
                f"**{title}** " + table[0],
                "",
                "| " + " | ".join(table[1]) + " |",
                "|" + "---|" * len(table[1]),
            ]
            lines += ["| " + " | ".join(map(str, row)) + " |" for row in table[2:]]
    return "\n".join(lines) + "\n"


def slopes(results: list[Result]) -> list:
    """[note, header, rows...]: each method's ms per added chunk over the chunk counts of one
    case family and size (a least-squares line through the medians), or [] with fewer than two."""
    groups: dict = {}
    for r in results:
        if r.times:
            groups.setdefault((r.case.split()[0], r.nbytes, r.method), []).append(
                (r.nchunks_in, r.median * 1e3)
            )
    rows = []
    for (family, nbytes, method), points in groups.items():
        if len({c for c, _ in points}) < 2:
            continue
        chunks, ms = np.array(points, dtype=float).T
        slope, intercept = np.polyfit(chunks, ms, 1)
        rows.append(
            [
                f"{family} {format_bytes(nbytes)}",
                method,
                f"{int(chunks.min())}-{int(chunks.max())}",
                f"{slope:.3f}",
                f"{intercept:.1f}",
            ]
        )
    if not rows:
        return []
    return [
        "(a least-squares line through the medians against the input chunk count):",
        ["case", "method", "chunks", "ms per added chunk", "ms at 0 chunks"],
        *rows,
    ]


#: Timeline marks shown per phase: (column, source, event, which of several workers' marks).
PHASES = (
    ("graph in", "scheduler", "graph in", min),
    ("tasks created", "scheduler", "tasks created", min),
    ("stages start", "worker", "first stage", min),
    ("run asked", "scheduler", "run asked", min),
    ("barrier task", "worker", "barrier task", min),
    ("start sent", "scheduler", "start sent", min),
    ("executed", "worker", "executed", max),
    ("first unpack", "worker", "first unpack", min),
    ("last unpack", "worker", "last unpack", max),
    ("outputs in memory", "scheduler", "outputs in memory", min),
)


def phases(results: list[Result]) -> list:
    """[note, header, rows...]: ms after submit at which the last timed run of each collective
    row reached each phase (`PHASES`), or [] without timelines."""
    rows = []
    for r in results:
        if not r.timeline:
            continue
        cells = []
        for _, source, event, pick in PHASES:
            found = [t for t, e in r.timeline if e.startswith(source) and e.endswith(": " + event)]
            cells.append(f"{pick(found):.1f}" if found else "")
        rows.append([r.case, r.method, *cells, f"{r.times[-1] * 1e3:.1f}" if r.times else ""])
    if not rows:
        return []
    return [
        "(ms after `persist()` of the last timed run; worker marks: the first worker, or the last for "
        '"executed"):',
        ["case", "method", *(p[0] for p in PHASES), "end"],
        *rows,
    ]


def to_json(results: list[Result], env: dict, command: str) -> str:
    return json.dumps(
        {
            "command": command,
            "environment": env,
            "results": [dataclasses.asdict(r) | {"median": r.median} for r in relate_to_floor(results)],
        },
        indent=1,
        default=str,
    )
