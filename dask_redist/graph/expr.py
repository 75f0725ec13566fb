"""Expression mode (``array.query-planning: True``): the collective at lowering time.

In expression mode a rechunk is a ``Rechunk`` expression that lowers to dask's
``TasksRechunk`` (its ``p2p`` path is not implemented there) and dask's
``array_optimize`` hook is never consulted. So while dask-redist is enabled,
``ArrayExpr.rechunk`` (what ``x.rechunk`` and ``da.rechunk`` call) builds a
`CollectiveRechunk` instead: the same expression plus the ``redist``
settings of the moment. When it is lowered on a distributed scheduler and the
array is eligible, its layer is the collective's stage, barrier and unpack
tasks under the same output name; otherwise it lowers to dask's own rechunk. (Expression mode lowers on the
client, so "distributed" means: a distributed Client is the default scheduler.) A rechunk given
``method=``, or called while dask's config sets ``array.rechunk.method``, stays dask's
``Rechunk`` (``redist.respect-method``).
"""

from __future__ import annotations

from functools import cached_property

from dask.utils import typename

from dask_redist.compat import (
    array_expr,
    cached_worker_count,
    chosen_method,
    default_client,
    meta_of,
    with_operand,
)
from dask_redist.config import Settings
from dask_redist.graph.layer import collective_tasks
from dask_redist.graph.decide import collective_spec
from dask_redist.graph.optimize import running_on_scheduler

ArrayExpr, Rechunk, TasksRechunk = array_expr()
_original_rechunk = ArrayExpr.rechunk


class CollectiveRechunk(Rechunk):
    _parameters, _defaults = with_operand(Rechunk, "settings")

    @cached_property
    def decision(self):
        x = self.array
        client = default_client()
        return collective_spec(
            x._name,
            self._name,
            x.chunks,
            self.chunks,
            x.dtype,
            typename(type(meta_of(x))),
            self.operand("settings") or Settings.from_config(),
            cached_worker_count(client) if client else None,
        )

    def _lower(self):
        if not self.balance and self.chunks == self.array.chunks:
            return self.array
        spec, _ = self.decision
        if spec is None or not (running_on_scheduler() or distributed_is_default()):
            return TasksRechunk(self.array, self.chunks, self.threshold, self.block_size_limit)
        return None  # this expression is lowered: its layer is the collective

    def _layer(self) -> dict:
        spec, _ = self.decision
        return collective_tasks(spec)


def distributed_is_default() -> bool:
    """Will a graph built now run on a distributed cluster? (Expression mode lowers on the client.)"""
    from dask.base import get_scheduler

    client = default_client()
    return client is not None and get_scheduler() == client.get


def _collective_rechunk(
    self, chunks="auto", threshold=None, block_size_limit=None, balance=False, method=None
):
    settings = Settings.from_config()
    chosen = chosen_method(method) if settings.respect_method else None
    if chosen is not None or self.ndim > 0 and all(s == 0 for s in self.shape):
        method = chosen[0] if chosen else method  # (a configured one as dask reads it now, not when lowered)
        return _original_rechunk(
            self, chunks, threshold, block_size_limit, balance, method
        )  # (the user's method)
    result = CollectiveRechunk(self, chunks, threshold, block_size_limit, balance, method, settings)
    result.chunks  # noqa: B018 - validates the chunks now, as dask does
    return result


def install() -> None:
    ArrayExpr.rechunk = _collective_rechunk


def uninstall() -> None:
    ArrayExpr.rechunk = _original_rechunk
