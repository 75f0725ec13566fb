"""dask-redist: a dask array rechunk as ONE collective step across the workers.

>>> import dask_redist
>>> dask_redist.enable()          # every eligible x.rechunk(...) now runs as a collective
>>> dask_redist.explain(y)        # what runs for each rechunk in y's graph, and why
>>> dask_redist.rechunk(x, (1024, -1, 1))   # the explicit form
"""

from __future__ import annotations

import random

import dask

from dask_redist.config import ConfigError, Settings
from dask_redist.errors import (
    EngineUnavailableError,
    NotEligibleError,
    RedistConsistencyError,
    RedistError,
    RedistTimeoutError,
)
from dask_redist.doctor import doctor
from dask_redist.explain import explain
from dask_redist.optimize import CollectiveOptimizer, decide, find_rechunks, rewrite

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "EngineUnavailableError",
    "NotEligibleError",
    "RedistConsistencyError",
    "RedistError",
    "RedistTimeoutError",
    "Settings",
    "bootstrap",
    "disable",
    "doctor",
    "enable",
    "explain",
    "rechunk",
]

_enabled: list = []


def _flatten(options: dict, prefix: str = "redist") -> dict:
    out = {}
    for k, v in options.items():
        key = f"{prefix}.{k.replace('_', '-')}"
        out.update(_flatten(v, key) if isinstance(v, dict) else {key: v})
    return out


def _overrides(options: dict) -> dict:
    """``redist.*`` config keys from keyword options (nested dicts allowed), checked now."""
    cfg = _flatten(options)
    with dask.config.set(cfg):
        Settings.from_config()  # fail here, naming the key, not later on the scheduler
    return cfg


class Enabled:
    """Returned by `enable`; leaving its ``with`` block disables again."""

    def __init__(self, handle):
        self._handle = handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        disable(self)


def enable(**options) -> Enabled:
    """Run every eligible ``x.rechunk(...)`` as one collective step.

    Installs dask's ``array_optimize`` hook (chaining to whatever was there);
    ``options`` set ``redist.*`` config keys for as long as it stays enabled,
    e.g. ``enable(engine="dask", memory_budget="2GiB")``. Also a context manager.
    """
    current = dask.config.get("array_optimize", None)
    if isinstance(current, CollectiveOptimizer):
        current = current.chain
    cfg = {"array_optimize": CollectiveOptimizer(chain=current), **_overrides(options)}
    handle = Enabled(dask.config.set(cfg))
    _enabled.append(handle)
    _expression_mode(True)
    return handle


def _expression_mode(on: bool) -> None:
    """Expression mode has no optimize hook: swap its rechunk expression instead."""
    try:
        from dask_redist import expr
    except ImportError:  # pragma: no cover - a dask without array expressions
        return
    expr.install() if on else expr.uninstall()


def disable(handle: Enabled | None = None) -> None:
    """Undo `enable` (the latest one, or ``handle`` and everything enabled after it)."""
    while _enabled:
        h = _enabled.pop()
        h._handle.__exit__(None, None, None)
        if handle is None or h is handle:
            break
    if not _enabled:
        _expression_mode(False)


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
    decision = decide(graph, chain, settings)
    if not decision.collective:
        raise NotEligibleError(decision.reason)
    graph, _ = rewrite(graph, [], settings, only=[decision])
    return Array(graph, y.name, y.chunks, meta=y._meta)


def _forget_world(dask_scheduler) -> None:
    if (plugin := dask_scheduler.plugins.get("redist")) is not None:
        plugin.forget_world()


def _engine_broken():
    from dask_redist.engines import get_engine

    return get_engine("cufftmp").broken


def _stranded(dask_scheduler) -> list[str]:
    plugin = dask_scheduler.plugins.get("redist")
    return [w for w in plugin.stranded if w in dask_scheduler.workers] if plugin else []


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

    from dask_redist.bench import Case, check, cufftmp_stats, placed_array

    client = client or default_client()
    broken = {w: why for w, why in client.run(_engine_broken).items() if why}
    for w in client.run_on_scheduler(_stranded):
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
    client.run_on_scheduler(_forget_world)
    n = len(client.scheduler_info(n_workers=-1)["workers"])
    case = Case("bootstrap", (8 * n, 8 * n), "float64", ((8,) * n, (8 * n,)), ((8 * n,), (8,) * n))
    seed = random.randrange(2**31)  # fresh keys: an earlier failed bootstrap's results may still be held
    x = placed_array(client, case, seed=seed, kind="cupy")
    y = rechunk(x, case.new, engine="cufftmp").persist()
    wait(y)
    if not check(y, case, seed):
        raise RedistError("the bootstrap rechunk returned wrong values")
    return client.run(cufftmp_stats)
