"""A retry after a failed collective run gets a fresh run where the settings changed.

A rechunk's output keys are fixed when it is built, whatever the settings at submission.
Submitting them again right after a failure could meet the old tasks on the scheduler, erred:

* a Client releases the futures of a failed ``compute`` through two hops of its event loop,
  and a graph submitted at once from the user's thread takes one: the new graph reaches the
  scheduler before the release (plain Dask does the same);
* anything holding those futures (``f = client.compute(y)``) keeps them erred.

The scheduler then keeps the erred tasks and reports their error for the new graph. Plain
Dask users meet it less: there a change of the rechunk's method changes its keys; here a
change of ``redist.*``, or `dask_redist.disable`, does not. So the settings each collection
is submitted with are recorded, and where a collection is submitted again with other
settings, or after ``disable()``, the scheduler is asked (one round trip, which also lets the
Client's pending releases through) for the erred keys depending on that collection that this
Client still wants (``compute`` wants a finalize key); they are cancelled first
(``Client.cancel``): the scheduler forgets the old tasks and runs the new graph. The
collection's own keys, where the Client wants them (``y.persist()``), are left erred: they are
the user's handle on the error, which a computation from them must report (cancelled, it would
read "lost dependencies"); submitting the same rechunk again while they are held meets their
error, as in Dask. (Other settings also give the stage
and barrier keys a token of their own: `graph.decide.collective_spec`.) With the same
settings the old error stands, as in Dask (docs/troubleshooting.md).
"""

from __future__ import annotations

import logging
import threading

from dask_redist.config import Settings

logger = logging.getLogger(__name__)
KEPT = 10_000  # collections remembered, latest first out
_submitted: dict[str, Settings] = {}
_lock = threading.Lock()


def _name(key) -> str:
    return key[0] if isinstance(key, (tuple, list)) else key


def _erred_and_wanted(dask_scheduler=None, names=(), client: str = "") -> list:
    """On the scheduler: the erred keys depending on an erred key of the collections ``names``
    that ``client`` wants (``compute`` wants a finalize key), but not the collections' own."""
    names = set(names)
    todo = [ts for k, ts in list(dask_scheduler.tasks.items()) if ts.state == "erred" and _name(k) in names]
    seen: set = set()
    while todo:
        ts = todo.pop()
        if ts.key not in seen:
            seen.add(ts.key)
            todo += [d for d in ts.dependents if d.state == "erred"]
    return [
        k
        for k in seen
        if _name(k) not in names  # (a persisted collection's own keys: the user's handle on the error)
        and any(c.client_key == client for c in dask_scheduler.tasks[k].who_wants or ())
    ]


def in_event_loop() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _cancel_erred(names) -> list:
    """Cancel the default Client's erred futures of the collections ``names`` (and of keys depending
    on them), so that the scheduler forgets those tasks; their keys."""
    try:
        from distributed import Future, default_client

        client = default_client()
    except (ImportError, ValueError):
        return []
    if (
        client.status != "running" or in_event_loop()
    ):  # (a preload's teardown runs on the loop: no sync call there)
        return []
    try:
        keys = client.run_on_scheduler(_erred_and_wanted, names=sorted(names), client=client.id)
        keys = [tuple(k) if isinstance(k, list) else k for k in keys]
        if keys:
            client.cancel(
                [Future(k, client) for k in keys], reason="submitted again with other redist.* settings"
            )
    except (
        Exception
    ) as e:  # (never the reason a compute or disable() fails: the retry meets Dask's behaviour)
        logger.warning(
            "could not clear the erred keys of %s before a retry: %s: %s", sorted(names), type(e).__name__, e
        )
        return []
    return keys


def submitted(collection, settings: Settings) -> list:
    """Record that ``collection`` is being submitted with ``settings``; where it erred before under
    other settings, cancel its erred futures first (module docstring). Returns the keys cancelled."""
    name = getattr(collection, "name", None)
    if not isinstance(name, str):
        return []
    with _lock:
        before = _submitted.pop(name, None)
        _submitted[name] = settings
        while len(_submitted) > KEPT:
            del _submitted[next(iter(_submitted))]
    return _cancel_erred({name}) if before is not None and before != settings else []


def disabled() -> list:
    """After `dask_redist.disable`: the erred futures of collections submitted to the collective are
    cancelled, so that submitting them again runs Dask's rechunk. Returns the keys cancelled."""
    with _lock:
        names = set(_submitted)
        _submitted.clear()
    return _cancel_erred(names) if names else []
