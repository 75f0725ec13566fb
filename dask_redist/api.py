"""The public functions: turn the collective on and off, run it explicitly (`status` and
`bootstrap`, which ask the cluster: `dask_redist.cluster`).

Nothing here imports the benchmark harness (``dask_redist.bench``).
"""

from __future__ import annotations

import threading

import dask
import numpy as np

from dask_redist.compat import (
    is_expression,
    worker_info,
    keep_annotations_current,
    meta_of,
    original_rechunk,
    read_array_optimize_through,
    record_explicit_methods,
    use_rechunk_step,
)
from dask_redist.core.messages import ForgetWorld
from dask_redist.config import Settings, check_known, flatten, restore_defaults
from dask_redist.core.assemble import converted
from dask_redist.engines import check_settings
from dask_redist.errors import NotEligibleError, RedistError, a_kind_of, is_xarray
from dask_redist.graph.lazy import lazy_rechunk_step
from dask_redist.graph.names import own_name
from dask_redist.graph.decide import decide, find_rechunks
from dask_redist.graph.optimize import CollectiveOptimizer, rewrite
from dask_redist import submissions
from dask_redist.cluster import (
    answered,
    client_to_ask,
    refuse_unrunnable,
    refuse_unrunnable_on,
    status,
    world_engine,
)


def _overrides(options: dict) -> dict:
    """``redist.*`` config keys from keyword options (nested dicts allowed), checked now."""
    cfg = flatten(options)
    check_known(cfg)
    with dask.config.set(cfg):
        check_settings(Settings.from_config())  # fail here, naming the key, not later on the scheduler
    return cfg


class Enabled:
    """Returned by `enable`; leaving its ``with`` block disables it (and only it) again."""

    def __init__(self, options: dict):
        self.options = options  # the redist.* keys it sets

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        disable(self)

    def __repr__(self) -> str:
        """What a notebook cell ending in ``dask_redist.enable(...)`` shows: the options, and
        whether this handle is still on."""
        options = ", ".join(f"{k.removeprefix('redist.')}={v!r}" for k, v in self.options.items())
        state = "on" if self in _enabled else "ended (disable() since)"
        return f"dask_redist.enable({options}): {state}"


#: What is enabled, oldest first, and the one ``dask.config.set`` that applies all of it. Handles
#: end in any order (a preload's Client closes while a later one lives), so the config is not
#: nested per handle: it is set again from the handles left whenever one ends.
_enabled: list[Enabled] = []
_applied: list = []
_lock = threading.RLock()


def _apply() -> None:
    while _applied:  # back to the config from before the first enable()
        _applied.pop().__exit__(None, None, None)
    if _enabled:
        current = dask.config.get("array_optimize", None)
        if isinstance(current, CollectiveOptimizer):  # (set by hand): not wrapped twice
            current = current.chain
        cfg = {"array_optimize": CollectiveOptimizer(chain=current)}
        for h in _enabled:  # later enable() options win
            cfg.update(h.options)
        _applied.append(dask.config.set(cfg))
    _patches(bool(_enabled))


def enable(**options) -> Enabled:
    """Run every eligible ``x.rechunk(...)`` as one collective step.

    Installs dask's ``array_optimize`` hook (chaining to whatever was there). Also a context
    manager. Calling it again (a notebook cell run twice) adds a handle: ``disable()`` turns
    every one off, ``disable(handle)`` or leaving its ``with`` only that one.

    Parameters
    ----------
    **options
        ``redist.*`` config keys set for as long as this handle stays enabled, ``_`` for ``-``
        and mappings for sections: ``engine="dask"``, ``memory_budget="2GiB"``,
        ``timeouts={"collective": "600s"}``, an engine's own section (``nvshmem={...}``);
        docs/configuration.md lists them. Later handles' options win.

    Returns
    -------
    Enabled
        The handle: pass it to `disable`, or leave its ``with`` block.

    Raises
    ------
    ConfigError
        An unknown key, or a value the settings (or an engine, for its section) refuse.
    """
    restore_defaults()
    handle = Enabled(_overrides(options))
    with _lock:
        _enabled.append(handle)
        _apply()
    return handle


def snapshot(hook, collection=None):
    """``hook`` with the ``redist.*`` settings of this moment, where it is the collective's: what dask
    reads as ``collection``'s optimize hook on the client while enabled
    (`compat.read_array_optimize_through`), so that a bad setting is a `ConfigError` raised there,
    by ``compute``/``persist``, before anything is sent (in ``__reduce__``, distributed would bury it
    under a serialization error); a collection that erred under other settings gets a fresh run
    (`dask_redist.submissions`)."""
    if isinstance(hook, CollectiveOptimizer) and hook.settings is None:
        settings = check_settings(Settings.from_config())
        if collection is not None:
            if (client := client_to_ask(settings)) is not None:  # (else the decisions are not needed here)
                refuse_unrunnable_on(client, _collective_specs(collection, settings), settings)
            submissions.submitted(collection, settings)
        return CollectiveOptimizer(hook.chain, settings)
    return hook


def _collective_specs(collection, settings: Settings) -> list:
    """The collectives that ``collection``'s rechunks become under ``settings`` (none is asked of the
    cluster: the workers' memory is not weighed here)."""
    graph = collection.__dask_graph__()
    if not hasattr(graph, "layers"):
        return []
    names = {getattr(collection, "name", None)}
    decisions = (decide(graph, chain, settings) for chain in find_rechunks(graph, names))
    return [d.spec for d in decisions if d.collective]


def _respect_method() -> bool:
    return Settings.from_config().respect_method


def _patches(on: bool) -> None:
    """What dask needs changed beyond its optimize hook while enabled: the chunk sizes that
    ``compute_chunk_sizes()`` finds kept where the graph rewrite reads them, a ``method=`` the
    caller passed to a rechunk recorded there too, the settings read (and checked) on the client
    when a graph is submitted, the steps of Dask's rechunk built only when read (`graph.lazy`),
    and in expression mode (no optimize hook) the rechunk expression swapped."""
    keep_annotations_current(on)
    record_explicit_methods(_respect_method if on else None, own_name if on else None)
    read_array_optimize_through(snapshot if on else None)
    use_rechunk_step(lazy_rechunk_step if on else None)
    try:
        from dask_redist.graph import expr
    except ImportError:  # pragma: no cover - a dask without array expressions
        return
    expr.install() if on else expr.uninstall()


def disable(handle: Enabled | None = None) -> None:
    """Turn the collective off: every `enable` so far, or only one handle.

    Parameters
    ----------
    handle : Enabled, optional
        The handle `enable` returned: only it ends (what leaving its ``with`` block does; the
        others stay, with their options). None: every handle ends. A handle ended already is
        ignored.
    """
    with _lock:
        if handle is None:
            _enabled.clear()
        elif handle in _enabled:
            _enabled.remove(handle)
        else:
            return  # (ended already)
        _apply()
        if not _enabled:
            submissions.disabled()


def rechunk(x, chunks="auto", *, threshold=None, block_size_limit=None, balance=False, **options):
    """``x.rechunk(chunks)`` as one collective step, whether or not `enable` was called.

    Parameters
    ----------
    x : dask.array.Array
        The array to rechunk.
    chunks : tuple, int, dict or str, default "auto"
        The new chunks, as ``dask.array.Array.rechunk`` takes them.
    threshold, block_size_limit, balance
        As ``dask.array.Array.rechunk`` takes them, for the new chunks.
    **options
        ``redist.*`` keys for this call only, as `enable` takes them.

    Returns
    -------
    dask.array.Array
        ``x`` with the new chunks, its graph one collective step (``x`` itself where the chunks
        do not change).

    Raises
    ------
    TypeError
        ``x`` is no dask array (the message says how to make one).
    NotEligibleError
        Only where the collective cannot run, with the reason: object dtypes, unknown (NaN)
        chunk sizes, a chunk type outside ``redist.chunk-types``, an array of dask's expression
        mode (``array.query-planning: True``: ``x.rechunk`` under `enable` runs the collective there). It runs where
        ``redist.min-bytes`` (the cost model, by default) would keep Dask's rechunk, and
        ``explain()`` says so.
    EngineUnavailableError
        The engine named in ``redist.engine`` cannot run on the workers (the reason and the remedy).
    ConfigError
        An unknown key or a bad value in ``options``.
    """
    return collective_rechunk(x, chunks, threshold, block_size_limit, balance, options)


def _not_a_dask_array(x) -> str:
    from dask.delayed import Delayed

    if is_xarray(x):
        how = "rechunk it with its .chunk(...) under dask_redist.enable()"
    elif isinstance(x, Delayed):  # (it answers any attribute: shape and dtype too)
        how = "make it one first: dask.array.from_delayed(value, shape, dtype)"
    elif hasattr(x, "shape") and hasattr(x, "dtype"):
        how = "make it one first: dask.array.from_array(a, chunks=...)"
    else:
        how = "this holds no array"
    return f"dask_redist.rechunk takes a dask array, got {a_kind_of(x)}: {how}"


#: Why `rechunk` refuses an array of dask's expression mode, and what to do instead.
EXPRESSION_MODE = (
    "dask_redist.rechunk does not support dask's array query planning (array.query-planning: True) yet: "
    "use x.rechunk(...) under dask_redist.enable(), which runs the collective in that mode too"
)


def collective_rechunk(x, chunks, threshold, block_size_limit, balance, options: dict, explicit: bool = True):
    """`rechunk`; ``explicit=False``: also `NotEligibleError` where ``redist.min-bytes`` keeps Dask's
    rechunk (``dask_redist.fft``'s passes, which follow the cost model), and ``explain()`` lists it
    under the FFT only."""
    from dask.array import Array

    if not isinstance(x, Array):
        raise TypeError(_not_a_dask_array(x))
    if is_expression(x):
        raise NotEligibleError(EXPRESSION_MODE)
    if any(isinstance(c, float) and c != c for axis in x.chunks for c in axis):
        raise NotEligibleError("chunk sizes are unknown (NaN); call x.compute_chunk_sizes() first")
    y = original_rechunk(x, chunks, threshold, block_size_limit, balance, "tasks")  # (not a caller's method=)
    if y is x:
        return x
    with dask.config.set(_overrides(options)):
        settings = Settings.from_config()
    y = own_name(y, settings)  # (never Dask's keys: graph.names)
    graph = y.__dask_graph__()
    (chain,) = [c for c in find_rechunks(graph, {y.name}) if c.output == y.name]
    decision = decide(graph, chain, settings, old=x.chunks, explicit=explicit)
    if not decision.collective:
        raise NotEligibleError(decision.reason)
    refuse_unrunnable([decision.spec], settings)
    graph, _ = rewrite(graph, [], settings, only=[decision])
    if not explicit:
        graph.layers[y.name].decision = None
    meta = meta_of(y)
    if settings.output_type != "same":  # (x.rechunk under enable() keeps x's meta: the graph changes, not x)
        try:
            meta = converted(meta, settings.output_type)
        except RedistError:  # no CuPy here, only on the workers: the chunks are still CuPy
            pass
    return Array(graph, y.name, y.chunks, meta=meta)


def bootstrap(client=None, *, restart_broken: bool = False, engine: str | None = None):
    """Start an engine's world on every worker now (NVSHMEM's, for ``cufftmp``), instead of at
    its first rechunk.

    Runs a tiny rechunk through that engine, so the bootstrap goes through the same ordered,
    time-bounded path as every run (an engine whose description has no such rechunk,
    ``bootstrap_input``, starts its new world at its next rechunk). After workers joined, call
    it again: the workers leave the old world and form one over the current worker set, in the
    same processes.

    After a worker of the world died, its surviving members cannot leave the old
    world (NVSHMEM's finalize waits for the dead PE), and neither can a worker
    whose GPU was left inside a collective: those are named in the error, or
    restarted first with ``restart_broken=True``. Until then rechunks under ``auto`` run on
    another engine.

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster's Client; None: the default Client.
    restart_broken : bool, default False
        Restart the workers that cannot leave the old world first (``Client.restart_workers``:
        their data is lost), instead of raising.
    engine : str, optional
        A name of ``redist.engines`` whose engine has a world; None: the one engine that has.

    Returns
    -------
    dict
        Each worker's statistics of the engine (``bootstrap_s``: seconds its bootstrap took). With
        an asynchronous Client (called on its event loop), an awaitable of it.

    Raises
    ------
    RedistError
        Workers cannot leave the old world (named, without ``restart_broken``), or the
        bootstrap's rechunk failed.
    ValueError
        ``engine`` has no world, or none is named and not exactly one engine has one.
    """
    from distributed import default_client

    client = client or default_client()
    return answered(client, _bootstrap, client, restart_broken, engine)


def _bootstrap(client, restart_broken: bool, engine: str | None) -> dict:
    from distributed import wait

    d = world_engine(Settings.from_config(), engine)
    before = status(client)
    alive = set(worker_info(client))
    broken = {
        w: s["engines"][d.name]["broken"]
        for w, s in before["workers"].items()
        if s.get("engines", {}).get(d.name, {}).get("broken")
    }
    for w in before["engines"]["records"].get(d.name, {}).get("stranded", []):
        if w in alive:
            broken.setdefault(w, f"a worker of its {d.world_name} world died")
    if broken and not restart_broken:
        raise RedistError(
            f"{d.world_name} is unusable on {sorted(broken)} ({next(iter(broken.values()))}); restart those workers, "
            "or call dask_redist.bootstrap(client, restart_broken=True) to do it (their data is lost)"
        )
    if broken:
        timeout = Settings.from_config().bootstrap_timeout
        try:
            client.restart_workers(sorted(broken), timeout=timeout)
        except Exception as e:
            raise RedistError(
                f"restarting {sorted(broken)} did not finish within {timeout:g}s (redist.timeouts.bootstrap): "
                f"{type(e).__name__}: {e}. A process whose GPU was left inside an NVSHMEM collective may not "
                "exit until the driver frees its GPU; see docs/reliability.md"
            ) from e
    client.sync(ForgetWorld(d.name).call, client.scheduler)
    if (case := d.bootstrap_input(client)) is not None:  # (None: its next rechunk starts the world)
        x, new, expected = case
        y = rechunk(x, new, engine=d.name).persist()
        wait(y)
        if not np.array_equal(converted(y.compute(), "numpy"), expected):
            raise RedistError("the bootstrap rechunk returned wrong values")
    return {
        w: s["engines"][d.name]["stats"]
        for w, s in status(client)["workers"].items()
        if d.name in s["engines"]
    }
