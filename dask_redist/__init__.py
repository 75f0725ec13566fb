"""dask-redist: a dask array rechunk as ONE collective step across the workers.

>>> import dask_redist
>>> dask_redist.enable()          # every eligible x.rechunk(...) now runs as a collective
>>> dask_redist.explain(y)        # what runs for each rechunk in y's graph, and why
>>> dask_redist.rechunk(x, (1024, -1, 1))   # the explicit form

The package, bottom up (docs/design.md has the module map): ``planning`` (pure),
``core`` (the types every process shares), ``engines`` (how bytes move), ``runtime``
(the scheduler and worker plugins), ``graph`` (the rewrite of dask graphs), then
this API, ``explain`` and ``doctor``; ``bench`` and ``cli`` on top, never imported here.
"""

from __future__ import annotations

from dask_redist.api import Enabled, bootstrap, disable, enable, rechunk, status
from dask_redist.config import ConfigError, Settings
from dask_redist.doctor import doctor
from dask_redist.errors import (
    EngineUnavailableError,
    NotEligibleError,
    RedistConsistencyError,
    RedistError,
    RedistTimeoutError,
)
from dask_redist.explain import explain

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Enabled",
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
    "status",
]
