"""How the collective's stage tasks are grouped, and which input tasks they run themselves.

Decided on the scheduler while the graph rewrite (`dask_redist.graph.optimize`) runs: a
persisted input whose placement is known gets one stage task per worker (`persisted_groups`),
an input computed in the same graph that nothing else needs has its chunks' tasks run by the
stage tasks (`inlined_inputs`), and the same rechunk submitted again while its tasks are known
gets the same graph (`stage_grouping`).
"""

from __future__ import annotations

import math
from collections import Counter
from functools import cache
from dataclasses import replace

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from dask_redist.compat import (
    Alias,
    DataNode,
    GraphNode,
    Task,
    building_graph,
    convert_legacy_task,
    running_schedulers,
)
from dask_redist.core.spec import BARRIER_PREFIX, CollectiveSpec
from dask_redist.graph.decide import is_rechunk_layer
from dask_redist.graph.layer import CollectiveLayer
from dask_redist.graph.lazy import LazyRechunkStep
from dask_redist.runtime import submitted


def _is_array(value) -> bool:
    return not isinstance(value, GraphNode) and hasattr(value, "shape") and hasattr(value, "dtype")


def inlined_inputs(
    hlg: HighLevelGraph, chain, requested: set, grid, force: bool = False, taken=frozenset()
) -> tuple[dict, dict, bool, tuple[str, ...]] | None:
    """The tasks of the chain's input chunks, for its stage tasks to run themselves, the rest of
    their layer, whether nothing else needs them, and the layers producing their inputs that
    they run too (`_feeders`; none of ``taken``); None where something else needs them
    (unless ``force``: an earlier submission of these keys inlined them), they are Futures or
    aliases of tasks the stage tasks do not run, their layer is annotated, or the graph is
    submitted with ``retries`` (``compute(retries=2)``: `runtime.submitted`; unless ``force``),
    which Dask counts per task: each chunk's task keeps its own. Chunks that are data (``da.from_array`` of a
    NumPy array embeds them) are carried by their stage tasks.

    A stage task after each input task is one more task per input chunk, and at a few
    thousand small chunks dask's cost per task is the rechunk's cost (Dask's p2p fuses its
    transfer tasks with their inputs; docs/benchmarks.md, "Inputs computed in the same graph").
    Dask's own fusion would keep the stage keys as aliases, one task each again, so the rewrite
    inlines them itself.
    """
    name = chain.source
    exclusive = name not in requested and all(  # (nothing else needs them, nor a step shared)
        hlg.dependents.get(n) == {after} for n, after in zip((name, *chain.layers), chain.layers)
    )
    if not (exclusive or force) or hlg.layers[name].annotations or (submitted.retried() and not force):
        return None  # (wanted by something else, or annotated: workers, resources, retries... stay its own)
    rest = dict(hlg.layers[name])
    chunks, known = {}, cache(lambda: _known_keys(hlg, name))
    for idx in np.ndindex(*grid):
        key = (name, *idx)
        task = _node(key, rest.pop(key, None), known)
        if not _plain(task):
            return None  # (a Future, another collective's output)
        chunks[key] = task
    outside = _needed_by(rest, known)
    if outside & chunks.keys():
        return None
    feeders = _feeders(hlg, name, chunks, outside, requested, taken)
    inside = {k for tasks in feeders.values() for k in tasks}
    if any(isinstance(t, Alias) and t.target not in inside for t in chunks.values()):
        return None  # (an alias of a task the stage tasks do not run: it stays)
    for key, needs in _needs(chunks, feeders).items():  # (each chunk's task after what it needs)
        chunks[key] = Task.fuse(*needs, chunks[key], key=key)
    return chunks, rest, exclusive, tuple(feeders)


def _node(key, value, known):
    """``value`` of ``key`` as a graph node: data (``da.from_array`` embeds a NumPy array's
    chunks, which the stage task carries) as a `DataNode`, a legacy tuple as a `Task` or an
    `Alias` (its references among the keys ``known()`` gives: ``da.stack``'s, ``da.concatenate``'s)."""
    if _is_array(value):
        return DataNode(key, value)
    if type(value) is tuple:
        return convert_legacy_task(key, value, known())
    return value


def _plain(task) -> bool:
    """Is ``task`` one that may run inside another: a plain task, data or an alias."""
    return isinstance(task, (Task, DataNode, Alias)) and not task.block_fusion


def _known_keys(hlg: HighLevelGraph, name: str) -> set:
    """The keys a legacy task of layer ``name`` may refer to: its layer's and its dependencies'."""
    layers = (name, *hlg.dependencies.get(name, ()))
    return set().union(*(hlg.layers[n].get_output_keys() for n in layers))


def _needed_by(tasks: dict, known) -> set:
    """The keys ``tasks`` depend on; a legacy tuple's read among the keys ``known()`` gives
    (`_known_keys` of their layer)."""
    nodes = (_node(key, task, known) for key, task in tasks.items())
    return set().union(*(t.dependencies for t in nodes if isinstance(t, GraphNode)))


def _feeders(
    hlg: HighLevelGraph, name: str, chunks: dict, outside: set, requested: set, taken
) -> dict[str, dict]:
    """The layers producing the inputs of layer ``name``'s ``chunks`` that the stage tasks run
    too, deepest first, by name: their tasks. Dask's low-level fusion runs a task inside its one
    dependent (``(2 * rng.standard_normal(...)) ** 2``, ``2 * da.arange(n).reshape(a, b) + 1``:
    one task per chunk); the stage tasks run them too, or they were one task more per chunk
    each. A layer is taken where every task of it is plain (`_plain_tasks`) and used by exactly
    one task the stage tasks run (a chunk's, or a taken layer's), by nothing else (``outside``: the
    keys the other tasks of layer ``name`` need, which stay), and the layer is not requested,
    annotated, a rechunk's or ``taken`` (another collective's input or consumer). Its tasks may
    depend on other layers: the stage tasks depend on those (a persisted array's chunks)."""
    dependents, dependencies = hlg.dependents, hlg.dependencies  # (built anew on each access)
    inside, out = {name}, {}
    uses = Counter(k for t in chunks.values() for k in t.dependencies)
    refused: set = set()
    found = True
    while found:  # (a layer once all its dependents are inside: they use its tasks)
        found = False
        for dep in sorted({d for n in inside for d in dependencies.get(n, ())} - inside - refused, key=str):
            if not dependents.get(dep, set()) <= inside:
                continue
            tasks = _plain_tasks(hlg, dep, requested, taken)
            if tasks is None or outside & tasks.keys() or any(uses[k] != 1 for k in tasks):
                refused.add(dep)
                continue
            out[dep] = tasks
            inside.add(dep)
            uses.update(k for t in tasks.values() for k in t.dependencies)
            found = True
    return dict(reversed(out.items()))


def _plain_tasks(hlg: HighLevelGraph, name: str, requested: set, taken) -> dict | None:
    """Layer ``name``'s tasks as graph nodes (`_node`), where each is a plain task, data or an
    alias (`_plain`), and the layer is not requested, annotated, nor a rechunk's or a
    collective's, nor ``taken``; else None."""
    layer = hlg.layers[name]
    if name in requested or name in taken or layer.annotations or is_rechunk_layer(name, layer):
        return None
    if isinstance(layer, (CollectiveLayer, LazyRechunkStep)):
        return None
    known = cache(lambda: _known_keys(hlg, name))
    tasks = {k: _node(k, t, known) for k, t in layer.items()}
    return tasks if all(map(_plain, tasks.values())) else None


def _needs(chunks: dict, feeders: dict[str, dict]) -> dict:
    """For each chunk's task that depends on ``feeders``' tasks: those tasks, each after the
    tasks it needs in turn."""
    found = {k: t for tasks in feeders.values() for k, t in tasks.items()}
    out = {}
    for key, task in chunks.items():
        needs, todo = {}, [k for k in task.dependencies if k in found]
        while todo:
            k = todo.pop()
            if k not in needs:
                needs[k] = found[k]
                todo.extend(d for d in found[k].dependencies if d in found)
        if needs:
            out[key] = list(needs.values())
    return out


def scheduler_in_process():
    """The scheduler building this graph, or None where that is unclear. Several can run in one
    process (two LocalClusters in a notebook): the one building a graph now is taken
    (`compat.building_graph`; where that cannot be told, only a lone scheduler is)."""
    running = running_schedulers()
    if len(running) > 1:  # (several in one process: the one whose graph is being built now)
        running = [s for s in running if building_graph(s)]
    return running[0] if len(running) == 1 else None


#: The stage grouping each rechunk (by its plain token) got last on this scheduler, and
#: whether its stage tasks ran their input chunks' tasks.
_GROUPINGS: dict[str, tuple[str, list | None, bool]] = {}
GROUPINGS_KEPT = 10_000


def stage_grouping(
    spec: CollectiveSpec, inline=lambda force: None
) -> tuple[CollectiveSpec, list | None, tuple | None]:
    """The spec, stage groups and inlined inputs (``inline(force)``: `inlined_inputs`) of a
    rechunk's graph; same keys always mean the same tasks.

    Grouping depends on where the input is, which changes (a worker died, the input was
    persisted again): a grouped graph gets a token of its own, so its stage and barrier keys
    are its own. While the tasks of an earlier submission are still known to the scheduler,
    the same rechunk gets that graph again, inlined inputs as before included, so that its
    keys keep their tasks (distributed warns about a key resubmitted with other dependencies,
    and keeps the old).
    """
    scheduler = scheduler_in_process()
    earlier = _GROUPINGS.get(spec.token)
    if earlier is not None and scheduler is not None and BARRIER_PREFIX + earlier[0] in scheduler.tasks:
        token, groups, inlined = earlier
        inputs = inline(True) if inlined else None
        if inlined and inputs is None:  # (cannot be built as before: keys of its own)
            token = tokenize(token, "inputs not inlined")
    else:
        groups = persisted_groups(spec)
        inputs = inline(False) if groups is None else None
        if inputs is not None:
            groups = inlined_groups(inputs[0], spec)
        token = (
            spec.token
            if groups is None
            else tokenize(spec.token, group_of_chunks(groups, spec.rechunk.old_grid))
        )
        _GROUPINGS.pop(spec.token, None)
        _GROUPINGS[spec.token] = (token, groups, inputs is not None)
        while len(_GROUPINGS) > GROUPINGS_KEPT:
            del _GROUPINGS[next(iter(_GROUPINGS))]
    return (spec if token == spec.token else replace(spec, token=token)), groups, inputs


def inlined_groups(tasks: dict, spec: CollectiveSpec) -> list[list[tuple[int, ...]]] | None:
    """Input chunks whose tasks the stage tasks run (`inlined_inputs`), grouped one stage task
    per worker thread: by the worker holding most of each chunk's own inputs where they are all
    in memory (a blockwise step over a persisted array), in even shares of C order where none
    has inputs (generated in the graph) or all need the same ones (the object ``da.from_array``
    reads from: a memmap, a zarr or HDF5 array); None (one stage task per chunk) otherwise."""
    scheduler = scheduler_in_process()
    if scheduler is None or not scheduler.workers:
        return None
    grid, name = spec.rechunk.old_grid, spec.input_name
    try:
        needs = [tasks[(name, *idx)].dependencies for idx in np.ndindex(*grid)]
        threads = {w: ws.nthreads or 1 for w, ws in scheduler.workers.items()}
        if not any(needs) or len(needs) > 1 and len(set(needs)) == 1:
            return _shares([list(np.ndindex(*grid))], sum(threads.values()))
        if not all(needs):
            return None
        by_worker: dict[str, list] = {}
        for idx, keys in zip(np.ndindex(*grid), needs):
            where = _holder(scheduler.tasks, keys)
            if where is None:
                return None
            by_worker.setdefault(where, []).append(idx)
    except RuntimeError:  # state changed under us (another thread): no grouping
        return None
    return [g for w in sorted(by_worker) for g in _shares([by_worker[w]], threads.get(w, 1))]


def _holder(tasks, keys) -> str | None:
    """The worker holding most of ``keys`` (all in memory), or None."""
    count: dict[str, int] = {}
    for key in keys:
        ts = tasks.get(key)
        if ts is None or ts.state != "memory" or not ts.who_has:
            return None
        for ws in ts.who_has:
            count[ws.address] = count.get(ws.address, 0) + 1
    return min(count, key=lambda w: (-count[w], w))


def _shares(groups: list[list], parts: int) -> list[list]:
    """Each group cut into ``parts`` contiguous shares (fewer where it has fewer members)."""
    out = []
    for group in groups:
        bounds = np.linspace(0, len(group), min(parts, len(group)) + 1).round().astype(int)
        out += [group[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    return out


def group_of_chunks(groups: list[list[tuple[int, ...]]], grid) -> np.ndarray:
    """Each input chunk's group number, by flat index: the grouping as one array, which dask
    tokenizes by its bytes (lists of index tuples were most of the rewrite's time at thousands of
    chunks: docs/benchmarks.md, "Down to Dask's own floor")."""
    out = np.empty(math.prod(grid), dtype=np.int64)
    for g, group in enumerate(groups):
        out[np.ravel_multi_index(tuple(np.asarray(group).T), grid)] = g
    return out


def persisted_groups(spec: CollectiveSpec) -> list[list[tuple[int, ...]]] | None:
    """Input chunk indices grouped by the worker holding them, if all are in memory already.

    Then one stage task per worker does: far fewer tasks than one per chunk. Read
    from the scheduler's state (this runs on the scheduler while the graph is
    materialized); anything unclear, and the plan stays one stage task per chunk.
    """
    scheduler = scheduler_in_process()
    if scheduler is None:
        return None

    def holders(idx):
        ts = scheduler.tasks.get((spec.input_name, *idx))
        return [ws.address for ws in ts.who_has] if ts is not None and ts.state == "memory" else None

    try:
        return groups_by_holder(holders, spec.rechunk.old_grid)
    except RuntimeError:  # state changed under us (another thread): no grouping
        return None


def groups_by_holder(holders, grid) -> list[list[tuple[int, ...]]] | None:
    """Chunk indices of ``grid`` grouped by the worker holding them (``holders(idx)``: the
    addresses holding chunk ``idx``, or None where it is not in memory), in address order;
    None where a chunk is not held, or no two chunks share a worker (nothing to group)."""
    groups: dict[str, list] = {}
    for idx in np.ndindex(*grid):
        where = holders(idx)
        if not where:
            return None
        groups.setdefault(min(where), []).append(idx)
    if len(groups) >= math.prod(grid):
        return None
    return [groups[w] for w in sorted(groups)]
