"""dask-redist: a dask array rechunk as one collective step across the workers (docs/design.md maps the modules)."""

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
