"""The engines by name: ``redist.engines`` (name -> "package.module:EngineClass") and their two sides.

Engines are registered three ways, all resolved by `dask_redist.config` into the settings:
built in (redist.yaml), installed (the ``dask_redist.engines`` entry-point group of a
package, ``NAME = "package.module:EngineClass"``), and by configuration (``redist.engines``).
An engine owns its section of the settings, ``redist.NAME.*``, which it checks
(`engine_settings`).

Every process resolves a name the same way, from the settings a graph carries: the
scheduler to a description (`description`, `descriptions`: the scheduler's side, for the
choice of engine, ``explain``, ``doctor`` and ``bootstrap``), a worker to one engine
instance per process (`get_engine`: engines keep caches, plans, arenas, worlds).
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any

from dask_redist.config import Settings, host
from dask_redist.engines.description import EngineDescription
from dask_redist.engines.protocol import Engine

logger = logging.getLogger("dask_redist")
_instances: dict[str, tuple[str, Engine]] = {}  # engine path -> (its name, the instance)
_told: set[tuple[str, str]] = set()  # (engine path, why) of the classes said not to load here


def engine_class(path: str) -> type[Engine]:
    """The `Engine` subclass at ``path`` ("package.module:EngineClass")."""
    module, _, attr = path.partition(":")
    if not attr:
        raise ValueError(
            f"unknown engine {path!r}: expected a name of redist.engines or 'package.module:EngineClass'"
        )
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise TypeError(f"{path} is not an engine: subclass dask_redist.engines.Engine")
    return cls


def description(name: str, settings: Settings | None = None) -> EngineDescription:
    """The scheduler's side of the engine ``redist.engine`` calls ``name``. An engine whose class
    does not load in this process gets a bare description (``auto`` never takes it; named, it
    runs where the workers load it)."""
    path = (settings or Settings()).engine_path(name)
    try:
        cls = engine_class(path)
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        log = logger.debug if (path, why) in _told else logger.warning  # (once per process and reason)
        _told.add((path, why))
        log("engine %s (%s) does not load here: %s", name, path, why)
        return EngineDescription(name)
    return cls.description(name, cls)


@functools.lru_cache(maxsize=64)
def engine_settings(name: str, settings: Settings) -> Any:
    """Engine ``name``'s own settings (``redist.NAME.*``) in ``settings``, as its description reads
    and checks them (`EngineDescription.read_settings`); as set where its class does not load here."""
    d = description(name, settings)
    section = settings.section(d.settings_section or name)
    return section if d.engine is None else d.read_settings(section)


def check_settings(settings: Settings) -> Settings:
    """``settings``, once every engine that loads here has checked its own section (`ConfigError`)."""
    for name, _ in settings.engines:
        engine_settings(name, settings)
    return settings


def descriptions(settings: Settings | None = None) -> list[EngineDescription]:
    """Every engine of ``redist.engines``, as ``auto`` tries them: most preferred first (those
    ``auto`` never takes last)."""
    out = [description(name, settings) for name, _ in (settings or Settings()).engines]
    return sorted(out, key=lambda d: (d.preference is None, -(d.preference or 0)))


def get_engine(name: str, settings: Settings | None = None) -> Engine:
    """The engine ``name`` in this process (one instance per process and engine path)."""
    path = (settings or Settings()).engine_path(name)
    if path not in _instances:
        _instances[path] = (name, engine_class(path)())
    return _instances[path][1]


def loaded_engines() -> dict[str, Engine]:
    """The engines this process has created so far, by name (status reports never create one)."""
    return {name: engine for name, engine in _instances.values()}


def capabilities(engines: dict[str, str], address: str | None = None) -> dict[str, dict]:
    """Whether this process (the worker at ``address``) can run each engine of ``engines`` (name ->
    path): ``Engine.capabilities()``, or why its class cannot be loaded here; each with the
    worker's ``host`` (`dask_redist.config.host`: ``redist.host``, else the address's host), the
    one the scheduler, ``explain`` and ``doctor`` go by."""
    out, where = {}, host(address)
    for name, path in engines.items():
        try:
            answer = engine_class(path).capabilities()
        except Exception as e:
            answer = {"ok": False, "reason": f"{path} does not load here: {type(e).__name__}: {e}"}
        out[name] = {**answer, "host": where}
    return out
