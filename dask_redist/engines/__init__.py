"""Engines: the same plan, different transports, behind one protocol; what the other layers use of them."""

from __future__ import annotations

from dask_redist.engines.description import EngineDescription, Request, WorldRecord
from dask_redist.engines.protocol import Engine, Health, Transport
from dask_redist.engines.registry import (
    check_settings,
    description,
    descriptions,
    engine_settings,
    get_engine,
    loaded_engines,
)

__all__ = [
    "Engine",
    "EngineDescription",
    "Health",
    "Request",
    "Transport",
    "WorldRecord",
    "check_settings",
    "description",
    "descriptions",
    "engine_settings",
    "get_engine",
    "loaded_engines",
]
