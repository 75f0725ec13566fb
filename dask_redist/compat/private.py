"""The private dask and distributed API dask-redist relies on, and the dask versions it was checked on.

What ``enable()`` swaps in dask while it is on is in `compat.wrapped`; the rest is here. Both
are imported through `dask_redist.compat`, the one place that names dask's private API.

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
  ``Task.fuse`` and ``convert_legacy_task``: a chain of consumers fused (graph.fuse);
* ``dask.order.order``, looked up on the module by the scheduler for every graph:
  wrapped by runtime.ordering;
* ``dask.array.rechunk._compute_rechunk`` (one step of Dask's ``tasks`` rechunk) and how it
  names its layer (``rechunk-merge-`` + ``tokenize(x, chunks)``): while enabled, the module's
  function is swapped for one that builds the same layer lazily (`use_rechunk_step`, graph.lazy);
* ``dask.array.rechunk.plan_rechunk``: the steps of Dask's ``tasks`` rechunk, whose tasks the
  cost model counts (`plan_dask_rechunk`; planning.cost);
* ``Client._scheduler_identity`` (distributed's cache of the scheduler's identity, refreshed
  every few seconds): how many workers a client's cluster has, without a round trip
  (`cached_worker_count`; the cost model picks its model by it, on the client) and the
  scheduler's id (`cached_scheduler_id`: the plugins registered once per scheduler);
* expression mode: ``ArrayExpr.rechunk``, ``Rechunk`` and ``TasksRechunk`` in
  ``dask.array._array_expr`` (graph.expr);
* distributed's ``Scheduler._instances`` and ``Scheduler._active_graph_updates``: which
  scheduler of this process is building a graph (`running_schedulers`, `building_graph`;
  graph.optimize);
* an array's or expression's ``_meta`` (`meta_of`: api, explain, graph.expr) and an
  expression class's ``_parameters`` / ``_defaults`` (`with_operand`: graph.expr);
* a layer's ``collection_annotations["chunks"]``: the input chunks of a rechunk as the
  graph knows them (graph.optimize). ``Array.compute_chunk_sizes`` (and several dask
  functions that set ``Array._chunks`` after building) update the array, not the
  annotation, so while dask-redist is enabled ``compute_chunk_sizes`` and ``Array.rechunk``
  are wrapped to update both (`keep_annotations_current`);
* ``dask.array.rechunk.rechunk`` (what ``x.rechunk`` calls, also exported as ``da.rechunk``):
  wrapped while enabled to record a method the caller chose (``method=``, or dask's config
  `CONFIG_METHOD`; where it is to be kept) in the output layer's annotations `METHOD_ANNOTATION`
  and `METHOD_FROM_ANNOTATION` (`record_explicit_methods`): the layers of
  ``tasks`` and ``p2p`` look the same whether dask chose the method or the caller did; the
  other rechunks it returns under a name of the collective's own (graph.names), for which
  ``distributed.shuffle._rechunk.P2PRechunkLayer`` is subclassed (graph.p2p) and its fields
  copied (`p2p_layer_fields`);
* ``Array.__dask_optimize__`` is dask's ``GlobalMethod`` returning the config's
  ``array_optimize``, read on the client when a collection becomes the expression that is
  submitted (``dask._expr.HLGExpr.from_collection``): while dask-redist is enabled it is
  read through a function that snapshots the settings there (`read_array_optimize_through`).
* distributed's ``SpillBuffer`` (a worker's ``data``): the weights and values of its ``fast`` part,
  what Dask holds in RAM and could spill (`spill_buffer_in_memory`; runtime.staging);
* ``Scheduler._transition``, ``_transitions`` and ``send_all``: a task that no worker may run (its
  only allowed worker paused) failed with an aborted run's error (`fail_unrunnable`; runtime.lifecycle);
* ``Client.scheduler_info(n_workers=-1)`` is NOT relied on for the worker set: it fetches the
  scheduler's identity into a cache and returns the cache, which the client's periodic refresh
  (``identity(n_workers=0)``, no workers) may overwrite in between; under load that returned no
  workers at all (docs/benchmarks.md). `worker_info` asks
  the scheduler directly.
"""

from __future__ import annotations

from dask._task_spec import Alias, DataNode, GraphNode, Task, TaskRef, convert_legacy_task
from distributed.shuffle._rechunk import P2PRechunkLayer, rechunk_name


#: dask/distributed versions the test suite ran on (see the module docstring).
TESTED_DASK = ("2026.7.1", "2026.8.0")

#: Name prefixes of the layers dask builds for ``x.rechunk`` (HighLevelGraph path).
RECHUNK_PREFIXES = ("rechunk-merge-", "rechunk-split-", "rechunk-p2p-")
P2P_PREFIX = "rechunk-p2p-"


__all__ = [
    "Alias",
    "DataNode",
    "GraphNode",
    "P2PRechunkLayer",
    "P2P_PREFIX",
    "RECHUNK_PREFIXES",
    "TESTED_DASK",
    "Task",
    "TaskRef",
    "array_expr",
    "convert_legacy_task",
    "building_graph",
    "cached_worker_count",
    "meta_of",
    "p2p_layer_fields",
    "plan_dask_rechunk",
    "fail_unrunnable",
    "running_schedulers",
    "spill_buffer_in_memory",
    "with_operand",
    "worker_info",
]


def cached_worker_count(client) -> int | None:
    """How many workers ``client``'s cluster had when the client last heard (None: unknown)."""
    info = getattr(client, "_scheduler_identity", None) or {}
    n = info.get("n_workers") or len(info.get("workers") or ())
    return int(n) if n else None


def cached_scheduler_id(client) -> str | None:
    """The id of the scheduler ``client`` last heard from, without a round trip (None: unknown)."""
    info = getattr(client, "_scheduler_identity", None) or {}
    return info.get("id")


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


def is_expression(x) -> bool:
    """Is ``x`` a dask array of dask's expression mode (``array.query-planning: True``)?"""
    return type(x).__module__.startswith("dask.array._array_expr")


def with_operand(expr_class, name: str, default=None) -> tuple[list, dict]:
    """``(_parameters, _defaults)`` of a subclass of the expression class ``expr_class`` that
    takes one operand more, ``name`` (dask's expressions declare their operands so)."""
    return [*expr_class._parameters, name], {**expr_class._defaults, name: default}


def meta_of(x):
    """The meta of a dask array or array expression: an empty array of its chunks' type."""
    return x._meta


def running_schedulers() -> list:
    """The distributed Schedulers running in this process (distributed keeps them in a
    private weak set, ``Scheduler._instances``)."""
    try:
        from distributed import Scheduler
    except ImportError:  # pragma: no cover - distributed is a dependency
        return []
    return [s for s in list(Scheduler._instances) if s.status.name == "running"]


def building_graph(scheduler) -> bool:
    """Whether ``scheduler`` is building a graph now (``Scheduler._active_graph_updates``,
    private: where it is missing, no)."""
    return getattr(scheduler, "_active_graph_updates", 0) > 0


def p2p_layer_fields(layer, name: str) -> dict | None:
    """The fields of distributed's ``P2PRechunkLayer`` ``layer`` for a copy with output name ``name``
    (a `P2P_PREFIX` name): its token, which names its output, transfer and barrier keys, is the rest
    of ``name``. None where ``layer`` is no such layer."""
    token = name.removeprefix(P2P_PREFIX)
    if not isinstance(layer, P2PRechunkLayer) or rechunk_name(token) != name:
        return None
    return dict(
        name=name,
        token=token,
        chunks=layer.chunks,
        chunks_input=layer.chunks_input,
        name_input=layer.name_input,
        disk=layer.disk,
        keepmap=layer.keepmap,
        annotations=layer.annotations,
    )


def worker_info(client) -> dict[str, dict]:
    """Every worker of ``client``'s cluster (address -> its identity), asked of the scheduler now."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def default_client():
    """distributed's default Client, or None (distributed missing, or no Client)."""
    try:
        from distributed import default_client as get

        return get()
    except (ImportError, ValueError):
        return None


def spill_buffer_in_memory(data) -> list[tuple[int, object]] | None:
    """``(weight, value)`` of each key a worker's ``data`` holds in RAM, weighed as distributed's
    ``SpillBuffer`` weighs it (its ``fast`` part, a zict ``LRU``: ``weights`` and ``d``, private);
    None where ``data`` is no such buffer (a plain dict: nothing is spilled)."""
    fast = getattr(data, "fast", None)
    weights, values = getattr(fast, "weights", None), getattr(fast, "d", None)
    if not isinstance(weights, dict) or values is None:
        return None
    return [(w, values.get(k)) for k, w in dict(weights).items()]


def fail_unrunnable(scheduler, key, stimulus_id: str, **details) -> None:
    """Fail task ``key``, which waits with no worker allowed to run it (``no-worker``: its only
    allowed worker is paused), with ``details`` (``distributed.core.error_message``'s, less its
    status), as distributed fails a task that erred on a worker (``Scheduler._transition``,
    ``_transitions`` and ``send_all``, private: ``stimulus_task_erred`` takes processing tasks only)."""
    recommendations, client_msgs, worker_msgs = scheduler._transition(
        key, "erred", stimulus_id, cause=key, **details
    )
    scheduler._transitions(recommendations, client_msgs, worker_msgs, stimulus_id)
    scheduler.send_all(client_msgs, worker_msgs)
