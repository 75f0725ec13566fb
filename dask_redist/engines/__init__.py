"""Engines: the same plan, different transports, behind one protocol.

``dask`` moves pieces over Dask's own comms (TCP or UCX, NumPy or CuPy); ``cufftmp``
moves them GPU to GPU through NVSHMEM with one cuFFTMp reshape per round. Each engine has a
worker side (`protocol.Engine`: it moves one rank's pieces) and a scheduler side
(`description.EngineDescription`: what it refuses, when ``auto`` takes it, its world, its
lines for ``explain`` and ``doctor``). ``redist.engines`` names them (`registry`); the
scheduler picks one per run (`choice`); each worker process keeps one instance of each
engine it ran (`get_engine`), since engines keep caches (plans, arenas, worlds).
"""

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
