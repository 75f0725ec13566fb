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
* **consumers**: a layer that is the rechunk's only dependent, one task per output chunk with
  the same index, runs inside the unpack tasks (`runtime.tasks.unpack_into`) under its own keys;
  so do the layers after it that take one task of the last for one of their own (a reduction's
  aggregation over an axis of one chunk, whose keys drop that axis), fused into one task.

What must keep its own tasks does: an output used by several layers, a requested or annotated
layer (workers, resources, retries), tasks that are not plain (aliases, Futures, collectives).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from dask.blockwise import optimize_blockwise
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph

from dask_redist.compat import RECHUNK_PREFIXES, Task, convert_legacy_task


@dataclass(frozen=True)
class Consumers:
    """The consumer layers whose tasks the unpack tasks run: ``tasks[flat]`` is output chunk
    ``flat``'s consumer (a chain of layers fused into one task), keyed as the last layer keys it."""

    names: tuple[str, ...]  # the layers, in order: the unpack tasks carry the last one's keys
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

    The first must be the output's only dependent layer, neither annotated nor a rechunk nor
    ``taken`` (another collective's input, or another collective's consumer already), with exactly
    one plain task per output chunk, keyed like it and needing no other output chunk; the output
    not ``requested``. Then each layer that follows one task for one task (`_chained`: the
    aggregation of a reduction over an axis of one chunk) joins the chain.
    """
    found = _only_dependent(hlg, output, requested, taken)
    if found is None or len(found[1]) != len(output_keys):
        return None
    name, layer = found
    known = _known_keys(hlg, name, output_keys)
    tasks = []
    for key in output_keys:
        task = _plain(layer.get((name, *key[1:])), (name, *key[1:]), known)
        if task is None or {d for d in task.dependencies if _in(d, output)} != {key}:
            return None  # (an alias, data, a Future, another collective's task, other chunks)
        tasks.append(task)
    names, axes, index = [name], None, [key[1:] for key in output_keys]
    while (step := _chained(hlg, names[-1], tasks, index, requested, taken)) is not None:
        name, tasks, axes = step
        names.append(name)
    return Consumers(tuple(names), tasks, axes)


def _in(key, layer: str) -> bool:
    return type(key) is tuple and bool(key) and key[0] == layer


def _only_dependent(hlg: HighLevelGraph, name: str, requested: set, taken):
    """(name, layer) of the one layer that depends on layer ``name``, where it may run inside
    the unpack tasks, or None."""
    after = hlg.dependents.get(name, set())
    if name in requested or len(after) != 1 or after <= taken:
        return None
    (next_name,) = after
    layer = hlg.layers[next_name]
    if (
        layer.annotations
        or next_name.startswith(RECHUNK_PREFIXES)
        or type(layer).__name__ in ("CollectiveLayer", "LazyRechunkStep")
    ):
        return None
    return next_name, layer


def _known_keys(hlg: HighLevelGraph, name: str, more) -> set:
    """The keys a task of layer ``name`` may refer to: its layer's, its dependencies', ``more``."""
    known = set(hlg.layers[name].get_output_keys()) | set(more)
    for dep in hlg.dependencies.get(name, ()):
        known |= set(hlg.layers[dep].get_output_keys())
    return known


def _plain(task, key, known: set):
    """``task`` as a plain `Task` (a legacy tuple converted, its references among ``known``
    keys), or None where it is anything else: an alias, data, a Future, a collective's task."""
    if type(task) is tuple and task and callable(task[0]):
        task = convert_legacy_task(key, task, known)
    if type(task) is not Task or task.block_fusion:
        return None
    return task


def _chained(hlg: HighLevelGraph, name: str, tasks: list, index: list, requested: set, taken):
    """The layer after consumer layer ``name`` fused into its ``tasks`` (output chunk ``index``
    tails), as (its name, the fused tasks, the axes of the index its keys keep), or None: it must
    be ``name``'s only dependent, one task per task of ``name``, each needing exactly one of them,
    keyed by that chunk's index less some axes of one chunk (``mean(axis=0)`` over such an axis)."""
    found = _only_dependent(hlg, name, requested, taken)
    if found is None or len(found[1]) != len(tasks):
        return None
    next_name, layer = found
    known = _known_keys(hlg, next_name, [t.key for t in tasks])
    by_input: dict = {}
    for key in layer.get_output_keys():
        task = _plain(layer.get(key), key, known) if _in(key, next_name) else None
        inputs = [] if task is None else [d for d in task.dependencies if _in(d, name)]
        if len(inputs) != 1 or inputs[0] in by_input:
            return None
        by_input[inputs[0]] = task
    after = [by_input.get(t.key) for t in tasks]
    if any(a is None for a in after):
        return None
    axes = _kept_axes(index, [a.key[1:] for a in after])
    if axes is None:
        return None
    fused = [Task.fuse(t, a, key=a.key) for t, a in zip(tasks, after)]
    return next_name, fused, (None if axes == tuple(range(len(index[0]))) else axes)


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
