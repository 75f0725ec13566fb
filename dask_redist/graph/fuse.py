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
  the same index, runs inside the unpack tasks (`runtime.tasks.unpack_into`) under its own keys.

What must keep its own tasks does: an output used by several layers, a requested or annotated
layer (workers, resources, retries), tasks that are not plain (aliases, Futures, collectives).
"""

from __future__ import annotations

from dataclasses import dataclass

from dask.blockwise import optimize_blockwise
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph

from dask_redist.compat import RECHUNK_PREFIXES, Task


@dataclass(frozen=True)
class Consumers:
    """The consumer layer whose tasks the unpack tasks run: ``tasks[flat]`` is output chunk
    ``flat``'s consumer, keyed ``(name, *index)`` like the chunk itself."""

    name: str
    tasks: list


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
    """The layer after the rechunk's ``output`` layer whose tasks its unpack tasks can run, or None.

    It must be the output's only dependent layer, neither annotated nor a rechunk nor ``taken``
    (another collective's input, or another collective's consumer already), with exactly one plain task per
    output chunk, keyed like it and needing no other output chunk; the output not ``requested``.
    """
    after = hlg.dependents.get(output, set())
    if output in requested or len(after) != 1 or after <= taken:
        return None
    (name,) = after
    layer = hlg.layers[name]
    if (
        layer.annotations
        or name.startswith(RECHUNK_PREFIXES)
        or type(layer).__name__ in ("CollectiveLayer", "LazyRechunkStep")
        or len(layer) != len(output_keys)
    ):
        return None
    tasks = []
    for key in output_keys:
        task = layer.get((name, *key[1:]))
        if type(task) is not Task or task.block_fusion:
            return None  # (an alias, data, a Future, another collective's task)
        if {d for d in task.dependencies if type(d) is tuple and d[0] == output} != {key}:
            return None
        tasks.append(task)
    return Consumers(name, tasks)
