"""What the API asks of a running cluster: the workers' engines (`engines_state`), the refusal of
an engine they cannot run (`refuse_unrunnable`), which engine would run a rechunk (`engine_for`), the scheduler plugin (`ensure_scheduler_plugin`),
`status`, and the public functions' answer to an asynchronous Client (`answered`)."""

from __future__ import annotations

import weakref
from typing import NamedTuple

from dask_redist.compat import cached_scheduler_id, worker_info
from dask_redist.config import Settings
from dask_redist.core.messages import SchedulerStatus
from dask_redist.errors import EngineUnavailableError, RedistTimeoutError
from dask_redist import submissions
from dask_redist.report import Status


class EnginesState(NamedTuple):
    """What `engines_state` answers."""

    capabilities: dict  # worker -> {engine name: what it answered}
    workers: list[str]
    records: dict  # engine name -> its `WorldRecord` on the scheduler
    holders: list  # for each key asked about, the workers holding it in memory


def engines_state(client, settings: Settings, keys=()) -> EnginesState:
    """The workers' engines once every worker said which engines of ``redist.engines``, and the
    one ``redist.engine`` names, it can run, and where ``keys`` are held: one question to the
    scheduler, which asks each worker once."""
    from dask_redist.core.messages import Probe
    from dask_redist.engines import WorldRecord

    ensure_scheduler_plugin(client)
    engines = dict(settings.engines)
    if settings.engine != "auto":
        engines[settings.engine] = settings.engine_path(settings.engine)
    try:
        state = client.sync(Probe(engines, tuple(keys)).call, client.scheduler)
    except TypeError:  # (a scheduler with an older dask-redist takes no keys)
        if not keys:
            raise
        state = client.sync(Probe(engines).call, client.scheduler)
    records = {name: WorldRecord.from_state(r) for name, r in state["records"].items()}
    workers = state.get("workers")  # (a scheduler with an older dask-redist answers without them)
    workers = sorted(worker_info(client)) if workers is None else list(workers)
    holders = state.get("holders") or [[] for _ in keys]
    return EnginesState(state["capabilities"], workers, records, [list(h) for h in holders])


def engine_for(client, request, state: EnginesState | None = None) -> tuple[str, str, str | None]:
    """Which engine would run ``request`` (an `engines.Request`) on ``client``'s workers, and why:
    decided as the scheduler decides it (`engines.choice.choose_engine`), from what the workers
    answered (asked if nobody asked them yet; ``state``: `engines_state`'s answer for
    ``request.settings``, already asked); and why the engine named in ``redist.engine`` is
    refused at submission (`refuse_unrunnable`), or None. ``explain``, the FFT and ``doctor`` ask this."""
    from dask_redist.engines.choice import cannot_run, choose_engine

    capabilities, workers, records, _ = state or engines_state(client, request.settings)
    engine, why = choose_engine(request, capabilities, workers, records)
    hosts = _hosts(capabilities, workers)  # (unless the reason names them already)
    return engine, why + (hosts if hosts[2:] not in why else ""), cannot_run(request, capabilities, workers)


def _hosts(capabilities: dict, workers) -> str:
    """``; workers on 2 hosts (hostA, hostB)`` where they span several (each worker's
    ``redist.host``, as it answered the scheduler), else nothing."""
    hosts = sorted({a["host"] for w in workers for a in capabilities.get(w, {}).values() if a.get("host")})
    return f"; workers on {len(hosts)} hosts ({', '.join(hosts)})" if len(hosts) > 1 else ""


def answered(client, func, *args, **kwargs):
    """``func(*args, **kwargs)``, which asks ``client``'s cluster through its blocking methods; where
    ``client`` is asynchronous (``Client(asynchronous=True)``, and this is its event loop), an
    awaitable of it instead, as distributed's own methods answer there: ``func`` runs in a thread,
    where the Client's methods block that thread while the event loop, free, serves them."""
    if client is not None and getattr(client, "asynchronous", False):
        import asyncio

        return asyncio.to_thread(func, *args, **kwargs)
    return func(*args, **kwargs)


def client_to_ask(settings: Settings):
    """The default Client, where the engine named in ``redist.engine`` must be asked of its workers
    before a submission (`refuse_unrunnable`); else None: no Client, ``auto``, or an engine that
    loads here and needs nothing of the workers (``dask``: no round trip)."""
    from dask_redist.compat import default_client
    from dask_redist.engines import description

    client = default_client()
    if settings.engine == "auto" or client is None or submissions.in_event_loop():
        return None
    named = description(settings.engine, settings)
    if named.engine is not None and not named.probes:  # (it runs wherever its class loads, as here)
        return None
    return client


def refuse_unrunnable(specs, settings: Settings) -> None:
    """Raise `EngineUnavailableError` where the engine named in ``redist.engine`` cannot run one of
    ``specs`` on the default Client's workers: once, at submission, with the remedy, instead of
    every task of the run failing on the workers. Nothing to check where `client_to_ask` says so."""
    if specs and (client := client_to_ask(settings)) is not None:
        refuse_unrunnable_on(client, specs, settings)


def refuse_unrunnable_on(client, specs, settings: Settings) -> None:
    """`refuse_unrunnable` on ``client``, which `client_to_ask` gave."""
    from dask_redist.engines import Request
    from dask_redist.engines.choice import cannot_run

    if not specs:
        return
    capabilities, workers, _, _ = engines_state(client, settings)
    for spec in specs:
        if problem := cannot_run(Request.of(spec), capabilities, workers):
            raise EngineUnavailableError(problem)


def status(client=None):
    """What the collective has done and holds on a cluster (asks the scheduler once).

    Parameters
    ----------
    client : distributed.Client, optional
        The cluster's Client; None: the default Client.

    Returns
    -------
    dask_redist.report.Status
        With an asynchronous Client (``Client(asynchronous=True)``, called on its event loop), an
        awaitable of it: ``await dask_redist.status()``. Printed (or shown in Jupyter) as tables with times as durations; a dict of the
        scheduler's answer, times in it as recorded (epoch seconds): ``history``: the runs
        finished (engine, why, bytes, seconds, outcome: ``done``, ``failed``, ``restarted``,
        ``cancelled``, or ``outputs failed`` where output tasks raised after the exchange, a step
        fused into them; the why of a run not done says how it ended), and rechunks that failed
        with no run ending so (refused at their barrier, a task before it failed: outcome and why
        only), oldest first (the scheduler keeps the latest 200); ``active``: runs in flight (their names; ``in flight``: their entries, as the history's); ``timeline``: the scheduler's marks of the
        latest run; ``engines``: what the choice of engine depends on (capabilities, each
        engine's world); ``workers``: per worker, the chunks staged, runs and early pieces held,
        its timeline, and its engines' health and statistics; ``unanswered``: the workers that
        gave no answer within 10 s (stopped, or their event loop blocked) or failed, and why.

    Raises
    ------
    RedistTimeoutError
        The scheduler did not answer (its event loop is blocked, or it is gone).
    ValueError
        The Client is closed.
    """
    from distributed import default_client

    client = client or default_client()
    return answered(client, _status, client)


def _status(client) -> Status:
    from dask_redist.runtime.scheduler import STATUS_TIMEOUT_S

    ensure_scheduler_plugin(client)
    limit = STATUS_TIMEOUT_S + 20  # the scheduler gives each worker STATUS_TIMEOUT_S; its own answer is quick
    try:
        return Status(client.sync(SchedulerStatus().call, client.scheduler, callback_timeout=limit))
    except TimeoutError as e:
        raise RedistTimeoutError(
            f"the scheduler at {client.scheduler.address} did not answer dask_redist.status() within {limit:g}s "
            "(its event loop is blocked, or it is gone)"
        ) from e
    except OSError as e:  # (distributed's comms: the connection failed or closed)
        raise RedistTimeoutError(
            f"dask_redist.status() could not reach the scheduler at {client.scheduler.address} ({e}): "
            "it is gone, or not reachable from here"
        ) from e


#: The scheduler (its id) each Client registered the plugins with: once per scheduler, not per call.
_registered: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ensure_scheduler_plugin(client) -> None:
    """The plugins register with the first collective run; ``status`` and ``bootstrap`` may come
    first. Once per Client and scheduler (a Client reconnected to a new scheduler registers again)."""
    if client.status in ("closing", "closed") or client.scheduler is None:
        raise ValueError(
            f"client: the Client is {client.status}; dask_redist needs an open one (this one was closed, or "
            "never connected): create a new distributed.Client, or pass one that is running"
        )
    from dask_redist.runtime.tasks import plugins

    scheduler = cached_scheduler_id(client)
    if scheduler is not None and _registered.get(client) == scheduler:
        return
    plugin = plugins()
    client.register_plugin(plugin, name=plugin.name)  # idempotent: a plugin already there stays
    _registered[client] = scheduler


def world_engine(settings: Settings, name: str | None):
    """The description of engine ``name``, or of the one engine with a world; checks it has one."""
    from dask_redist.engines import description, descriptions

    if name is not None:
        d = description(name, settings)
        if not d.world:
            raise ValueError(f"engine {name!r} has no world to bootstrap")
        return d
    worlds = [d for d in descriptions(settings) if d.world]
    if len(worlds) != 1:
        names = [d.name for d in worlds]
        raise ValueError(f"bootstrap(engine=...) must name one of the engines with a world: {names}")
    return worlds[0]
