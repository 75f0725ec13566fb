"""The global annotations of the graph the scheduler is building now (``compute(retries=...)``).

``Client.compute``/``persist``'s ``retries=`` (and ``workers=``, ``resources=``, and what
``dask.annotate`` holds at submission) reach the scheduler only as the ``annotations`` of the
``update-graph`` message, which ``Scheduler.update_graph`` applies to the graph's tasks after it
is materialized, after the rewrite ran. The rewrite must know them all the same: a producer
inlined into a stage task (`graph.stages.inlined_inputs`) would share one retry budget with the
other chunks of that stage task, where Dask retries each chunk's task on its own.

`install` wraps the scheduler's stream handler for ``update-graph`` (distributed reads
``Server.stream_handlers`` at each message, so clients already connected use the wrapper too)
so that `annotations` gives that call's global annotations while it runs; distributed
materializes the graph in ``distributed.utils.offload``, which carries contextvars into its
thread. Installed by the scheduler plugin when it starts and by the rewrite whenever it runs on
the scheduler: a scheduler's first array graph, where the plugin is not there yet (it registers
with the first collective run; the preload and ``status()`` register it earlier), is built
before the wrapper, and fused as before.
``stream_handlers`` is distributed's ``Server`` attribute (semi-private: read with getattr);
where it is missing, or holds no ``update-graph`` handler, nothing is wrapped and `annotations`
stays None: the rewrite does as before.
"""

from __future__ import annotations

import contextvars
import functools

_ANNOTATIONS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("redist_submitted", default=None)


def annotations() -> dict | None:
    """The global annotations of the ``update-graph`` call running now ({} where it has none);
    None outside one, or where the handler could not be wrapped."""
    return _ANNOTATIONS.get()


def retried() -> bool:
    """Does the graph being built now carry global ``retries``?"""
    return bool((annotations() or {}).get("retries"))


def wrap(handler):
    @functools.wraps(handler)
    async def update_graph_with_annotations(*args, **kwargs):
        token = _ANNOTATIONS.set(dict(kwargs.get("annotations") or {}))
        try:
            return await handler(*args, **kwargs)
        finally:
            _ANNOTATIONS.reset(token)

    update_graph_with_annotations.redist_wrapped = handler
    return update_graph_with_annotations


def install(scheduler) -> bool:
    """Wrap ``scheduler``'s ``update-graph`` stream handler (idempotent); False where it cannot."""
    handlers = getattr(scheduler, "stream_handlers", None)
    handler = handlers.get("update-graph") if isinstance(handlers, dict) else None
    if handler is None:
        return False
    if not hasattr(handler, "redist_wrapped"):
        handlers["update-graph"] = wrap(handler)
    return True
