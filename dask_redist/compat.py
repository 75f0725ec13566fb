"""The one place that names dask's private API and the dask versions it was checked on.

dask-redist rewrites graphs and task priorities, which public API does not reach.
Everything private it touches is imported from here, so that a dask release that
moves something breaks one module, with this docstring saying what to look at.

Tested versions: dask/distributed **2026.7.1** (what ``rapids-dask-dependency``
26.10 pins, i.e. what every dask-cuda 26.10 user has) and **2026.8.0** (the newest
release). CI runs the whole suite on both (README's test command). Between the two,
the modules used here are identical (``dask/array/rechunk.py``, ``dask/_task_spec.py``,
``dask/order.py``, ``dask/array/_array_expr/``, ``distributed/shuffle/``), so no
branch on the version is needed; the differences are elsewhere (dataframe,
nanny shutdown). Where a later release does differ, the branch goes here.

What is relied on, and where:

* layer names of ``x.rechunk``: ``rechunk-merge-*`` / ``rechunk-split-*`` (the
  ``tasks`` method, one or several steps) and ``rechunk-p2p-*`` (after a
  ``rechunk-merge-*`` pre-chunking layer) -> `RECHUNK_PREFIXES` (graph.optimize);
* ``dask._task_spec`` (``Task``, ``DataNode``, ``TaskRef``, ``Task.block_fusion``):
  the collective's tasks (graph.layer) and the barrier stand-in (runtime.ordering);
* ``dask.order.order``, looked up on the module by the scheduler for every graph:
  wrapped by runtime.ordering;
* expression mode: ``ArrayExpr.rechunk``, ``Rechunk`` and ``TasksRechunk`` in
  ``dask.array._array_expr`` (graph.expr);
* a layer's ``collection_annotations["chunks"]``: the input chunks of a rechunk as the
  graph knows them (graph.optimize). ``Array.compute_chunk_sizes`` updates the array, not
  the annotation, so while dask-redist is enabled it is wrapped to update both
  (`keep_annotations_current`).
"""

from __future__ import annotations

from dask._task_spec import DataNode, GraphNode, Task, TaskRef

#: dask/distributed versions the test suite ran on (see the module docstring).
TESTED_DASK = ("2026.7.1", "2026.8.0")

#: Name prefixes of the layers dask builds for ``x.rechunk`` (HighLevelGraph path).
RECHUNK_PREFIXES = ("rechunk-merge-", "rechunk-split-", "rechunk-p2p-")
P2P_PREFIX = "rechunk-p2p-"

__all__ = [
    "DataNode", "GraphNode", "P2P_PREFIX", "RECHUNK_PREFIXES", "TESTED_DASK", "Task", "TaskRef", "array_expr",
    "keep_annotations_current",
]  # fmt: skip


def array_expr():
    """``(ArrayExpr, Rechunk, TasksRechunk)`` of dask's expression mode (ImportError without it)."""
    from dask.array._array_expr._expr import ArrayExpr
    from dask.array._array_expr._rechunk import Rechunk, TasksRechunk

    return ArrayExpr, Rechunk, TasksRechunk


def _compute_chunk_sizes(self):
    x = _original_compute_chunk_sizes(self)
    layer = x.dask.layers.get(x.name) if hasattr(x.dask, "layers") else None
    if layer is not None and layer.collection_annotations is not None:
        layer.collection_annotations.update(chunks=x.chunks, shape=x.shape, chunksize=x.chunksize)
    return x


def keep_annotations_current(on: bool) -> None:
    """While on, ``x.compute_chunk_sizes()`` also writes the sizes into the annotation of
    ``x``'s layer, where a later rechunk's graph finds its input chunks (dask leaves the
    annotation as the layer was built: NaN, or chunks of an earlier array of that name)."""
    from dask.array import Array

    if _original_compute_chunk_sizes is not None:  # (expression mode's Array has no graph layers to keep)
        Array.compute_chunk_sizes = _compute_chunk_sizes if on else _original_compute_chunk_sizes


def _original():
    from dask.array import Array

    return getattr(Array, "compute_chunk_sizes", None)


_original_compute_chunk_sizes = _original()
