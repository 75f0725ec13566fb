"""The public functions: turn the collective on and off, run it explicitly, bootstrap, status.

Nothing here imports the benchmark harness (``dask_redist.bench``).
"""

from __future__ import annotations

import difflib
import threading

import dask
import numpy as np

from dask_redist.compat import keep_annotations_current, use_rechunk_step
from dask_redist.config import DEFAULTS, ConfigError, Settings
from dask_redist.core.assemble import converted
from dask_redist.errors import NotEligibleError, RedistError
from dask_redist.graph.lazy import lazy_rechunk_step
from dask_redist.graph.optimize import CollectiveOptimizer, decide, find_rechunks, rewrite


def _flatten(options: dict, prefix: str = "redist") -> dict:
    out = {}
    for k, v in options.items():
        key = f"{prefix}.{k.replace('_', '-')}"
        out.update(_flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def _overrides(options: dict) -> dict:
    """``redist.*`` config keys from keyword options (nested dicts allowed), checked now."""
    cfg = _flatten(options)
    known = _flatten(DEFAULTS["redist"])
    if unknown := sorted(k for k in cfg if k not in known):
        near = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
        hints = "; ".join(f"{k}" + (f" (did you mean {m[0]}?)" if m else "") for k, m in near.items())
        raise ConfigError(f"unknown option {hints}: the redist.* keys are listed in docs/configuration.md")
    with dask.config.set(cfg):
        Settings.from_config()  # fail here, naming the key, not later on the scheduler
    return cfg


class Enabled:
    """Returned by `enable`; leaving its ``with`` block disables it (and only it) again."""

    def __init__(self, options: dict):
        self.options = options  # the redist.* keys it sets

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        disable(self)


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

    Installs dask's ``array_optimize`` hook (chaining to whatever was there);
    ``options`` set ``redist.*`` config keys for as long as it stays enabled,
    e.g. ``enable(engine="dask", memory_budget="2GiB")`` (an unknown key is a ``ConfigError``).
    Also a context manager. Calling it again (a notebook cell run twice) adds a handle:
    ``disable()`` turns every one off, ``disable(handle)`` or leaving its ``with`` only that one.
    """
    handle = Enabled(_overrides(options))
    with _lock:
        _enabled.append(handle)
        _apply()
    return handle


def _patches(on: bool) -> None:
    """What dask needs changed beyond its optimize hook while enabled: the chunk sizes that
    ``compute_chunk_sizes()`` finds kept where the graph rewrite reads them, the steps of Dask's
    rechunk built only when read (`graph.lazy`), and in expression mode (no optimize hook) the
    rechunk expression swapped."""
    keep_annotations_current(on)
    use_rechunk_step(lazy_rechunk_step if on else None)
    try:
        from dask_redist.graph import expr
    except ImportError:  # pragma: no cover - a dask without array expressions
        return
    expr.install() if on else expr.uninstall()


def disable(handle: Enabled | None = None) -> None:
    """Turn the collective off: every `enable` so far, or only ``handle`` (what leaving its
    ``with`` block does; the others stay, with their options)."""
    with _lock:
        if handle is None:
            _enabled.clear()
        elif handle in _enabled:
            _enabled.remove(handle)
        else:
            return  # (ended already)
        _apply()


def rechunk(x, chunks="auto", *, threshold=None, block_size_limit=None, balance=False, **options):
    """``x.rechunk(chunks)`` as one collective step, whether or not `enable` was called.

    Takes dask's arguments; ``options`` override ``redist.*`` keys for this call.
    Raises `NotEligibleError` (with the reason) where the collective
    cannot run, e.g. for object dtypes or unknown chunk sizes.
    """
    from dask.array import Array

    if any(isinstance(c, float) and c != c for axis in x.chunks for c in axis):
        raise NotEligibleError("chunk sizes are unknown (NaN); call x.compute_chunk_sizes() first")
    y = x.rechunk(chunks, threshold=threshold, block_size_limit=block_size_limit, balance=balance, method="tasks")
    if y is x:
        return x
    with dask.config.set(_overrides(options)):
        settings = Settings.from_config()
    graph = y.__dask_graph__()
    (chain,) = [c for c in find_rechunks(graph, {y.name}) if c.output == y.name]
    decision = decide(graph, chain, settings, old=x.chunks)
    if not decision.collective:
        raise NotEligibleError(decision.reason)
    graph, _ = rewrite(graph, [], settings, only=[decision])
    meta = y._meta
    if settings.output_type != "same":  # (x.rechunk under enable() keeps x's meta: the graph changes, not x)
        try:
            meta = converted(meta, settings.output_type)
        except RedistError:  # no CuPy here, only on the workers: the chunks are still CuPy
            pass
    return Array(graph, y.name, y.chunks, meta=meta)


def status(client=None) -> dict:
    """What the collective has done and holds on ``client``'s cluster (asks the scheduler once).

    ``history``: the runs finished (engine, why, bytes, seconds, outcome), oldest first (the
    scheduler keeps the latest 200);
    ``active``: runs in flight; ``timeline``: the scheduler's marks of the latest run;
    ``engines``: what the choice of engine depends on (capabilities, the NVSHMEM world);
    ``workers``: per worker, the chunks staged, runs and early pieces held, its timeline,
    and its engines' health and statistics; ``unanswered``: the workers that gave no answer
    within 10 s (stopped, or their event loop blocked) or failed, and why.
    """
    from distributed import default_client

    client = client or default_client()
    _ensure_scheduler_plugin(client)
    return client.sync(client.scheduler.redist_status)


def _ensure_scheduler_plugin(client) -> None:
    """The plugins register with the first collective run; ``status`` and ``bootstrap`` may come first."""
    from dask_redist.runtime.scheduler import RedistSchedulerPlugin
    from dask_redist.runtime.worker import RedistWorkerPlugin

    plugin = RedistSchedulerPlugin(worker_plugin=RedistWorkerPlugin())
    client.register_plugin(plugin, name=plugin.name)  # idempotent: a plugin already there stays


def bootstrap(client=None, *, restart_broken: bool = False) -> dict:
    """Bootstrap NVSHMEM on every worker now, instead of at the first GPU rechunk.

    Runs a tiny CuPy rechunk through the ``cufftmp`` engine (so the bootstrap goes
    through the same ordered, time-bounded path as every run) and returns each
    worker's engine statistics (``bootstrap_s``: seconds its bootstrap took).
    After workers joined, call it again: the workers leave the old NVSHMEM world
    and form one over the current worker set, in the same processes.

    After a worker of the world died, its surviving members cannot leave the old
    world (NVSHMEM's finalize waits for the dead PE), and neither can a worker
    whose GPU was left inside a collective: those are named in the error, or
    restarted first with ``restart_broken=True`` (``Client.restart_workers``:
    their data is lost). Until then GPU rechunks run on the ``dask`` engine.
    """
    from distributed import default_client, wait

    client = client or default_client()
    before = status(client)
    alive = set(client.scheduler_info(n_workers=-1)["workers"])
    broken = {
        w: s["engines"]["cufftmp"]["broken"]
        for w, s in before["workers"].items()
        if s.get("engines", {}).get("cufftmp", {}).get("broken")
    }
    for w in before["engines"]["stranded"]:
        if w in alive:
            broken.setdefault(w, "a worker of its NVSHMEM world died")
    if broken and not restart_broken:
        raise RedistError(
            f"NVSHMEM is unusable on {sorted(broken)} ({next(iter(broken.values()))}); restart those workers, "
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
    client.sync(client.scheduler.redist_forget_world)
    y = rechunk(_tiny_gpu_array(client), _TINY_NEW, engine="cufftmp").persist()
    wait(y)
    if not np.array_equal(np.asarray(y.compute().get()), _tiny_expected()):
        raise RedistError("the bootstrap rechunk returned wrong values")
    return {w: s["engines"]["cufftmp"]["stats"] for w, s in status(client)["workers"].items() if "cufftmp" in s["engines"]}


_TINY_SHAPE, _TINY_OLD, _TINY_NEW = (64, 64), (8, 64), (64, 8)


def _tiny_expected() -> np.ndarray:
    return np.arange(np.prod(_TINY_SHAPE), dtype=np.float64).reshape(_TINY_SHAPE)


def _tiny_gpu_array(client):
    """A small CuPy array with fresh keys (an earlier failed bootstrap's results may still be
    held), one chunk per task: every worker is a rank of the run wherever the chunks land."""
    import uuid

    import dask.array as da

    def block(block_info=None):
        import cupy

        (lo0, hi0), (lo1, hi1) = block_info[None]["array-location"]
        return cupy.asarray(_tiny_expected()[lo0:hi0, lo1:hi1])

    import cupy

    chunks = tuple((size,) * (total // size) for size, total in zip(_TINY_OLD, _TINY_SHAPE))
    meta = cupy.empty((0, 0), dtype=np.float64)
    return da.map_blocks(block, chunks=chunks, dtype=np.float64, meta=meta, name=f"redist-bootstrap-{uuid.uuid4().hex}")
