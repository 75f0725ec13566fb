"""A collective rechunk fused with its neighbours in the graph.

Without the rechunk, dask runs a pipeline such as ``(2 * x + 1) ** 2`` as one task per
chunk: its blockwise steps fuse. A rechunk between them (``((2 * x + 1).rechunk(c)) ** 2``)
is a fusion barrier in every form dask has, and as the collective it was one stage task per
input chunk after a task per chunk of the producer, and a consumer task per chunk after each
unpack: three tasks per chunk where the rechunk alone has one. This module takes the
neighbours into the collective's own tasks:

* **producers**: dask's blockwise fusion (`dask.blockwise.optimize_blockwise`) first, so that
  a chain of blockwise steps before the rechunk is one layer whose tasks the stage tasks run
  themselves (`graph.stages.inlined_inputs`), grouped one stage task per worker thread where
  the producers' own inputs are in memory (`graph.stages.inlined_groups`);
* **consumers**: the layers below the rechunk with one task per output chunk computed from that
  chunk alone (elementwise steps, ``map_blocks``, a reduction over axes the rechunk leaves in one
  chunk, whose keys drop those axes; an anomaly ``z - z.mean(axis=0)``) run inside the unpack
  tasks (`runtime.tasks.unpack_into`), fused into one task under the last one's keys.

What must keep its own tasks does: an output or a step used outside the fused part (``z -
z.sum()``: the total needs every chunk first), a requested or annotated layer (workers,
resources, retries), tasks that are not plain (aliases, Futures, collectives); and nothing is
fused into an output the scheduler holds in memory (persisted): its consumers use those chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from graphlib import TopologicalSorter
from itertools import combinations

from dask.blockwise import optimize_blockwise
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph

from dask_redist.compat import Task, convert_legacy_task
from dask_redist.graph.decide import is_rechunk_layer


@dataclass(frozen=True)
class Consumers:
    """The consumer layers whose tasks the unpack tasks run: ``tasks[flat]`` is output chunk
    ``flat``'s consumer (the layers' tasks fused into one), keyed as the last layer keys it."""

    names: tuple[str, ...]  # the layers, in topological order: the unpack tasks carry the last one's keys
    tasks: list
    #: the axes of a chunk's index the last layer's keys keep (None: all; see `CollectiveSpec`)
    axes: tuple[int, ...] | None = None

    @property
    def name(self) -> str:
        return self.names[-1]


def fuse_blockwise(hlg: HighLevelGraph, keys) -> HighLevelGraph:
    """``hlg`` with its chains of blockwise layers fused (as dask's own optimization does after
    the rewrite), each layer's collection annotations kept (dask's fusion drops them)."""
    fused = optimize_blockwise(hlg, keys=list(flatten(keys)) if keys else ())
    for name, layer in fused.layers.items():
        if getattr(layer, "collection_annotations", None) is None and name in hlg.layers:
            layer.collection_annotations = hlg.layers[name].collection_annotations
    return fused


def fusable_consumers(
    hlg: HighLevelGraph, output: str, output_keys: list, requested: set, taken: set = frozenset()
) -> Consumers | None:
    """The layers after the rechunk's ``output`` layer whose tasks its unpack tasks can run, or None.

    Candidates are the layers below the output with one plain task per output chunk, computed
    from that chunk's tasks alone (`_per_chunk`): elementwise steps, ``map_blocks``, the steps of
    a reduction over axes the rechunk leaves in one chunk, an anomaly ``z - z.mean(axis=0)``. The
    unpack tasks compute those that end in one layer (`_closed`), the latest such: every
    other layer of it, and the output, used only inside it and not ``requested``. None of them is
    annotated, a rechunk or ``taken`` (another collective's input, or its consumer already; with
    the ``output`` taken, held in memory on the scheduler, nothing is fused).
    """
    if output in requested or output in taken:
        return None
    index = [key[1:] for key in output_keys]
    dependents = hlg.dependents  # (built anew on each access)
    below = _descendants(dependents, output)
    members: dict[str, dict] = {output: {key: k for k, key in enumerate(output_keys)}}
    tasks: dict[str, list] = {}  # (in topological order)
    axes: dict[str, tuple | None] = {}
    for name in _toposorted(hlg, below):
        found = _per_chunk(hlg, name, members, below, index, taken)
        if found is not None:
            tasks[name], axes[name] = found
            members[name] = {t.key: k for k, t in enumerate(tasks[name])}
    order = list(tasks)
    for sink in reversed(order):
        chosen = _closed(hlg, dependents, output, sink, order, requested)
        if chosen is not None:
            fused = [
                Task.fuse(*(tasks[n][k] for n in chosen), key=tasks[sink][k].key) if len(chosen) > 1 else t
                for k, t in enumerate(tasks[sink])
            ]
            return Consumers(tuple(chosen), fused, axes[sink])
    return None


def _in(key, layer: str) -> bool:
    return type(key) is tuple and bool(key) and key[0] == layer


def _descendants(dependents: dict, name: str) -> set:
    """The layers computed from layer ``name``, directly or not (``dependents``: a graph's)."""
    out, todo = set(), [name]
    while todo:
        for d in dependents.get(todo.pop(), ()):
            if d not in out:
                out.add(d)
                todo.append(d)
    return out


def _toposorted(hlg: HighLevelGraph, names: set) -> list:
    """``names`` in an order where each comes after the layers of ``names`` it depends on."""
    return list(TopologicalSorter({n: hlg.dependencies.get(n, set()) & names for n in names}).static_order())


def _per_chunk(hlg: HighLevelGraph, name: str, members: dict, below: set, index: list, taken):
    """Layer ``name``'s tasks by output chunk, and the axes of a chunk's index its keys keep
    (`_kept_axes`; None: all), where each is a plain task computed from one output chunk's tasks
    in ``members`` (layer: {key: chunk}) and from nothing else below the output; else None."""
    deps = hlg.dependencies.get(name, set())
    mine = deps & set(members)
    layer = hlg.layers[name]
    if (
        not mine
        or any(d in below and d not in members for d in deps)  # (computed from other chunks)
        or name in taken
        or layer.annotations
        or is_rechunk_layer(name, layer)
        or type(layer).__name__ in ("CollectiveLayer", "LazyRechunkStep")
        or len(layer) != len(index)
    ):
        return None
    known = cache(lambda: _known_keys(hlg, name))  # (legacy tuple tasks only need them)
    by_chunk: list = [None] * len(index)
    for key in layer.get_output_keys():
        task = _plain(layer.get(key), key, known) if _in(key, name) else None
        inputs = (
            [] if task is None else [d for d in task.dependencies if type(d) is tuple and d and d[0] in mine]
        )
        chunks = {members[d[0]].get(d) for d in inputs}
        if len(chunks) != 1 or len(inputs) != len({d[0] for d in inputs}) or None in chunks:
            return None
        (k,) = chunks
        if by_chunk[k] is not None:
            return None
        by_chunk[k] = task
    kept = _kept_axes(index, [t.key[1:] for t in by_chunk])
    if kept is None:
        return None
    return by_chunk, (None if kept == tuple(range(len(index[0]))) else kept)


def _closed(hlg: HighLevelGraph, dependents: dict, output: str, sink: str, order: list, requested: set):
    """The candidate layers that ``sink`` is computed from, and ``sink``, in ``order``, where the
    output and each of them but ``sink`` is used inside them only and not requested; else None."""
    candidates, inside, todo = set(order), {sink}, [sink]
    while todo:
        for d in hlg.dependencies.get(todo.pop(), ()):
            if d in candidates and d not in inside:
                inside.add(d)
                todo.append(d)
    if not dependents.get(output, set()) <= inside:
        return None
    for name in inside - {sink}:
        if name in requested or not dependents.get(name, set()) <= inside:
            return None
    return [n for n in order if n in inside]


def _known_keys(hlg: HighLevelGraph, name: str) -> set:
    """The keys a task of layer ``name`` may refer to: its layer's and its dependencies'."""
    known = set(hlg.layers[name].get_output_keys())
    for dep in hlg.dependencies.get(name, ()):
        known |= set(hlg.layers[dep].get_output_keys())
    return known


def _plain(task, key, known):
    """``task`` as a plain `Task` (a legacy tuple converted, its references among the keys
    ``known()`` gives), or None where it is anything else: an alias, data, a Future, a
    collective's task."""
    if type(task) is tuple and task and callable(task[0]):
        task = convert_legacy_task(key, task, known())
    if type(task) is not Task or task.block_fusion:
        return None
    return task


def _kept_axes(index: list, tails: list) -> tuple[int, ...] | None:
    """The axes ``a`` (in order) with ``tail == index[a]`` for every pair, the others always 0 (an
    axis of one chunk), or None."""
    ndim, m = len(index[0]), len(tails[0])
    for axes in combinations(range(ndim), m):
        dropped = [a for a in range(ndim) if a not in axes]
        if all(
            len(t) == m and tuple(i[a] for a in axes) == tuple(t) and all(i[a] == 0 for a in dropped)
            for i, t in zip(index, tails)
        ):
            return axes
    return None
