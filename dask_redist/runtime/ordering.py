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
from dask_redist.core.spec import BarrierTask


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


def wrap(order):
    @functools.wraps(order)
    def order_with_collectives(dsk, dependencies=None, **kwargs):
        cut = cut_barriers(dsk) if dependencies is None else None
        return order(dsk if cut is None else cut, dependencies, **kwargs)

    order_with_collectives.redist_wrapped = order
    return order_with_collectives


def install() -> None:
    """Make ``dask.order.order`` cut collective barriers (idempotent)."""
    if not hasattr(dask.order.order, "redist_wrapped"):
        dask.order.order = wrap(dask.order.order)
