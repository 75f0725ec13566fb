"""What ``dask_redist.enable()`` swaps in dask while it is on, and dask's own functions behind it.

Part of `dask_redist.compat` (the one place that names dask's private API; its docstring lists
what is relied on): ``Array.rechunk`` and ``Array.compute_chunk_sizes`` wrapped to keep a layer's
chunk annotation current (`keep_annotations_current`); ``dask.array.rechunk.rechunk`` wrapped to
record a method the caller chose (`record_explicit_methods`); ``dask.array.rechunk._compute_rechunk``
swapped for a lazy step (`use_rechunk_step`); ``Array.__dask_optimize__`` read through a function
(`read_array_optimize_through`). Each is undone by the same call with no argument.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading

#: The key of a rechunk's output layer annotation that holds the method its caller chose ...
METHOD_ANNOTATION = "redist-method"
#: ... and the key saying how: ``"method="`` (passed) or `CONFIG_METHOD` (configured).
METHOD_FROM_ANNOTATION = "redist-method-from"
#: dask's config key for the rechunk method (``None``, dask's default: dask chooses)
CONFIG_METHOD = "array.rechunk.method"


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
