"""Task priorities for graphs that hold collective rechunks, in linear time.

The scheduler gives every new graph priorities with ``dask.order.order``. For
each root it walks every leaf the root reaches; through a barrier every input
chunk reaches every output chunk, so ordering a collective over n chunks costs
O(n^2), which at a few thousand chunks took longer than the exchange itself
(docs/benchmarks.md, "Where the time goes"). Dask's p2p rechunk has the same shape.

`order` orders a copy of the graph in which every barrier's inbound edges are
cut: the barrier becomes a root, its stage tasks leaves. The cost is linear;
the orders above and below each barrier are what dask would pick for those
parts on their own, and whatever priority the barrier gets, it cannot run
before its stage tasks. The real graph is not touched.

A graph of nothing but the collective's own tasks (what persisting a rechunk of a persisted
array submits: stage, barrier and unpack tasks) has one sensible order, its dependencies':
`collective_order` gives it in one pass (Kahn's, ties in the graph's order), where dask's
ordering of the cut graph walks every unpack task as a root of its own (the barrier cut;
measured in docs/benchmarks.md). Graphs with other tasks go to dask.

`install` swaps this in for ``dask.order.order`` in the scheduler's process
(the scheduler looks the function up on the module for every graph); graphs
without a collective barrier go to dask's function unchanged. It is installed
by the graph rewrite (before the scheduler orders the graph it rewrote) and by
the scheduler plugin when it starts (graphs lowered on the client, in expression
mode, reach the scheduler already built): it lives with the runtime so that
both can, the graph package being above the runtime.
"""

from __future__ import annotations

import functools

import dask.order

from dask_redist.compat import Task
from dask_redist.core.spec import BarrierTask, CollectiveTask


def _never():  # pragma: no cover - stands in for a barrier while ordering, never run
    raise AssertionError("placeholder task executed")


def cut_barriers(dsk):
    """A copy of ``dsk`` with each barrier replaced by a task without dependencies; None if none."""
    barriers = [k for k, v in dsk.items() if isinstance(v, BarrierTask)]
    if not barriers:
        return None
    cut = dict(dsk)
    for key in barriers:
        cut[key] = Task(key, _never)
    return cut


def collective_order(dsk) -> dict | None:
    """Priorities of a graph of collective tasks only, dependencies first (ties: the graph's
    order); None if it holds any other task."""
    if not all(isinstance(task, CollectiveTask) for task in dsk.values()):
        return None
    waiting = {k: len(task.dependencies & dsk.keys()) for k, task in dsk.items()}
    dependents: dict = {}
    for k, task in dsk.items():
        for d in task.dependencies:
            if d in dsk:
                dependents.setdefault(d, []).append(k)
    ready = [k for k, n in waiting.items() if n == 0]
    ready.reverse()  # (popped from the end: the graph's first key first)
    out: dict = {}
    while ready:
        k = ready.pop()
        out[k] = len(out)
        for d in reversed(dependents.get(k, ())):
            waiting[d] -= 1
            if waiting[d] == 0:
                ready.append(d)
    return out if len(out) == len(dsk) else None  # (a cycle: dask's order reports it)


def wrap(order):
    @functools.wraps(order)
    def order_with_collectives(dsk, dependencies=None, **kwargs):
        if dependencies is None and not kwargs.get("return_stats") and (direct := collective_order(dsk)):
            return direct
        cut = cut_barriers(dsk) if dependencies is None else None
        return order(dsk if cut is None else cut, dependencies, **kwargs)

    order_with_collectives.redist_wrapped = order
    return order_with_collectives


def install() -> None:
    """Make ``dask.order.order`` cut collective barriers (idempotent)."""
    if not hasattr(dask.order.order, "redist_wrapped"):
        dask.order.order = wrap(dask.order.order)
