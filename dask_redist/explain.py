"""``explain(x)``: what will run for each rechunk in an array's graph, and why."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import numpy as np

from dask_redist.compat import default_client, worker_info
from dask_redist.config import Settings
from dask_redist.core.messages import Probe
from dask_redist.engines import Request, WorldRecord, description
from dask_redist.engines.choice import choose_engine
from dask_redist.fft import describe as fft_describe
from dask_redist.graph.optimize import decide, find_rechunks, memory_limits
from dask_redist.planning import make_plan


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    from dask.utils import format_bytes

    return format_bytes(int(n))


def _grid(chunks) -> str:
    return " x ".join(str(len(c)) for c in chunks)


@dataclass(frozen=True)
class Entry:
    """One rechunk of the graph."""

    output: str
    method: str  # what dask planned
    runs: str  # "collective" or "dask"
    reason: str
    chunks: str = ""
    engine: str = "-"  # the engine's name
    engine_reason: str = ""  # why that engine
    mapping: str = "-"
    nbytes: int | None = None
    moved: int | None = None
    padding: int | None = None
    rounds: int | None = None
    imbalance: float | None = None
    placement: str = ""

    def as_dict(self) -> dict:
        return {
            "rechunk": self.output,
            "dask planned": self.method,
            "runs as": self.runs,
            "why": self.reason,
            "chunks": self.chunks,
            "engine": f"{self.engine} ({self.engine_reason})" if self.engine_reason else self.engine,
            "mapping": self.mapping,
            "bytes": _size(self.nbytes),
            "moved between workers": _size(self.moved),
            "padding": _size(self.padding),
            "rounds": "-" if self.rounds is None else str(self.rounds),
            "output imbalance": "-" if self.imbalance is None else f"{self.imbalance:.2f}",
            "placement": self.placement,
        }


@dataclass(frozen=True)
class Explanation:
    entries: tuple[Entry, ...]
    enabled: bool
    nworkers: int
    ffts: tuple = ()  # dask_redist.fft's transforms in the graph (`dask_redist.fft.describe`)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i) -> Entry:
        return self.entries[i]

    def __str__(self) -> str:
        if not self.entries:
            return "\n".join(fft_describe.text(self.ffts) or ["no rechunk in this graph"])
        lines = []
        if not self.enabled:
            lines.append("dask_redist is not enabled: this is what enable() would do")
        for e in self.entries:
            d = e.as_dict()
            lines.append(f"{d.pop('rechunk')}:")
            width = max(map(len, d))
            lines += [f"  {k:<{width}}  {v}" for k, v in d.items() if v not in ("", "-")]
        return "\n".join(lines + fft_describe.text(self.ffts))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if not self.entries:
            return fft_describe.table(self.ffts) or "<p>no rechunk in this graph</p>"
        rows = [e.as_dict() for e in self.entries]
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows
        )
        note = (
            "" if self.enabled else "<p><i>dask_redist is not enabled: this is what enable() would do</i></p>"
        )
        table = f"{note}<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        return table + fft_describe.table(self.ffts)


def _holders(keys, dask_scheduler=None):
    """The worker holding each key, if every key is in memory (else None)."""
    out = []
    for k in keys:
        ts = dask_scheduler.tasks.get(tuple(k) if isinstance(k, list) else k)
        if ts is None or ts.state != "memory" or not ts.who_has:
            return None
        out.append(min(ws.address for ws in ts.who_has))
    return out


def _placement(spec, x, client, nworkers: int) -> tuple[np.ndarray, str]:
    """Rank of each input chunk: where it is if persisted, else contiguous blocks over the workers."""
    grid = spec.rechunk.old_grid
    n = math.prod(grid)
    if client is not None:
        keys = [(spec.input_name, *i) for i in np.ndindex(*grid)]
        where = client.run_on_scheduler(_holders, keys)
        if where is not None:
            workers = sorted(worker_info(client))
            pos = {w: i for i, w in enumerate(workers)}
            return np.array([pos[w] for w in where]), "where the persisted input is"
    ranks = (np.arange(n) * nworkers) // max(n, 1)
    return ranks, f"assumed: contiguous blocks over {nworkers} workers"


def _engine(spec, client) -> tuple[str, str]:
    """The engine a run would use and why, decided as the scheduler decides it (`choose_engine`),
    from what the workers answered: asked here if nobody asked them yet."""
    request = Request.of(spec)
    if request.settings.engine != "auto" or client is None:
        return choose_engine(request, None, [])
    from dask_redist.api import _ensure_scheduler_plugin

    _ensure_scheduler_plugin(client)
    state = client.sync(Probe(dict(request.settings.engines)).call, client.scheduler)
    records = {name: WorldRecord.from_state(r) for name, r in state["records"].items()}
    workers = sorted(worker_info(client))
    return choose_engine(request, state["capabilities"], workers, records)


def _kept_for_method(node) -> str | None:
    """Expression mode: why dask's ``Rechunk`` given ``method=`` stays (a `CollectiveRechunk` took it)."""
    from dask_redist.graph.expr import CollectiveRechunk
    from dask_redist.graph.optimize import kept_for_method

    return None if isinstance(node, CollectiveRechunk) else kept_for_method(node.method)


def _decisions(x, settings: Settings, memory=None) -> list[tuple[str, str, object, str]]:
    """(output name, what dask planned, CollectiveSpec or None, reason) for every rechunk of ``x``."""
    expr = getattr(x, "expr", None)
    if expr is not None:  # expression mode: the rechunks are expressions in the tree
        from dask.utils import typename

        from dask_redist.compat import array_expr, meta_of
        from dask_redist.graph.optimize import collective_spec

        _, Rechunk, _ = array_expr()

        out = []
        for node in expr.walk():
            if isinstance(node, Rechunk) and node.chunks != node.array.chunks:
                a = node.array
                spec, why = None, _kept_for_method(node)
                if why is None:
                    spec, why = collective_spec(
                        a._name,
                        node._name,
                        a.chunks,
                        node.chunks,
                        a.dtype,
                        typename(type(meta_of(a))),
                        settings,
                        len(memory[0]) if memory else None,
                    )
                out.append((node._name, node.method or "auto", spec, why))
        return out
    graph = x.__dask_graph__()
    out = []
    for chain in find_rechunks(graph, {x.name}):
        d = decide(graph, chain, settings, memory=memory)
        out.append((chain.output, d.method, d.spec, d.reason))
    return out


def explain(x, *, nworkers: int | None = None, settings: Settings | None = None) -> Explanation:
    """For every rechunk in ``x``'s graph: engine, mapping, bytes moved, padding, rounds, or why not.

    Parameters
    ----------
    x : dask collection
        A dask array (or any collection) whose graph holds the rechunks.
    nworkers : int, optional
        The workers to plan for; None: the default Client's, or 2 without one.
    settings : Settings, optional
        The ``redist.*`` settings to decide with; None: the current config's.

    Returns
    -------
    Explanation
        One `Entry` per rechunk (and ``dask_redist.fft``'s transforms), printed as a table.
    """
    import dask

    from dask_redist.graph.optimize import CollectiveOptimizer

    settings = settings or Settings.from_config()
    enabled = isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)
    client = default_client()
    workers = worker_info(client) if client is not None else None
    if nworkers is None:
        nworkers = len(workers) if workers is not None else 2
    nworkers = max(1, nworkers)
    entries = []
    memory = None
    if workers is not None:  # (as the scheduler decides: from the workers' memory limits)
        memory = memory_limits(w.get("memory_limit") for w in workers.values())
    for output, method, spec, reason in _decisions(x, settings, memory):
        if spec is None:
            entries.append(Entry(output, method, "dask", reason))
            continue
        runs = "collective"
        if client is None:
            reason, runs = (
                "eligible, but no distributed Client: dask's rechunk runs on local schedulers",
                "dask",
            )
        elif not enabled:
            reason = (
                f"dask_redist is not enabled: dask's rechunk runs; enable() would run a collective ({reason})"
            )
            runs = "dask"
        in_ranks, where = _placement(spec, x, client, nworkers)
        plan = make_plan(spec.rechunk, in_ranks, nworkers)
        engine, engine_why = _engine(spec, client)
        mapping, padding, rounds = description(engine, settings).mapping(plan, settings)
        entries.append(
            Entry(
                output,
                method,
                runs,
                reason,
                chunks=f"{_grid(spec.rechunk.old)} -> {_grid(spec.rechunk.new)} chunks, {spec.dtype}",
                engine=engine,
                engine_reason=engine_why,
                mapping=mapping,
                nbytes=plan.nbytes,
                moved=plan.moved_bytes,
                padding=padding,
                rounds=rounds,
                imbalance=plan.imbalance,
                placement=where,
            )
        )
    ffts = () if getattr(x, "expr", None) is not None else tuple(fft_describe.fft_entries(x.__dask_graph__()))
    return Explanation(tuple(entries), enabled, nworkers, ffts)
