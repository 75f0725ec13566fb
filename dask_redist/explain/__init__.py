"""``explain(x)``: what will run for each rechunk in a collection's graph, and why."""

from __future__ import annotations

import math

import numpy as np

from dask_redist.compat import default_client, worker_info
from dask_redist.config import DASK_RECHUNK, Settings
from dask_redist.engines import Request, description
from dask_redist.engines.choice import choose_engine
from dask_redist.explain.entries import IN_MEMORY, Entry, Explanation, grid
from dask_redist.explain.found import collections, computed_together, decisions, expression, variables
from dask_redist.fft import describe as fft_describe
from dask_redist.graph.decide import memory_limits
from dask_redist.planning import make_plan


#: Why a rechunk whose output chunks the scheduler holds in memory does not run (`Entry.runs` IN_MEMORY).
IN_MEMORY_WHY = (
    "the scheduler holds every output chunk of this rechunk in memory (persisted, or held by another "
    "computation): computing this uses them, and nothing runs again"
)


def _holders(keys, dask_scheduler=None):
    """The worker holding each key, if every key is in memory (else None)."""
    out = []
    for k in keys:
        ts = dask_scheduler.tasks.get(tuple(k) if isinstance(k, list) else k)
        if ts is None or ts.state != "memory" or not ts.who_has:
            return None
        out.append(min(ws.address for ws in ts.who_has))
    return out


def _placement(spec, client, nworkers: int) -> tuple[np.ndarray, str]:
    """Rank of each input chunk: where it is if persisted, else contiguous blocks over the workers."""
    old_grid = spec.rechunk.old_grid
    n = math.prod(old_grid)
    if client is not None:
        keys = [(spec.input_name, *i) for i in np.ndindex(*old_grid)]
        where = client.run_on_scheduler(_holders, keys)
        if where is not None:
            workers = sorted(worker_info(client))
            pos = {w: i for i, w in enumerate(workers)}
            return np.array([pos[w] for w in where]), "where the persisted input is"
    ranks = (np.arange(n) * nworkers) // max(n, 1)
    return ranks, f"assumed: contiguous blocks over {nworkers} workers"


def _engine(spec, client) -> tuple[str, str, str | None]:
    """The engine a run would use, why, and why it is refused at submission, or None
    (`cluster.engine_for`; without a Client, the rule alone)."""
    request = Request.of(spec)
    if client is None:
        return *choose_engine(request, None, []), None
    from dask_redist.cluster import engine_for

    return engine_for(client, request)


def explain(x, *, nworkers: int | None = None, settings: Settings | None = None):
    """For every rechunk in ``x``'s graph: what runs (the collective, on which engine, or Dask's
    rechunk), why, and the engine, mapping, bytes moved, padding and rounds.

    Parameters
    ----------
    x : dask collection, or a list of them
        A dask array, an xarray object backed by dask, a Delayed (or a list, tuple or dict of
        them, explained as ``dask.compute`` of them rewrites their graphs: as one) whose graphs
        hold the rechunks; anything else gets a one-sentence note.
    nworkers : int, optional
        The workers to plan for; None: the default Client's, or 2 without one.
    settings : Settings, optional
        The ``redist.*`` settings to decide with; None: the current config's.

    Returns
    -------
    Explanation
        One `Entry` per rechunk (and ``dask_redist.fft``'s transforms), printed as a table. Where
        the default Client is asynchronous (called on its event loop), an awaitable of it:
        ``await dask_redist.explain(y)``.
    """
    from dask_redist.cluster import answered

    client = default_client()
    return answered(client, _explain, x, client, nworkers, settings)


def _explain(x, client, nworkers: int | None, settings: Settings | None) -> Explanation:
    import dask

    from dask_redist.graph.optimize import CollectiveOptimizer

    settings = settings or Settings.from_config()
    enabled = isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)
    found = collections(x)
    if isinstance(found, str):
        return Explanation((), enabled, nworkers or 0, note=found)
    workers = worker_info(client) if client is not None else None
    if nworkers is None:
        nworkers = len(workers) if workers is not None else 2
    nworkers = max(1, nworkers)
    entries = []
    memory = None
    if workers is not None:  # (as the scheduler decides: from the workers' memory limits)
        memory = memory_limits(w.get("memory_limit") for w in workers.values())
    together = computed_together(found)  # (a list's arrays: one graph, as dask.compute's)
    decided = {d[0]: d for c in together for d in decisions(c, settings, memory, client)}
    named = variables(found, decided)
    for output, method, spec, reason, explicit, fused, in_memory in decided.values():
        if spec is None:
            entries.append(Entry(output, method, DASK_RECHUNK, reason, variables=named.get(output, "")))
            continue
        runs = "collective"
        if client is None:
            reason, runs = (
                "eligible, but no distributed Client: dask's rechunk runs on local schedulers; below, what "
                f"the collective would do with a Client of {nworkers} workers that can run every engine",
                DASK_RECHUNK,
            )
        elif not enabled and not explicit:
            reason = (
                f"dask_redist is not enabled: dask's rechunk runs; enable() would run a collective ({reason})"
            )
            runs = DASK_RECHUNK
        if in_memory and runs == "collective":
            runs, reason = IN_MEMORY, f"{IN_MEMORY_WHY}; else it would run as a collective ({reason})"
        in_ranks, where = _placement(spec, client, nworkers)
        plan = make_plan(spec.rechunk, in_ranks, nworkers)
        engine, engine_why, refused = _engine(spec, client)
        if refused and runs == "collective":
            runs, reason = "refused at submission (EngineUnavailableError)", refused
        mapping, padding, rounds = description(engine, settings).mapping(plan, settings)
        entries.append(
            Entry(
                output,
                method,
                runs,
                reason,
                chunks=f"{grid(spec.rechunk.old)} -> {grid(spec.rechunk.new)} chunks, {spec.dtype}",
                engine=engine,
                engine_reason=engine_why,
                mapping=mapping,
                nbytes=plan.nbytes,
                moved=plan.moved_bytes,
                padding=padding,
                rounds=rounds,
                imbalance=plan.imbalance,
                placement=where,
                fused=fused if runs == "collective" else "",
                explicit=explicit,
                variables=named.get(output, ""),
            )
        )
    ffts = tuple(
        f for c in found if expression(c) is None for f in fft_describe.fft_entries(c.__dask_graph__())
    )
    return Explanation(tuple(entries), enabled, nworkers, ffts)
