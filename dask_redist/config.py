"""The ``redist`` dask config namespace and the validated settings read from it.

Settings are read once, on the client, when a graph is built or submitted, and
travel inside the graph: the scheduler and the workers act on the values the
user had set, not on their own process's config.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
from dataclasses import dataclass
from numbers import Real

import dask
import yaml

from dask_redist.checks import (
    check_bool,
    check_int,
    check_min_bytes,
    check_seconds,
    check_size,
    check_size_or_off,
)
from dask_redist.errors import ConfigError

_DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "redist.yaml")
with open(_DEFAULTS_FILE) as f:
    DEFAULTS = yaml.safe_load(f)
dask.config.update_defaults(DEFAULTS)

#: The engines every configuration has, by name (``redist.engines`` in redist.yaml adds none of
#: its own beyond them; a user's config adds to them): name -> "package.module:EngineClass".
BUILTIN_ENGINES: tuple[tuple[str, str], ...] = tuple(DEFAULTS["redist"]["engines"].items())
#: The entry-point group through which installed packages register engines (name = "module:Class").
ENTRY_POINTS = "dask_redist.engines"
CHUNK_TYPES = ("numpy", "cupy")
OUTPUT_TYPES = ("same", "numpy", "cupy")


def _default(key: str):
    node = DEFAULTS["redist"]
    for part in key.split("."):
        node = node[part]
    return node


def restore_defaults() -> None:
    """Put back the packaged defaults of every ``redist.*`` key dask's config lost.

    ``update_defaults`` at import puts them into the config of that moment; a config replaced
    wholesale later (``distributed.utils_test.reset_config()`` restores one copied before
    dask_redist was imported) has none. Keys that are set keep their values.
    """
    dask.config.update(dask.config.config, DEFAULTS, priority="old")


def flatten(options: dict, prefix: str = "redist") -> dict:
    """``{"redist.a.b-c": value}`` from nested ``options`` (``_`` read as ``-``)."""
    out = {}
    for k, v in options.items():
        key = f"{prefix}.{str(k).replace('_', '-')}"
        out.update(flatten(v, key) if isinstance(v, dict) and v else {key: v})
    return out


def installed_engines() -> tuple[tuple[str, str], ...]:
    """Engines that installed packages register in the ``dask_redist.engines`` entry-point group:
    (name, "package.module:EngineClass") pairs (read each time: a package installed since counts)."""
    return tuple((ep.name, ep.value) for ep in importlib.metadata.entry_points(group=ENTRY_POINTS))


def engine_names(keys=()) -> set[str]:
    """The names of every engine registered: built in, installed (entry points), in dask's config
    or among ``keys`` (``redist.engines.NAME``) about to be set."""
    table = dask.config.get("redist.engines", None) or {}
    named = {k.split(".")[2] for k in keys if k.startswith("redist.engines.") and k.count(".") >= 2}
    return {n for n, _ in BUILTIN_ENGINES} | {n for n, _ in installed_engines()} | set(table) | named


def check_known(keys) -> None:
    """ConfigError naming every key of ``keys`` (``redist.a.b``) that is not a ``redist.*`` setting,
    with the nearest one: a misspelt key would otherwise be ignored without a word. An engine's
    section (``redist.NAME.*``, NAME registered) is the engine's to check (`Settings.section`), and
    a cost model of any name (``redist.cost-model.NAME.*``) is checked as it is read (`_cost_entry`)."""
    known = flatten(DEFAULTS["redist"])
    # (engines of one's own are registered under redist.engines: any name goes there)
    free = ("redist.engines.", "redist.cost-model.")
    # (those two sections set whole, null or empty too: `cost-model: null` is no model; checked when read)
    whole = {f[:-1] for f in free}
    if not (rest := [k for k in keys if k not in known and k not in whole and not k.startswith(free)]):
        return  # (the engines' sections are looked up only where needed: that reads every package's metadata)
    own = tuple(f"redist.{name}." for name in engine_names(keys) if f"redist.{name}" not in known)
    if unknown := sorted(k for k in rest if not k.startswith(own)):
        near = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
        hints = "; ".join(f"{k}" + (f" (did you mean {m[0]}?)" if m else "") for k, m in near.items())
        raise ConfigError(f"unknown option {hints}: the redist.* keys are listed in docs/configuration.md")


def _get(key: str, config: dict | None):
    if config is None:  # (the packaged default where dask's config lost the key)
        return dask.config.get(f"redist.{key}", default=_default(key))
    node = config
    for part in key.split("."):
        node = node[part]
    return node


#: The environment variable of ``redist.host`` (read by dask where the worker starts, and by `host`).
HOST_VARIABLE = "DASK_REDIST__HOST"


def host(address: str | None = None) -> str:
    """This process's host, as every part of dask-redist sees it: ``redist.host`` of THIS
    process's config (a worker's own: env ``DASK_REDIST__HOST`` where the worker is started; never
    the client's snapshot), else the host of ``address`` (the worker's), else the machine's name.

    Workers of one host (the same value) may share files and GPU memory; workers of two hosts
    must reach each other over the network (NVSHMEM's remote transport). Pseudo-hosts: workers
    of one machine given different values are treated as on different hosts."""
    for value in (dask.config.get("redist.host", default=None), os.environ.get(HOST_VARIABLE)):
        if value is not None and str(value).strip():  # (the variable too: a nanny hands its worker
            return str(value).strip()  # its own config, redist.host null in it, over the worker's env)
    if address:
        from distributed.comm import get_address_host

        return get_address_host(address)
    import socket

    return socket.gethostname()


def _engines(config: dict | None) -> tuple[tuple[str, str], ...]:
    """``redist.engines`` over the built-in and the installed ones (`installed_engines`):
    (name, "package.module:EngineClass") pairs."""
    try:
        table = _get("engines", config)
    except KeyError:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError(
            f"redist.engines must map engine names to 'package.module:EngineClass', got {table!r}"
        )
    out = dict(BUILTIN_ENGINES)
    out.update((name, path) for name, path in installed_engines() if name not in out)
    for name, path in table.items():
        if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
            raise ConfigError(f"redist.engines: an engine's name must be a word like 'nccl', got {name!r}")
        if name == "auto":
            raise ConfigError(
                "redist.engines: 'auto' is not an engine's name (redist.engine: auto chooses one)"
            )
        module, _, attr = path.partition(":") if isinstance(path, str) else ("", "", "")
        if not module or not attr.isidentifier():
            raise ConfigError(f"redist.engines.{name} must be 'package.module:EngineClass', got {path!r}")
        out[name] = path
    return tuple(out.items())


def _engine(value, engines: tuple[tuple[str, str], ...]) -> str:
    names = [n for n, _ in engines]
    if not isinstance(value, str) or not (value == "auto" or value in names or ":" in value):
        raise ConfigError(
            f"redist.engine must be auto, an engine of redist.engines ({', '.join(names)}) or "
            f"'package.module:EngineClass', got {value!r}"
        )
    return value


def _frozen(value):
    """``value`` hashable: lists as tuples (a section travels inside the frozen `Settings`)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return () if isinstance(value, dict) else value


#: Sections of redist.yaml that an engine reads and checks (its description's ``settings_section``),
#: besides ``redist.NAME`` of every engine registered (the runtime reads exit-when-stuck too).
ENGINE_SECTIONS = ("nvshmem",)


def _sections(config: dict | None, engines: tuple[tuple[str, str], ...]) -> tuple:
    """The engines' own sections of ``redist`` as set: (name, ((key, value), ...)) for
    `ENGINE_SECTIONS` and each registered engine with a section ``redist.NAME`` (keys relative
    to it), unchecked: the engine checks them."""
    out = []
    for name in [*ENGINE_SECTIONS, *(n for n, _ in engines if n not in DEFAULTS["redist"])]:
        raw = dask.config.get(f"redist.{name}", None) if config is None else config.get(name)
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"redist.{name} must be a mapping of an engine's settings, got {raw!r}")
        if name in DEFAULTS["redist"]:  # (the packaged defaults of keys not set)
            raw = {**DEFAULTS["redist"][name], **(raw or {})}
        if raw is None:
            continue
        prefix = f"redist.{name}."
        items = ((k[len(prefix) :], _frozen(v)) for k, v in flatten(raw, prefix[:-1]).items())
        out.append((name, tuple(sorted(items))))
    return tuple(out)


#: The engines' sections of the packaged defaults (redist.yaml): the default of `Settings.sections`.
PACKAGED_SECTIONS = _sections(DEFAULTS["redist"], BUILTIN_ENGINES)


#: Dask's own rechunk (its ``tasks`` or ``p2p`` method), as users read it: ``explain()``'s "runs
#: as" and its line in a cost model. ("dask" alone is the engine of that name.)
DASK_RECHUNK = "dask-rechunk"

#: The terms of each method's line in a cost model (``redist.cost-model``; `dask_redist.planning.cost`).
COST_TERMS = {
    DASK_RECHUNK: ("fixed", "per-task", "per-byte"),
    "collective": ("fixed", "per-input-chunk", "per-output-chunk", "per-byte"),
}

#: Old names of a cost model's lines, still read: ``dask`` was ``dask-rechunk``'s (calibration
#: files written before the rename keep working).
COST_LINE_ALIASES = {"dask": DASK_RECHUNK}


def _renamed_lines(name: str, entry: dict) -> tuple[dict, dict]:
    """``entry`` (model ``name``) with its lines under their current names (`COST_LINE_ALIASES`),
    and the old name of each line set so (for errors). A line under its old name wins over the
    packaged model's line of the same name: dask's config merges a file written before the
    rename (``dask: ...``) into the packaged entry it replaces."""
    entry, packaged, named = dict(entry), (DEFAULTS["redist"]["cost-model"] or {}).get(name, {}), {}
    for old, new in COST_LINE_ALIASES.items():
        if old in entry:
            if new in entry and entry[new] != packaged.get(new):
                raise ConfigError(
                    f"redist.cost-model.{name} sets both {new} and {old} (its old name): keep {new} only"
                )
            entry[new], named[new] = entry.pop(old), old
    return entry, named


def _cost_entry(name: str, entry) -> tuple:
    key = f"redist.cost-model.{name}"
    if not isinstance(entry, dict):
        raise ConfigError(
            f"{key} must be a mapping with kind, workers, {DASK_RECHUNK} and collective, got {entry!r}"
        )
    if unknown := sorted(set(entry) - {"kind", "workers", "measured", *COST_TERMS, *COST_LINE_ALIASES}):
        raise ConfigError(
            f"{key} has unknown keys {', '.join(map(str, unknown))}: its keys are kind, workers, measured, "
            + ", ".join(COST_TERMS)
        )
    entry, named = _renamed_lines(name, entry)
    if entry.get("kind") not in CHUNK_TYPES:
        raise ConfigError(f"{key}.kind must be one of {', '.join(CHUNK_TYPES)}, got {entry.get('kind')!r}")
    workers = entry.get("workers")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"{key}.workers must be an integer >= 1, got {workers!r}")
    lines = []
    for method, terms in COST_TERMS.items():
        line, at = entry.get(method), f"{key}.{named.get(method, method)}"
        if not isinstance(line, dict) or set(line) != set(terms):
            raise ConfigError(f"{at} must be a mapping of {', '.join(terms)} (seconds), got {line!r}")
        for term in terms:
            v = line[term]
            if isinstance(v, bool) or not isinstance(v, Real) or not 0 <= v < float("inf"):
                raise ConfigError(f"{at}.{term} must be a finite number >= 0 (seconds), got {v!r}")
        lines.append(tuple(float(line[t]) for t in terms))
    return (name, entry["kind"], workers, str(entry.get("measured", "")), *lines)


def _cost_model(value) -> tuple:
    """``redist.cost-model`` as a tuple of (name, kind, workers, measured, Dask's rechunk's line,
    the collective's line)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ConfigError(f"redist.cost-model must be a mapping of named models (or null), got {value!r}")
    return tuple(_cost_entry(name, entry) for name, entry in sorted(value.items()))


#: The packaged cost models (redist.yaml): the default of `Settings.cost_model`.
PACKAGED_COST_MODEL = _cost_model(DEFAULTS["redist"]["cost-model"])


#: `Settings.from_config`'s reads of dask's config, by the text of ``redist.*`` (the last few).
_READ: dict[str, Settings] = {}
_READ_KEPT = 16


@dataclass(frozen=True)
class Settings:
    """A validated snapshot of ``redist.*``."""

    engine: str = "auto"  # "auto", a name of ``engines``, or "package.module:EngineClass"
    engines: tuple[tuple[str, str], ...] = (
        BUILTIN_ENGINES  # the registry: (name, "package.module:EngineClass")
    )
    chunk_types: tuple[str, ...] = CHUNK_TYPES
    output_type: str = "same"  # or a chunk type every input chunk is converted to when staged
    min_bytes: int | str = "auto"  # bytes, or "auto": the measured model of planning.cost
    cost_model: tuple = PACKAGED_COST_MODEL  # the models "auto" reads (`_cost_model`)
    numpy_via_gpus: int | None = 256 << 20  # NumPy rechunks this large go through the GPUs under auto
    memory_budget: int = 2**30
    size_class_bits: int = 4
    retries: int = 3
    barrier_timeout: float = 60.0
    collective_timeout: float = 300.0
    bootstrap_timeout: float = 120.0
    exit_when_stuck: bool = True  # a worker whose engine is stuck exits (redist.nvshmem.exit-when-stuck)
    respect_method: bool = True  # rechunk(method=...), or array.rechunk.method set, keeps Dask's rechunk
    fuse: bool = True  # the collective's tasks run its blockwise neighbours' tasks (graph.fuse)
    #: the engines' own sections of ``redist`` as set, unchecked (`section`; `_sections`)
    sections: tuple[tuple[str, tuple], ...] = PACKAGED_SECTIONS

    def section(self, name: str) -> dict:
        """Engine ``name``'s own settings as set (``redist.NAME.*``: keys relative to the section,
        ``-`` for ``_``, nested keys dotted); the engine checks them
        (`dask_redist.engines.EngineDescription.read_settings`)."""
        return dict(dict(self.sections).get(name, ()))

    def engine_path(self, name: str) -> str:
        """Where engine ``name`` lives: "package.module:EngineClass" (a path names itself)."""
        return dict(self.engines).get(name, name)

    @classmethod
    def from_config(cls, config: dict | None = None) -> Settings:
        """Read and check ``redist.*`` (from dask config, or from a dict shaped like it).

        Read on the client for every rechunk and every graph submitted: dask's config read as it
        is now is looked up by its text first (a read and check cost much more than the lookup)."""
        if config is not None:
            return cls._read(config)
        current = dask.config.get("redist", None) or {}
        key = repr(current)
        settings = _READ.get(key)
        if settings is None:
            check_known(flatten(current))
            settings = cls._read(None)
            if len(_READ) >= _READ_KEPT:
                _READ.clear()
            _READ[key] = settings
        return settings

    @classmethod
    def _read(cls, config: dict | None) -> Settings:
        engines = _engines(config)
        engine = _engine(_get("engine", config), engines)
        types = _get("chunk-types", config)
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, (list, tuple)) or not set(types) <= set(CHUNK_TYPES):
            raise ConfigError(
                f"redist.chunk-types must be a list drawn from {list(CHUNK_TYPES)}, got {types!r}"
            )
        output_type = _get("output-type", config)
        if output_type not in OUTPUT_TYPES:
            raise ConfigError(
                f"redist.output-type must be one of {', '.join(OUTPUT_TYPES)}, got {output_type!r}"
            )
        budget = check_size("memory-budget", _get("memory-budget", config), low=1)
        check_bool("fft.gpu", _get("fft.gpu", config))  # (read by dask_redist.fft: checked here too)
        return cls(
            engine=engine,
            engines=engines,
            chunk_types=tuple(types),
            output_type=output_type,
            min_bytes=check_min_bytes(_get("min-bytes", config)),
            cost_model=_cost_model(_get("cost-model", config)),
            numpy_via_gpus=check_size_or_off("numpy-via-gpus", _get("numpy-via-gpus", config)),
            memory_budget=budget,
            size_class_bits=check_int("size-class-bits", _get("size-class-bits", config)),
            retries=check_int("retries", _get("retries", config)),
            barrier_timeout=check_seconds("timeouts.barrier", _get("timeouts.barrier", config)),
            collective_timeout=check_seconds("timeouts.collective", _get("timeouts.collective", config)),
            bootstrap_timeout=check_seconds("timeouts.bootstrap", _get("timeouts.bootstrap", config)),
            exit_when_stuck=check_bool("nvshmem.exit-when-stuck", _get("nvshmem.exit-when-stuck", config)),
            respect_method=check_bool("respect-method", _get("respect-method", config)),
            fuse=check_bool("fuse", _get("fuse", config)),
            sections=_sections(config, engines),
        )


def process_barrier_timeout() -> float:
    """``redist.timeouts.barrier`` as this process's own config sets it, for the waits of a
    worker or the scheduler that no rechunk's settings reach (registering the plugins, asking
    every worker): the packaged default where that config does not check (a typo in a worker's
    YAML file, a bad ``DASK_REDIST__*`` in its environment). The settings that matter travel
    from the client; a worker's or the scheduler's own ``redist.*`` must not fail a rechunk."""
    try:
        return Settings.from_config().barrier_timeout
    except ConfigError:
        return Settings.barrier_timeout
