"""What `dask_redist.status` returns, readable: tables, times as durations.

Also the table rendering the command line uses (`text_table`, `markdown_table`).
"""

from __future__ import annotations

import html
import time

from dask.utils import format_bytes, format_time

RUNS_SHOWN = 10  # the latest runs a Status prints (all of them stay in status["history"])


def text_table(rows: list[dict], title: str = "", width: int | None = None) -> str:
    """``rows`` (dicts with the same keys) as a plain-text table no wider than ``width`` (rich's
    rendering, no colours; cells wrap)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title or None, box=box.SIMPLE_HEAD, title_justify="left", title_style="bold")
    for name in rows[0]:
        table.add_column(str(name), overflow="fold")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    out = io.StringIO()
    Console(file=out, width=width or 120, color_system=None, force_terminal=False, highlight=False).print(
        table
    )
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def markdown_table(rows: list[dict], title: str = "") -> str:
    """``rows`` as a Markdown table (``|`` in cells escaped), with the title as a line before it."""

    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = [f"**{title}**", ""] if title else []
    lines += ["| " + " | ".join(map(cell, rows[0])) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(map(cell, r.values())) + " |" for r in rows]
    return "\n".join(lines)


def fitted_table(rows: list[dict], title: str = "", terminal: bool = True, width: int | None = None) -> str:
    """A table for a terminal ``width`` wide, or Markdown for a file or a pipe; columns that are
    empty in every row (the GPU columns on CPU) left out; "" without rows."""
    keep = [k for k in (rows[0] if rows else {}) if any(str(r[k]) not in ("", "-", "None") for r in rows)]
    if not keep:
        return ""
    rows = [{k: r[k] for k in keep} for r in rows]
    return text_table(rows, title, width) if terminal else markdown_table(rows, title) + "\n"


def html_table(rows: list[dict], title: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows
    )
    caption = f"<p><b>{html.escape(title)}</b></p>" if title else ""
    return f"{caption}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ago(now: float, t: float | None) -> str:
    return "-" if t is None else f"{format_time(max(0.0, now - t))} ago"


def _engines(engines: dict) -> str:
    out = []
    for name, e in engines.items():
        state = "broken: " + str(e["broken"]) if e.get("broken") else "stuck" if e.get("stuck") else "ok"
        out.append(f"{name} {state}")
    return ", ".join(out) or "-"


def _run_row(h: dict) -> dict:
    """A row of the runs' tables for ``h``, an entry of the history (or of a run in flight)."""
    return {
        "run": f"{h.get('token', '')[:8]} #{h.get('run', '-')}",
        "engine": h.get("engine", "-"),
        "outcome": h.get("outcome", "-"),
        "bytes": format_bytes(h["bytes"]) if "bytes" in h else "-",
        "moved": format_bytes(h["bytes moved"]) if "bytes moved" in h else "-",
        "took": format_time(h["seconds"]) if "seconds" in h else "-",
        "why": h.get("why", ""),
    }


class Status(dict):
    """What `dask_redist.status` returns: the scheduler's answer as a dict, as before
    (``status["history"]``, ``["workers"]``, ``["timeline"]``..., times as the processes
    recorded them: epoch seconds), which prints as tables with times as durations
    (``print(status)``, or Jupyter's HTML)."""

    def __init__(self, answer: dict, taken: float | None = None):
        super().__init__(answer)
        self.taken = time.time() if taken is None else taken  # (when it was asked: "ago" is from then)

    def summary(self) -> str:
        runs, active = len(self.get("history", ())), len(self.get("active", ()))
        workers, unanswered = len(self.get("workers", {})), len(self.get("unanswered", {}))
        silent = f", {unanswered} did not" if unanswered else ""
        return (
            f"dask-redist: {workers} worker{'s' * (workers != 1)} answered{silent}; "
            f"{runs} run{'s' * (runs != 1)} finished, {active} in flight"
        )

    def sections(self) -> list[tuple[str, list[dict]]]:
        """(title, rows) of each table shown; empty ones left out."""
        history = list(self.get("history", ()))
        runs = [_run_row(h) for h in history[-RUNS_SHOWN:]]
        # (a scheduler of an older dask-redist names them only)
        in_flight = [_run_row(h) for h in self["in flight"]] if "in flight" in self else None
        earlier = (
            f" ({len(history) - RUNS_SHOWN} earlier in status['history'])"
            if len(history) > RUNS_SHOWN
            else ""
        )
        marks = self.get("timeline", {})
        first = min(marks.values(), default=None)
        timeline = [
            {
                "mark": m,
                "after the first": f"+{format_time(t - first)}" if t > first else "0",
                "when": _ago(self.taken, t),
            }
            for m, t in sorted(marks.items(), key=lambda kv: kv[1])
        ]
        workers = [
            {
                "worker": w,
                "host": s.get("host", "-"),
                "staged chunks": s.get("staged chunks", "-"),
                "stage keys": s.get("stage keys", "-"),
                "runs held": ", ".join(f"{r} ({p})" for r, p in s.get("runs held", s.get("runs", {})).items())
                or "-",
                "early pieces": s.get("early pieces", "-"),
                "engines": _engines(s.get("engines", {})),
                "last mark": _ago(self.taken, max(s.get("timeline", {}).values(), default=None)),
            }
            for w, s in sorted(self.get("workers", {}).items())
        ]
        sections = [
            (f"runs finished, latest last{earlier}", runs),
            (
                "runs in flight",
                in_flight if in_flight is not None else [{"run": r} for r in self.get("active", ())],
            ),
            ("latest run, on the scheduler", timeline),
            ("workers", workers),
            (
                "workers that did not answer",
                [{"worker": w, "why": why} for w, why in self.get("unanswered", {}).items()],
            ),
            ("engines' worlds", self._worlds()),
        ]
        return [(title, rows) for title, rows in sections if rows]

    def _worlds(self) -> list[dict]:
        """A row per engine whose record holds a world, or why it cannot be used."""
        records = self.get("engines", {}).get("records", {})
        return [
            {
                "engine": name,
                "members": len(r.get("world") or ()),
                "broken": r.get("broken") or "-",
                "stranded": ", ".join(r.get("stranded") or ()) or "-",
            }
            for name, r in sorted(records.items())
            if r.get("world") or r.get("broken") or r.get("stranded")
        ]

    def __str__(self) -> str:
        parts = [self.summary()] + [text_table(rows, title) for title, rows in self.sections()]
        return "\n\n".join(parts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        parts = [f"<p>{html.escape(self.summary())}</p>"] + [
            html_table(rows, title) for title, rows in self.sections()
        ]
        return "".join(parts)
