"""``explain(x)``: what will run for each rechunk in a collection's graph, and why.

``x``: any dask collection (a dask array, an xarray object backed by dask, a ``Delayed`` such
as ``to_zarr(compute=False)`` returns), or a list, tuple or dict of them; anything else gets
one sentence saying why there is nothing to explain."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import numpy as np

from dask_redist.compat import default_client, worker_info
from dask_redist.config import DASK_RECHUNK, Settings
from dask_redist.engines import Request, description
from dask_redist.errors import a_kind_of, is_xarray, type_name
from dask_redist.engines.choice import choose_engine
from dask_redist.fft import describe as fft_describe
from dask_redist.graph.decide import decide, find_rechunks, held_by_dask, is_rechunk_layer, memory_limits
from dask_redist.graph.decide import held_in_memory
from dask_redist.graph.optimize import as_delayed_runs, computed_together, fused_neighbours
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
    runs: str  # "collective", "dask-rechunk" (Dask's own rechunk: `DASK_RECHUNK`) or "refused ..."
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
    fused: str = ""  # the neighbouring steps the collective's tasks compute (graph.fuse)
    explicit: bool = False  # asked for by dask_redist.rechunk: runs whether or not enabled

    def headline(self) -> str:
        """What runs, first: the collective (on which engine), Dask's rechunk, or a refusal."""
        if self.runs == "collective":
            return f"the collective on {self.engine}, in place of Dask's {self.method} rechunk: {self.output}"
        if self.runs.startswith("refused"):
            return f"refused at submission, {self.engine} cannot run it: {self.output}"
        return f"Dask's {self.method} rechunk: {self.output}"

    def as_dict(self) -> dict:
        return {
            "rechunk": self.output,
            "runs as": self.runs,
            "Dask's method": self.method,
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
            "fused": self.fused,
        }


@dataclass(frozen=True)
class Explanation:
    entries: tuple[Entry, ...]
    enabled: bool
    nworkers: int
    ffts: tuple = ()  # dask_redist.fft's transforms in the graph (`dask_redist.fft.describe`)
    note: str = ""  # why there is nothing to explain (not a dask collection)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i) -> Entry:
        return self.entries[i]

    def __str__(self) -> str:
        if self.note:
            return self.note
        if not self.entries:
            return "\n".join(fft_describe.text(self.ffts) or ["no rechunk in this graph"])
        lines = []
        if not self.enabled and not all(e.explicit for e in self.entries):
            lines.append("dask_redist is not enabled: this is what enable() would do")
        for e in self.entries:
            d = e.as_dict()
            del d["rechunk"], d["Dask's method"]  # (in the headline)
            lines.append(e.headline())
            width = max(map(len, d))
            lines += [f"  {k:<{width}}  {v}" for k, v in d.items() if v not in ("", "-")]
        return "\n".join(lines + fft_describe.text(self.ffts))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if self.note:
            return f"<p>{html.escape(self.note)}</p>"
        if not self.entries:
            return fft_describe.table(self.ffts) or "<p>no rechunk in this graph</p>"
        rows = [e.as_dict() for e in self.entries]
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows
        )
        note = (
            ""
            if self.enabled or all(e.explicit for e in self.entries)
            else "<p><i>dask_redist is not enabled: this is what enable() would do</i></p>"
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


def _placement(spec, client, nworkers: int) -> tuple[np.ndarray, str]:
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


def _engine(spec, client) -> tuple[str, str, str | None]:
    """The engine a run would use, why, and why it is refused at submission, or None
    (`cluster.engine_for`; without a Client, the rule alone)."""
    request = Request.of(spec)
    if client is None:
        return *choose_engine(request, None, []), None
    from dask_redist.cluster import engine_for

    return engine_for(client, request)


def _kept_for_method(node) -> str | None:
    """Expression mode: why dask's ``Rechunk`` given a method (``method=`` or dask's config, one
    expression either way) stays (a `CollectiveRechunk` took it)."""
    from dask_redist.graph.expr import CollectiveRechunk
    from dask_redist.graph.decide import kept_for_method

    return None if isinstance(node, CollectiveRechunk) else kept_for_method(node.method, None)


def _decisions(
    x, settings: Settings, memory=None, client=None
) -> list[tuple[str, str, object, str, bool, str]]:
    """(output name, what dask planned, CollectiveSpec or None, reason, asked for by
    `dask_redist.rechunk`, what is fused) for every rechunk of ``x``; decided as the rewrite
    decides on ``client``'s scheduler (`_held_by_dask` there)."""
    expr = _expression(x)
    if expr is not None:  # expression mode: the rechunks are expressions in the tree
        from dask.utils import typename

        from dask_redist.compat import array_expr, meta_of
        from dask_redist.graph.decide import collective_spec

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
                out.append((node._name, node.method or "auto", spec, why, False, ""))
        return out
    graph = x.__dask_graph__()
    decisions = as_delayed_runs(
        x, [decide(graph, c, settings, memory=memory) for c in find_rechunks(graph, _names(x))]
    )
    held = set()  # (outputs the scheduler holds in memory: nothing is fused into them)
    if client is not None and any(d.collective for d in decisions):
        decisions, held = client.run_on_scheduler(_held_by_dask, decisions)
    fused = fused_neighbours(graph, decisions, x.__dask_keys__(), held)
    out = [(d.chain.output, d.method, d.spec, d.reason, False, f) for d, f in zip(decisions, fused)]
    for name, layer in graph.layers.items():  # (dask_redist.rechunk's: decided when it was called)
        if (d := getattr(layer, "decision", None)) is not None:
            out.append((name, d.method, d.spec, d.reason, True, ""))
    return out + _made_tasks(graph)


def _held_by_dask(decisions: list, dask_scheduler=None) -> tuple[list, set]:
    """``decisions`` as the rewrite on the scheduler takes them: Dask's rechunk where the scheduler
    holds a collective's output keys (Dask's names: built before ``enable()``) with Dask's tasks
    behind them (`graph.decide.held_by_dask`); and the outputs it holds in memory, into which
    nothing is fused (`graph.decide.held_in_memory`). Run on the scheduler."""
    decisions = [held_by_dask(dask_scheduler, d) for d in decisions]
    return decisions, {d.chain.output for d in decisions if held_in_memory(dask_scheduler, d)}


#: Why a rechunk that a collection holds as plain tasks keeps Dask's rechunk.
MADE_TASKS = (
    "this graph holds the rechunk as plain tasks, not as a rechunk layer: dask turned the array's graph "
    "into tasks when a Delayed was built on it (dask.delayed(f)(array), to_zarr(compute=False)), before "
    "dask-redist could rewrite it, so Dask's rechunk runs. Persist the rechunked array first "
    "(y = x.rechunk(...).persist(), or ds.chunk(...).persist()) and build on that"
)


def _made_tasks(graph) -> list[tuple]:
    """A `_decisions` entry for each layer of ``graph`` holding a rechunk's tasks among others
    (a Delayed's ``finalize`` layer): Dask's rechunk, made tasks before any rewrite."""
    from dask.highlevelgraph import MaterializedLayer

    from dask_redist.compat import P2P_PREFIX, RECHUNK_PREFIXES

    out = []
    for name, layer in graph.layers.items():
        if not isinstance(layer, MaterializedLayer) or is_rechunk_layer(name, layer):
            continue
        names = {k[0] for k in layer if isinstance(k, tuple) and str(k[0]).startswith(RECHUNK_PREFIXES)}
        if names:
            method = "p2p" if any(n.startswith(P2P_PREFIX) for n in names) else "tasks"
            out.append((name, method, None, MADE_TASKS, False, ""))
    return out


def _expression(x):
    """``x``'s expression in dask's expression mode, or None (a ``Delayed`` answers any attribute)."""
    from dask.delayed import Delayed

    return None if isinstance(x, Delayed) else getattr(x, "expr", None)


def _names(x) -> set:
    """The names of the layers ``x``'s keys are in (what it asks for: no rechunk chain absorbs them)."""
    from dask.core import flatten

    return {k[0] if isinstance(k, tuple) else k for k in flatten(x.__dask_keys__())}


def collections(x) -> list | str:
    """The dask collections ``x`` is, or holds (a list, tuple, set or dict of them, nested), or one
    sentence saying why there is nothing to explain."""
    from dask.base import is_dask_collection

    if is_dask_collection(x):
        return [x]
    if isinstance(x, (list, tuple, set, frozenset, dict)):
        found = [c for item in (x.values() if isinstance(x, dict) else x) for c in _listed(item)]
        if found:
            return found
        return f"explain() found no dask collection in this {type(x).__name__}: nothing is rechunked"
    if is_xarray(x):  # (of in-memory data: it held no dask collection)
        return f"this {type_name(x)} holds no dask arrays, so nothing is rechunked: .chunk(...) makes its data dask arrays"
    return (
        f"explain() takes a dask collection (a dask array, an xarray object backed by dask, a Delayed) or a "
        f"list of them; {a_kind_of(x)} holds no dask graph, so nothing is rechunked"
    )


def _listed(item) -> list:
    found = collections(item)
    return [] if isinstance(found, str) else found


def explain(x, *, nworkers: int | None = None, settings: Settings | None = None):
    """For every rechunk in ``x``'s graph: what runs (the collective, on which engine, or Dask's
    rechunk), why, and the engine, mapping, bytes moved, padding and rounds.

    Parameters
    ----------
    x : dask collection, or a list of them
        A dask array, an xarray object backed by dask, a Delayed (or a list, tuple or dict of
        them, explained as ``dask.compute`` of them rewrites their graphs: as one) whose graphs
        hold the rechunks; anything else gets a one-sentence note.
    nworkers : int, optional
        The workers to plan for; None: the default Client's, or 2 without one.
    settings : Settings, optional
        The ``redist.*`` settings to decide with; None: the current config's.

    Returns
    -------
    Explanation
        One `Entry` per rechunk (and ``dask_redist.fft``'s transforms), printed as a table. Where
        the default Client is asynchronous (called on its event loop), an awaitable of it:
        ``await dask_redist.explain(y)``.
    """
    from dask_redist.cluster import answered

    client = default_client()
    return answered(client, _explain, x, client, nworkers, settings)


def _explain(x, client, nworkers: int | None, settings: Settings | None) -> Explanation:
    import dask

    from dask_redist.graph.optimize import CollectiveOptimizer

    settings = settings or Settings.from_config()
    enabled = isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)
    found = collections(x)
    if isinstance(found, str):
        return Explanation((), enabled, nworkers or 0, note=found)
    workers = worker_info(client) if client is not None else None
    if nworkers is None:
        nworkers = len(workers) if workers is not None else 2
    nworkers = max(1, nworkers)
    entries = []
    memory = None
    if workers is not None:  # (as the scheduler decides: from the workers' memory limits)
        memory = memory_limits(w.get("memory_limit") for w in workers.values())
    together = computed_together(found, _expression)  # (a list's arrays: one graph, as dask.compute's)
    decisions = {d[0]: d for c in together for d in _decisions(c, settings, memory, client)}
    for output, method, spec, reason, explicit, fused in decisions.values():
        if spec is None:
            entries.append(Entry(output, method, DASK_RECHUNK, reason))
            continue
        runs = "collective"
        if client is None:
            reason, runs = (
                "eligible, but no distributed Client: dask's rechunk runs on local schedulers",
                DASK_RECHUNK,
            )
        elif not enabled and not explicit:
            reason = (
                f"dask_redist is not enabled: dask's rechunk runs; enable() would run a collective ({reason})"
            )
            runs = DASK_RECHUNK
        in_ranks, where = _placement(spec, client, nworkers)
        plan = make_plan(spec.rechunk, in_ranks, nworkers)
        engine, engine_why, refused = _engine(spec, client)
        if refused and runs == "collective":
            runs, reason = "refused at submission (EngineUnavailableError)", refused
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
                fused=fused if runs == "collective" else "",
                explicit=explicit,
            )
        )
    ffts = tuple(
        f for c in found if _expression(c) is None for f in fft_describe.fft_entries(c.__dask_graph__())
    )
    return Explanation(tuple(entries), enabled, nworkers, ffts)
