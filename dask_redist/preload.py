"""Turn the collective on for a whole deployment from configuration: a Dask preload.

Users change nothing, not even ``dask_redist.enable()``, where the operator lists this
module as a preload in the Dask configuration their sessions read (``/etc/dask/*.yaml``,
``~/.config/dask/*.yaml``, or ``DASK_DISTRIBUTED__CLIENT__PRELOAD``)::

    distributed:
      client:
        preload: [dask_redist.preload]      # every Client turns the collective on
      scheduler:
        preload: [dask_redist.preload]      # optional: plugins ready before the first graph

* As a **client** preload it calls `dask_redist.enable` when each `Client` starts (and
  `dask_redist.disable` when it closes), unless ``redist.enabled`` is false: a user opts out
  with ``DASK_REDIST__ENABLED=false`` or ``dask.config.set({"redist.enabled": False})``. Where
  ``enable`` fails (a bad ``redist.*`` value), a ``RuntimeWarning`` and the log say so.
* As a **scheduler** preload (``dask scheduler --preload dask_redist.preload``) it registers
  the scheduler plugin (which registers the worker plugin on every worker) at start, so the
  linear-time ordering of collective graphs applies from the first graph on, expression
  mode included.
"""

from __future__ import annotations

import logging
import warnings

import dask

from dask_redist.api import Enabled, disable, enable
from dask_redist.checks import check_bool

logger = logging.getLogger(__name__)
_handles: dict[int, Enabled] = {}


def _enable_for(client) -> None:
    """`enable` for this Client, unless ``redist.enabled`` is false; where that fails (or
    ``redist.enabled`` is not true or false), a warning and an error in the log that say the
    collective is off and why (distributed would only log "Failed to start preload")."""
    try:
        if check_bool("enabled", dask.config.get("redist.enabled", True)):
            _handles[id(client)] = enable()
    except Exception as e:
        message = (
            f"dask_redist.preload could not turn the collective on: {type(e).__name__}: {e}. "
            "This session's rechunks run as Dask's own"
        )
        logger.error(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


async def dask_setup(dask_object) -> None:
    from distributed import Client, Scheduler

    if isinstance(dask_object, Client):
        if id(dask_object) not in _handles:
            _enable_for(dask_object)
    elif isinstance(dask_object, Scheduler):
        from dask_redist.runtime.tasks import register

        await register(dask_object)


async def dask_teardown(dask_object) -> None:
    handle = _handles.pop(id(dask_object), None)
    if handle is not None:
        disable(handle)
