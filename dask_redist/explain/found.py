"""What `explain` finds in a collection: the dask collections it is or holds, and every rechunk in
their graphs, decided as the rewrite decides (expression mode too), with what is fused into it."""

from __future__ import annotations

import inspect
from dataclasses import replace

from dask.highlevelgraph import HighLevelGraph

from dask_redist.config import Settings
from dask_redist.errors import a_kind_of, is_xarray, type_name
from dask_redist.graph.decide import (
    Decision,
    decide,
    find_rechunks,
    held_by_dask,
    held_in_memory,
    is_rechunk_layer,
    kept_for_method,
)
from dask_redist.graph.optimize import fused_neighbours


def _kept_for_method(node) -> str | None:
    """Expression mode: why dask's ``Rechunk`` given a method (``method=`` or dask's config, one
    expression either way) stays (a `CollectiveRechunk` took it)."""
    from dask_redist.graph.expr import CollectiveRechunk

    return None if isinstance(node, CollectiveRechunk) else kept_for_method(node.method, None)


def decisions(
    x, settings: Settings, memory=None, client=None
) -> list[tuple[str, str, object, str, bool, str]]:
    """(output name, what dask planned, CollectiveSpec or None, reason, asked for by
    `dask_redist.rechunk`, what is fused, whether the scheduler holds its output in memory) for
    every rechunk of ``x``; decided as the rewrite decides on ``client``'s scheduler
    (`_held_by_dask` there)."""
    expr = expression(x)
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
                out.append((node._name, node.method or "auto", spec, why, False, "", False))
        return out
    graph = x.__dask_graph__()
    decisions = as_delayed_runs(
        x, [decide(graph, c, settings, memory=memory) for c in find_rechunks(graph, _names(x))]
    )
    held = set()  # (outputs the scheduler holds in memory: nothing is fused into them)
    if client is not None and any(d.collective for d in decisions):
        decisions, held = client.run_on_scheduler(_held_by_dask, decisions)
    fused = fused_neighbours(graph, decisions, x.__dask_keys__(), held)
    out = [
        (d.chain.output, d.method, d.spec, d.reason, False, f, d.chain.output in held)
        for d, f in zip(decisions, fused)
    ]
    for name, layer in graph.layers.items():  # (dask_redist.rechunk's: decided when it was called)
        if (d := getattr(layer, "decision", None)) is not None:
            out.append((name, d.method, d.spec, d.reason, True, "", False))
    from dask.delayed import Delayed

    return out + _made_tasks(graph, frozenset() if isinstance(x, Delayed) else _names(x))


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
    "into tasks when a Delayed was built on it (dask.delayed(f)(array), array.to_delayed(), to_zarr(compute=False)), before "
    "dask-redist could rewrite it, so Dask's rechunk runs. Persist the rechunked array first "
    "(y = x.rechunk(...).persist(), or ds.chunk(...).persist()) and build on that"
)


#: Why a rechunk in an array optimized on the client (``dask.optimize``) keeps Dask's rechunk.
OPTIMIZED = (
    "this array's graph holds the rechunk as plain tasks, not as a rechunk layer: it was optimized on "
    "the client ((y,) = dask.optimize(y)), where dask made the rechunk its own tasks before dask-redist "
    "could rewrite it on the scheduler, so Dask's rechunk runs. Compute the array itself, not its "
    "optimized copy, or use dask_redist.rechunk(x, chunks), whose graph is the collective's from the start"
)


def _made_tasks(graph, own=frozenset()) -> list[tuple]:
    """A `decisions` entry for each layer of ``graph`` holding a rechunk's tasks among others
    (a Delayed's ``finalize`` layer; a layer of ``own``, an array's own output layers: optimized
    on the client): Dask's rechunk, made tasks before any rewrite."""
    from dask.highlevelgraph import MaterializedLayer

    from dask_redist.compat import P2P_PREFIX, RECHUNK_PREFIXES

    out = []
    for name, layer in graph.layers.items():
        if not isinstance(layer, MaterializedLayer) or is_rechunk_layer(name, layer):
            continue
        names = {k[0] for k in layer if isinstance(k, tuple) and str(k[0]).startswith(RECHUNK_PREFIXES)}
        if names:
            method = "p2p" if any(n.startswith(P2P_PREFIX) for n in names) else "tasks"
            out.append((name, method, None, OPTIMIZED if name in own else MADE_TASKS, False, "", False))
    return out


def expression(x):
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


def variables(found: list, outputs) -> dict[str, str]:
    """For each of ``outputs`` (rechunks' output names) that an xarray object in ``found`` makes:
    the names of its variables (coordinates too) whose data comes through that rechunk, as a
    user knows them (a Dataset's rechunks are otherwise told apart by dask's names only)."""
    outputs = set(outputs)
    named: dict[str, set] = {}
    for c in found:
        for name, variable in _named_variables(c):
            for output in outputs & _layer_names(variable.data):
                named.setdefault(output, set()).add(str(name))
    return {output: ", ".join(sorted(names)) for output, names in named.items()}


def _named_variables(x) -> list:
    if not is_xarray(x):
        return []
    if hasattr(x, "data_vars"):  # (a Dataset)
        return list(x.variables.items())
    own = [(x.name, x.variable)] if x.name is not None else []
    return own + list(x.coords.variables.items())


def _layer_names(data) -> set:
    """The names of the layers (of the expressions, in expression mode) that make ``data``."""
    from dask.base import is_dask_collection

    if not is_dask_collection(data):
        return set()
    expr = expression(data)
    if expr is not None:
        return {node._name for node in expr.walk()}
    return set(data.__dask_graph__().layers)


class ComputedTogether:
    """Collections ``dask.compute(*group)`` rewrites as one graph: their graphs merged, their keys
    asked for together (a rechunk two of them need runs once, and no consumer is fused into it
    that another needs the output beside), read by `explain` as one collection."""

    def __init__(self, group: list):
        self.group = group

    def __dask_graph__(self) -> HighLevelGraph:
        return HighLevelGraph.merge(*(c.__dask_graph__() for c in self.group))

    def __dask_keys__(self) -> list:
        return [c.__dask_keys__() for c in self.group]


def computed_together(collections: list) -> list:
    """``collections`` as ``dask.compute`` optimizes them: those of graphs (not `expression`s)
    with one ``__dask_optimize__`` as one `ComputedTogether`, the rest as they are."""
    groups: dict = {}
    for i, c in enumerate(collections):
        together = expression(c) is None and isinstance(c.__dask_graph__(), HighLevelGraph)
        groups.setdefault(_optimize_hook(c) if together else ("alone", i), []).append(c)
    return [g[0] if len(g) == 1 else ComputedTogether(g) for g in groups.values()]


def _optimize_hook(c):
    """``c``'s ``__dask_optimize__`` as ``dask.compute`` groups by it, read without what reading it
    on a dask array does while enabled (`dask_redist.api.snapshot`: the engine refused, the
    submission recorded): on its class. xarray's is a property giving dask's array hook."""
    if isinstance(inspect.getattr_static(c, "__dask_optimize__", None), property):
        return getattr(c, "__dask_optimize__", None)
    return getattr(type(c), "__dask_optimize__", None)


#: Why a rechunk in a Delayed's graph keeps Dask's rechunk (`as_delayed_runs`).
IN_A_DELAYED = (
    "this rechunk is in a Delayed's graph (array.to_delayed(optimize_graph=False)), which "
    "dask.delayed's optimizer computes, never dask-redist's rewrite: Dask's rechunk runs. Compute "
    "the array itself, or persist the rechunked array first and build on that"
)


def as_delayed_runs(x, decisions: list[Decision]) -> list[Decision]:
    """``decisions`` of ``x``'s graph as they run: in a ``Delayed``'s graph (whose optimizer is
    dask.delayed's, which does not call ``array_optimize``) every rechunk keeps Dask's."""
    from dask.delayed import Delayed

    if not isinstance(x, Delayed):
        return decisions
    return [replace(d, spec=None, reason=IN_A_DELAYED) if d.collective else d for d in decisions]
