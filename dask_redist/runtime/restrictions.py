"""The workers, hosts and resources a user restricted a rechunk's outputs to.

``client.compute(y, resources={"GPU": 1})``, ``client.persist(y, workers=[w])`` and
annotations put restrictions on the rechunk's unpack tasks, which the scheduler pins to the
owner of their chunk. Owners are chosen among the run's ranks (every worker alive); where a
restriction forbids a chunk's owner, the chunk goes to a rank it allows (`planning.owners.
restricted_owners`): its task could run nowhere else, and waited in ``no-worker`` for good.
"""

from __future__ import annotations

import numpy as np

from dask_redist.core.spec import CollectiveSpec
from dask_redist.planning import Plan, PlanError, make_plan
from dask_redist.planning.geometry import chunk_nbytes
from dask_redist.planning.owners import restricted_owners


def allowed_owners(scheduler, keys: list, needed: np.ndarray, ranks: list[str]):
    """Which of ``ranks`` may own each output chunk (chunks x ranks, bool): those the scheduler may
    run its unpack task on (`SchedulerState.valid_workers`; ``keys``: the unpack tasks', in flat
    order); None where no wanted output is restricted. A loose restriction
    (``allow_other_workers``) that no rank meets allows any."""
    tasks, rows = scheduler.tasks, {}
    for flat in np.flatnonzero(needed.ravel()).tolist():
        ts = tasks.get(keys[flat])
        if ts is None or not (ts.worker_restrictions or ts.host_restrictions or ts.resource_restrictions):
            continue
        valid = {ws.address for ws in scheduler.valid_workers(ts) or ()}
        row = np.fromiter((w in valid for w in ranks), dtype=bool, count=len(ranks))
        rows[flat] = row if row.any() or not ts.loose_restrictions else True
    if not rows:
        return None
    allowed = np.ones((len(keys), len(ranks)), dtype=bool)
    for flat, row in rows.items():
        allowed[flat] = row
    return allowed


def restricted_plan(spec: CollectiveSpec, plan: Plan, allowed: np.ndarray, ranks: list[str]) -> Plan:
    """``plan`` with every output chunk owned by a rank ``allowed`` says it may run on; raises
    `PlanError` where one may run on no rank of the run, or for a distributed FFT, whose owners
    its transforms fix."""
    owners = plan.out_ranks.ravel()
    if allowed[np.arange(len(owners)), owners].all():
        return plan
    name = spec.describe()
    if spec.fft is not None:
        raise PlanError(
            f"{name}: its outputs are restricted to some workers (workers=, resources= or an "
            "annotation), and a distributed FFT's owners are fixed by its transforms: compute it "
            "without the restriction"
        )
    sizes = chunk_nbytes(spec.rechunk.new, spec.rechunk.itemsize).ravel() * plan.needed.ravel()
    try:
        owners = restricted_owners(owners, allowed, sizes)
    except PlanError as e:
        raise PlanError(f"{name}: {e}, among the run's workers {ranks}") from None
    return make_plan(spec.rechunk, plan.in_ranks, plan.nranks, out_ranks=owners, needed=plan.needed)
