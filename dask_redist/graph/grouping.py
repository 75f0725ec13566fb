"""Stage tasks grouped per worker where the input is already in memory, and the same graph for
the same rechunk while its tasks are known to the scheduler (`stage_grouping`).

Runs on the scheduler while `dask_redist.graph.optimize.rewrite` materializes a graph.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from dask.base import tokenize

from dask_redist.compat import building_graph, running_schedulers
from dask_redist.core.spec import BARRIER_PREFIX, CollectiveSpec


def scheduler_in_process():
    """The scheduler building this graph, or None where that is unclear. Several can run in one
    process (two LocalClusters in a notebook): the one building a graph now is taken
    (`compat.building_graph`; where that cannot be told, only a lone scheduler is)."""
    running = running_schedulers()
    if len(running) > 1:  # (several in one process: the one whose graph is being built now)
        running = [s for s in running if building_graph(s)]
    return running[0] if len(running) == 1 else None


#: The stage grouping each rechunk (by its plain token) got last on this scheduler, and
#: whether its stage tasks ran their input chunks' tasks.
_GROUPINGS: dict[str, tuple[str, list | None, bool]] = {}
GROUPINGS_KEPT = 10_000


def stage_grouping(spec: CollectiveSpec, inline=lambda force: None) -> tuple[CollectiveSpec, list | None, tuple | None]:
    """The spec, stage groups and inlined inputs (``inline(force)``: `inlined_inputs`) of a
    rechunk's graph; same keys always mean the same tasks.

    Grouping depends on where the input is, which changes (a worker died, the input was
    persisted again): a grouped graph gets a token of its own, so its stage and barrier keys
    are its own. While the tasks of an earlier submission are still known to the scheduler,
    the same rechunk gets that graph again, inlined inputs as before included, so that its
    keys keep their tasks (distributed warns about a key resubmitted with other dependencies,
    and keeps the old).
    """
    scheduler = scheduler_in_process()
    earlier = _GROUPINGS.get(spec.token)
    if earlier is not None and scheduler is not None and BARRIER_PREFIX + earlier[0] in scheduler.tasks:
        token, groups, inlined = earlier
        inputs = inline(True) if inlined else None
        if inlined and inputs is None:  # (cannot be built as before: keys of its own)
            token = tokenize(token, "inputs not inlined")
    else:
        groups = persisted_groups(spec)
        inputs = inline(False) if groups is None else None
        token = spec.token if groups is None else tokenize(spec.token, groups)
        _GROUPINGS.pop(spec.token, None)
        _GROUPINGS[spec.token] = (token, groups, inputs is not None)
        while len(_GROUPINGS) > GROUPINGS_KEPT:
            del _GROUPINGS[next(iter(_GROUPINGS))]
    return (spec if token == spec.token else replace(spec, token=token)), groups, inputs


def persisted_groups(spec: CollectiveSpec) -> list[list[tuple[int, ...]]] | None:
    """Input chunk indices grouped by the worker holding them, if all are in memory already.

    Then one stage task per worker does: far fewer tasks than one per chunk. Read
    from the scheduler's state (this runs on the scheduler while the graph is
    materialized); anything unclear, and the plan stays one stage task per chunk.
    """
    scheduler = scheduler_in_process()
    if scheduler is None:
        return None
    groups: dict[str, list] = {}
    try:
        for idx in np.ndindex(*spec.rechunk.old_grid):
            ts = scheduler.tasks.get((spec.input_name, *idx))
            if ts is None or ts.state != "memory" or not ts.who_has:
                return None
            groups.setdefault(min(ws.address for ws in ts.who_has), []).append(idx)
    except RuntimeError:  # state changed under us (another thread): no grouping
        return None
    if len(groups) >= math.prod(spec.rechunk.old_grid):
        return None
    return [groups[w] for w in sorted(groups)]
