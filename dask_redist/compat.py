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
* ``Client.scheduler_info(n_workers=-1)`` is NOT relied on for the worker set: it fetches the
  scheduler's identity into a cache and returns the cache, which the client's periodic refresh
  (``identity(n_workers=0)``, no workers) may overwrite in between; under load that returned no
  workers at all (docs/benchmarks.md). `worker_info` asks
  the scheduler directly.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading

from dask._task_spec import Alias, DataNode, GraphNode, Task, TaskRef, convert_legacy_task
from distributed.shuffle._rechunk import P2PRechunkLayer, rechunk_name

#: dask/distributed versions the test suite ran on (see the module docstring).
TESTED_DASK = ("2026.7.1", "2026.8.0")

#: Name prefixes of the layers dask builds for ``x.rechunk`` (HighLevelGraph path).
RECHUNK_PREFIXES = ("rechunk-merge-", "rechunk-split-", "rechunk-p2p-")
P2P_PREFIX = "rechunk-p2p-"

#: The key of a rechunk's output layer annotation that holds the method its caller chose ...
METHOD_ANNOTATION = "redist-method"
#: ... and the key saying how: ``"method="`` (passed) or `CONFIG_METHOD` (configured).
METHOD_FROM_ANNOTATION = "redist-method-from"
#: dask's config key for the rechunk method (``None``, dask's default: dask chooses)
CONFIG_METHOD = "array.rechunk.method"

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
    "CONFIG_METHOD",
    "METHOD_ANNOTATION",
    "METHOD_FROM_ANNOTATION",
    "chosen_method",
    "building_graph",
    "cached_worker_count",
    "keep_annotations_current",
    "meta_of",
    "original_rechunk",
    "original_rechunk_step",
    "p2p_layer_fields",
    "plan_dask_rechunk",
    "read_array_optimize_through",
    "record_explicit_methods",
    "running_schedulers",
    "use_rechunk_step",
    "with_operand",
    "worker_info",
]


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


def chosen_method(method: str | None) -> tuple[str, str] | None:
    """The rechunk method the user chose, and how: ``(method, "method=")`` where passed, else
    ``(value, CONFIG_METHOD)`` where dask's config sets one (as dask reads it: when the rechunk is
    called); None: dask's default, dask chooses."""
    if method is not None:
        return method, "method="
    import dask

    configured = dask.config.get(CONFIG_METHOD, None)
    return (configured, CONFIG_METHOD) if configured else None


def _rechunk_function(x, chunks="auto", threshold=None, block_size_limit=None, balance=False, method=None):
    depth = getattr(_calls, "depth", 0)
    chosen = chosen_method(method) if depth == 0 else None  # (read before dask reads the config)
    _calls.depth = depth + 1
    try:
        y = _original_rechunk_function(x, chunks, threshold, block_size_limit, balance, method)
    finally:
        _calls.depth = depth
        if depth == 0:
            _calls.old_to_new = None
    keep = _keep_method[0]
    # (depth 0: the caller's own call; dask's p2p rechunk calls rechunk(method="tasks") inside it)
    if depth > 0 or y is x:
        return y
    if chosen is not None and keep is not None and keep():
        layer = y.dask.layers.get(y.name)
        if layer is not None:
            layer.collection_annotations = {
                **(layer.collection_annotations or {}),
                METHOD_ANNOTATION: chosen[0],
                METHOD_FROM_ANNOTATION: chosen[1],
            }
        return y
    rename = _rename[0]
    return y if rename is None else rename(y)


_keep_method: list = [None]
_rename: list = [None]
_calls = threading.local()


def _old_to_new_once(old_chunks, new_chunks):
    """Dask's ``old_to_new``, computed once per call of `_rechunk_function` for the same chunks:
    Dask's choice of method and distributed's p2p prechunking each compute it for the caller's
    chunks, Python loops over every chunk boundary (docs/benchmarks.md). Callers only read it."""
    last = getattr(_calls, "old_to_new", None)
    if last is not None and last[0] == old_chunks and last[1] == new_chunks:
        return last[2]
    result = _original_old_to_new(old_chunks, new_chunks)
    if getattr(_calls, "depth", 0):  # (inside a rechunk call: kept until it returns)
        _calls.old_to_new = (old_chunks, new_chunks, result)
    return result


def original_rechunk(x, chunks, threshold=None, block_size_limit=None, balance=False, method=None):
    """Dask's rechunk of ``x``, its ``method`` not recorded as the caller's (`record_explicit_methods`)."""
    if _original_compute_chunk_sizes is None:  # (expression mode: the expression carries it)
        return x.rechunk(chunks, threshold, block_size_limit, balance, method)
    return _original_rechunk_function(x, chunks, threshold, block_size_limit, balance, method)


def record_explicit_methods(keep=None, rename=None) -> None:
    """While ``keep`` is given, ``x.rechunk(..., method=m)`` and ``da.rechunk(x, ..., method=m)``
    (or without ``method=`` while dask's config sets `CONFIG_METHOD` to ``m``) write ``m`` into
    their output layer's annotation `METHOD_ANNOTATION` where ``keep()`` says so when they are
    called (``redist.respect-method``): the graph rewrite keeps Dask's method there.
    The other rechunks are returned as ``rename(y)`` (the collective's own output name,
    `graph.names`). Expression mode carries ``method`` in the expression."""
    import dask.array

    if _original_compute_chunk_sizes is not None:  # (the HighLevelGraph Array)
        _keep_method[0], _rename[0] = keep, rename
        function = _original_rechunk_function if keep is None else _rechunk_function
        sys.modules["dask.array.rechunk"].rechunk = function
        sys.modules["dask.array.rechunk"].old_to_new = (
            _original_old_to_new if keep is None else _old_to_new_once
        )
        dask.array.rechunk = function


class _ReadThrough:
    """``Array.__dask_optimize__``: dask's descriptor, its value passed through ``wrap``."""

    def __init__(self, original, wrap):
        self.original, self.wrap = original, wrap

    def __get__(self, instance, owner=None):
        return self.wrap(self.original.__get__(instance, owner), instance)


def read_array_optimize_through(wrap=None) -> None:
    """While ``wrap`` is given, ``x.__dask_optimize__`` (the ``array_optimize`` hook dask takes
    for a collection on the client, before anything is sent) is ``wrap(hook, x)``; None: dask's."""
    from dask.array import Array

    if _original_optimize is not None:  # (expression mode's Array has a hook of its own, never the config's)
        Array.__dask_optimize__ = (
            _original_optimize if wrap is None else _ReadThrough(_original_optimize, wrap)
        )


def _array_dict() -> dict:
    from dask.array import Array

    return dict(vars(Array))


def _original(name: str):
    from dask.array import Array

    return getattr(Array, name, None)


_original_compute_chunk_sizes = _original("compute_chunk_sizes")
_original_rechunk = _original("rechunk")
_original_rechunk_function = getattr(sys.modules.get("dask.array.rechunk"), "rechunk", None)
_original_old_to_new = getattr(sys.modules.get("dask.array.rechunk"), "old_to_new", None)
_original_optimize = _array_dict().get("__dask_optimize__")  # (the descriptor, not what it returns)
_WRAPPED = ((_rechunk, _original_rechunk), (_compute_chunk_sizes, _original_compute_chunk_sizes))
for _ours, _dasks in (*_WRAPPED, (_rechunk_function, _original_rechunk_function)):
    if _dasks is not None:  # (while enabled, help(x.rechunk) and a notebook's x.rechunk? show Dask's)
        _ours.__doc__, _ours.__signature__ = _dasks.__doc__, inspect.signature(_dasks)


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
