"""Engines: the same plan, different transports, behind one protocol (`protocol.Engine`).

``dask`` moves pieces over Dask's own comms (TCP or UCX, NumPy or CuPy); ``cufftmp``
moves them GPU to GPU through NVSHMEM with one cuFFTMp reshape per round.
``redist.engine`` also accepts ``"package.module:EngineClass"`` for an engine of one's own.
The scheduler picks one per run (`choice`); each worker process keeps one instance of
each engine it ran (`get_engine`), since engines keep caches (plans, arenas, worlds).
"""

from __future__ import annotations

import importlib

from dask_redist.engines.protocol import Engine, Health, Transport

BUILTIN = {
    "dask": "dask_redist.engines.dask:DaskEngine",
    "cufftmp": "dask_redist.engines.cufftmp:CufftMpEngine",
}
_instances: dict[str, Engine] = {}

__all__ = ["BUILTIN", "Engine", "Health", "Transport", "get_engine", "loaded_engines"]


def get_engine(name: str) -> Engine:
    """The engine called ``name`` in this process (one instance per process)."""
    if name not in _instances:
        path = BUILTIN.get(name, name)
        module, _, attr = path.partition(":")
        if not attr:
            raise ValueError(f"unknown engine {name!r}: expected one of {sorted(BUILTIN)} or 'module:Class'")
        _instances[name] = getattr(importlib.import_module(module), attr)()
    return _instances[name]


def loaded_engines() -> dict[str, Engine]:
    """The engines this process has created so far (status reports never create one)."""
    return dict(_instances)
