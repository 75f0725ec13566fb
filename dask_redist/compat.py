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
* ``dask.array.rechunk._compute_rechunk`` (one step of Dask's ``tasks`` rechunk) and how it
  names its layer (``rechunk-merge-`` + ``tokenize(x, chunks)``): while enabled, the module's
  function is swapped for one that builds the same layer lazily (`use_rechunk_step`, graph.lazy);
* ``dask.array.rechunk.plan_rechunk``: the steps of Dask's ``tasks`` rechunk, whose tasks the
  cost model counts (`plan_dask_rechunk`; planning.cost);
* ``Client._scheduler_identity`` (distributed's cache of the scheduler's identity, refreshed
  every few seconds): how many workers a client's cluster has, without a round trip
  (`cached_worker_count`; the cost model picks its model by it, on the client);
* expression mode: ``ArrayExpr.rechunk``, ``Rechunk`` and ``TasksRechunk`` in
  ``dask.array._array_expr`` (graph.expr);
* a layer's ``collection_annotations["chunks"]``: the input chunks of a rechunk as the
  graph knows them (graph.optimize). ``Array.compute_chunk_sizes`` (and several dask
  functions that set ``Array._chunks`` after building) update the array, not the
  annotation, so while dask-redist is enabled ``compute_chunk_sizes`` and ``Array.rechunk``
  are wrapped to update both (`keep_annotations_current`).
"""

from __future__ import annotations

import math

from dask._task_spec import DataNode, GraphNode, Task, TaskRef

#: dask/distributed versions the test suite ran on (see the module docstring).
TESTED_DASK = ("2026.7.1", "2026.8.0")

#: Name prefixes of the layers dask builds for ``x.rechunk`` (HighLevelGraph path).
RECHUNK_PREFIXES = ("rechunk-merge-", "rechunk-split-", "rechunk-p2p-")
P2P_PREFIX = "rechunk-p2p-"

__all__ = [
    "DataNode", "GraphNode", "P2P_PREFIX", "RECHUNK_PREFIXES", "TESTED_DASK", "Task", "TaskRef", "array_expr",
    "cached_worker_count", "keep_annotations_current", "original_rechunk_step", "plan_dask_rechunk",
    "use_rechunk_step",
]  # fmt: skip


def _rechunk_module():
    import importlib

    return importlib.import_module("dask.array.rechunk")  # (the package's attribute is the function)


_original_step = _rechunk_module()._compute_rechunk


def original_rechunk_step(x, chunks):
    """Dask's own ``_compute_rechunk``: one step of its ``tasks`` rechunk, every task built."""
    return _original_step(x, chunks)


def use_rechunk_step(step=None) -> None:
    """``dask.array.rechunk`` builds each step of its ``tasks`` rechunk with ``step`` (None: its own).

    ``rechunk`` looks the function up on its module at every call."""
    _rechunk_module()._compute_rechunk = step or _original_step


def cached_worker_count(client) -> int | None:
    """How many workers ``client``'s cluster had when the client last heard (None: unknown)."""
    info = getattr(client, "_scheduler_identity", None) or {}
    n = info.get("n_workers") or len(info.get("workers") or ())
    return int(n) if n else None


def plan_dask_rechunk(old, new, itemsize: int) -> list:
    """The chunks after each step of Dask's ``tasks`` rechunk from ``old`` to ``new`` (the last
    is ``new``), as Dask's planner picks them with the config's threshold and block size."""
    if any(sum(axis) == 0 for axis in old):
        return [new]  # (Dask builds an empty array, no steps)
    from dask.array.rechunk import plan_rechunk

    return plan_rechunk(old, new, itemsize)


def array_expr():
    """``(ArrayExpr, Rechunk, TasksRechunk)`` of dask's expression mode (ImportError without it)."""
    from dask.array._array_expr._expr import ArrayExpr
    from dask.array._array_expr._rechunk import Rechunk, TasksRechunk

    return ArrayExpr, Rechunk, TasksRechunk


def _annotate_chunks(x) -> None:
    """Write ``x``'s chunks into its layer's annotation where that says otherwise."""
    layer = x.dask.layers.get(x.name) if hasattr(x.dask, "layers") else None
    annotations = getattr(layer, "collection_annotations", None)
    known = not any(math.isnan(c) for c in x.shape)
    if known and annotations is not None and annotations.get("chunks", x.chunks) != x.chunks:
        annotations.update(chunks=x.chunks, shape=x.shape, chunksize=x.chunksize)


def _compute_chunk_sizes(self):
    x = _original_compute_chunk_sizes(self)
    _annotate_chunks(x)
    return x


def _rechunk(self, *args, **kwargs):
    _annotate_chunks(self)
    return _original_rechunk(self, *args, **kwargs)


def keep_annotations_current(on: bool) -> None:
    """While on, ``x.compute_chunk_sizes()`` and ``x.rechunk(...)`` write ``x``'s chunks into the
    annotation of its layer, where a later rechunk's graph finds its input chunks. Dask leaves
    the annotation as the layer was built, and several of its own functions set an array's
    chunks afterwards: ``compute_chunk_sizes()``, ``to_dask_array(lengths=True)``,
    ``da.topk``, ``da.bincount`` (the annotation says NaN, or chunks of the array before)."""
    from dask.array import Array

    if _original_compute_chunk_sizes is not None:  # (expression mode's Array has no graph layers to keep)
        Array.compute_chunk_sizes = _compute_chunk_sizes if on else _original_compute_chunk_sizes
        Array.rechunk = _rechunk if on else _original_rechunk


def _original(name: str):
    from dask.array import Array

    return getattr(Array, name, None)


_original_compute_chunk_sizes = _original("compute_chunk_sizes")
_original_rechunk = _original("rechunk")
