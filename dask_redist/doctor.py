"""``dask-redist doctor``: can this cluster run the collective, and with which engine?

It asks every engine of ``redist.engines`` (`dask_redist.engines.registry`) what it needs to
know of each worker (``EngineDescription.worker_report``, run there, with the engine's
``capabilities``), prints each engine's columns and line, and what ``auto`` picks: the answer
``explain`` and the FFT get (`dask_redist.cluster.engine_for`: the scheduler's rule, over what
the workers told it and its records of the engines' worlds).
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass

from dask_redist.cluster import answered, engine_for
from dask_redist.config import Settings
from dask_redist.engines import Request, description, descriptions
from dask_redist.engines.registry import capabilities


def worker_reports(engines: dict[str, str], dask_worker=None) -> dict:
    """What one worker has for each engine of ``engines`` (name -> path; run on the worker by
    ``client.run``, which passes it as ``dask_worker``), with its host (`dask_redist.config.host`:
    the worker's own ``redist.host``, else its address's host)."""
    settings = Settings(engines=tuple(engines.items()))
    able = capabilities(engines, getattr(dask_worker, "address", None))
    out = {}
    for name in engines:
        try:
            report = description(name, settings).worker_report()
        except Exception as e:
            report = {"error": f"{type(e).__name__}: {e}"}
        out[name] = {**report, "host": able[name]["host"], "capabilities": able[name]}
    return out


def _hosts(by_worker: dict[str, str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(host, its workers) for every host, sorted."""
    out: dict[str, list[str]] = {}
    for w, h in sorted(by_worker.items()):
        out.setdefault(h, []).append(w)
    return tuple((h, tuple(ws)) for h, ws in sorted(out.items()))


@dataclass(frozen=True)
class Diagnosis:
    workers: dict  # worker -> {engine name: its report}
    engine: str  # what `auto` picks for CuPy chunks (`cluster.engine_for`)
    reason: str
    fixes: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    lines: tuple[tuple[str, str], ...] = ()  # (engine name, its line)
    picks: tuple[tuple[str, str, str], ...] = ()  # (chunk type, engine `auto` picks, why)
    columns: tuple[tuple[str, dict], ...] = ()  # (worker, its columns), sorted
    hosts: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (host, its workers): each worker's redist.host

    def rows(self) -> list[dict]:
        """One row per worker, every row with the same columns ("-" where an engine has none)."""
        names = list(dict.fromkeys(k for _, cols in self.columns for k in cols))
        return [{"worker": w, **{k: cols.get(k, "-") for k in names}} for w, cols in self.columns]

    def __str__(self) -> str:
        lines = []
        for row in self.rows():
            lines.append(row.pop("worker") + ":")
            lines += [f"  {k:<15} {v}" for k, v in row.items()]
        lines += [self.hosts_line()] if self.hosts else []
        lines += [f"engine {name}: {line}" for name, line in self.lines]
        lines += [f"engine `auto` picks for {_chunks(t)}: {engine} ({why})" for t, engine, why in self.picks]
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"fix: {f}" for f in self.fixes]
        return "\n".join(lines)

    __repr__ = __str__

    def hosts_line(self) -> str:
        """``hosts: 2 (hostA: 2 workers, hostB: 2 workers)``."""
        each = ", ".join(f"{h}: {len(ws)} worker{'s' * (len(ws) != 1)}" for h, ws in self.hosts)
        return f"hosts: {len(self.hosts)} ({each})"

    def _repr_html_(self) -> str:
        rows = self.rows()
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0]) if rows else ""
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows
        )
        notes = "".join(f"<li>{html.escape(f)}</li>" for f in (*self.warnings, *self.fixes))
        engines = "".join(f"<li>{html.escape(n)}: {html.escape(line)}</li>" for n, line in self.lines)
        picks = "; ".join(f"{_chunks(t)}: <b>{e}</b> ({html.escape(why)})" for t, e, why in self.picks)
        return (
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<p>{html.escape(self.hosts_line() if self.hosts else '')}</p>"
            f"<ul>{engines}</ul><p><b>auto</b> picks for {picks}</p><ul>{notes}</ul>"
        )


def _chunks(chunk_type: str) -> str:
    return "CuPy chunks" if chunk_type == "cupy" else "NumPy chunks"


def doctor(client, settings: Settings | None = None):
    """Check every worker of ``client``'s cluster for every engine (blocks each worker for a moment):
    a `Diagnosis`; with an asynchronous Client (called on its event loop), an awaitable of it."""
    return answered(client, _doctor, client, settings or Settings.from_config())


def _doctor(client, settings: Settings) -> Diagnosis:
    reports = client.run(worker_reports, dict(settings.engines))
    workers = sorted(reports)
    engines = descriptions(settings)
    by_engine = {d.name: {w: reports[w].get(d.name, {}) for w in workers} for d in engines}
    lines, warnings, fixes = [], [], []
    for d in engines:
        lines.append((d.name, d.doctor_line(by_engine[d.name])))
        more_warnings, more_fixes = d.doctor_notes(by_engine[d.name])
        warnings += more_warnings
        fixes += [f for f in more_fixes if f not in fixes]
    host_of = {w: next((r["host"] for r in reports[w].values() if "host" in r), "?") for w in workers}
    columns = tuple(
        (
            w,
            {
                "host": host_of[w],
                **{k: v for d in engines for k, v in d.doctor_columns(by_engine[d.name][w]).items()},
            },
        )
        for w in workers
    )
    picks, auto = [], dataclasses.replace(settings, engine="auto")
    for chunk_type in ("cupy", "numpy"):  # (NumPy chunks: of any size)
        engine, why, _ = engine_for(client, Request(chunk_type, auto))
        picks.append((chunk_type, engine, why))
    (_, engine, reason), _ = picks
    return Diagnosis(
        reports,
        engine,
        reason,
        tuple(fixes),
        tuple(warnings),
        tuple(lines),
        tuple(picks),
        columns,
        _hosts(host_of),
    )
