"""The scheduler's side of an engine: what it refuses, when ``auto`` takes it, its world, its lines.

An engine has two sides. Its worker side (`dask_redist.engines.protocol.Engine`) moves one
rank's pieces of a run. Its scheduler side, an `EngineDescription` named by the engine class
(``Engine.description``), is what the scheduler, ``explain``, ``doctor`` and ``bootstrap()``
ask about it, without importing anything the engine needs to run:

* ``refuses``: why it cannot run a rechunk at all (also when asked for by name);
  ``cannot_form``: why it cannot run over a set of workers at all (their hosts, say);
* ``preference``, ``declines``, ``unable``, ``chosen``: its place in ``redist.engine: auto``
  (`dask_redist.engines.choice`), the reasons written for the person reading them;
* what it supports: ``chunk_types`` (rechunks of which chunk types it moves) and
  ``fft_chunk_types`` (the chunk types it runs distributed FFTs on; none: it runs none);
  ``recovery``: whether a run the engine chosen cannot finish (its world lost a worker)
  recovers on it;
* ``read_settings``: its own section of the settings (``redist.NAME.*``), checked by it;
* ``world``: whether it starts over a set of workers that the scheduler records
  (`WorldRecord`), and forgets when ``dask_redist.bootstrap`` is called; ``world_name``,
  what its reasons call that world;
* ``mapping``: its line for ``explain``; ``worker_report``, ``doctor_columns``,
  ``doctor_line``, ``doctor_notes``: its part of ``dask-redist doctor``;
* ``bootstrap_input``: the small rechunk ``dask_redist.bootstrap`` runs to start its world.

A `Request` is what ``auto`` weighs of one rechunk. The registry (`dask_redist.engines.registry`)
makes one description per engine name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dask_redist.config import ConfigError, Settings

if TYPE_CHECKING:
    from dask_redist.core.spec import CollectiveSpec
    from dask_redist.planning import Plan


@dataclass(frozen=True)
class Request:
    """What ``auto`` weighs of one rechunk: the chunk type the run moves, its size and dtype."""

    chunk_type: str  # "numpy" or "cupy"
    settings: Settings
    nbytes: int | None = None  # None: any size (``doctor`` asks of no rechunk in particular)
    dtype: Any = None

    @classmethod
    def of(cls, spec: CollectiveSpec, chunk_type: str | None = None) -> Request:
        """The request of ``spec``, whose staged chunks are of ``chunk_type`` (default: its metadata's)."""
        return cls(chunk_type or spec.chunk_type, spec.settings, spec.rechunk.nbytes, spec.dtype)

    @property
    def chunks(self) -> str:
        """ "NumPy chunks" or "CuPy chunks", for reasons."""
        return "CuPy chunks" if self.chunk_type == "cupy" else "NumPy chunks"


@dataclass
class WorldRecord:
    """The scheduler's record of an engine: the world it was started over (engines with a world:
    `EngineDescription.world`), and why it cannot be used."""

    members: tuple[str, ...] | None = None  # the workers the world was started over
    broken: str | None = None  # why the engine (its world) cannot be used any more
    # members of a world that lost a member: they may not be able to leave it (an engine's
    # finalize waiting for the dead member), so they cannot join a new world until restarted
    stranded: list[str] = field(default_factory=list)
    # rechunks (tokens) the scheduler held when the world lost its PE: their runs are recoveries
    recovering: set[str] = field(default_factory=set)
    #: what reasons call the world (the engine's `EngineDescription.world_name`)
    world_name: str = "engine's"

    def forget(self) -> None:
        """The engine's next run starts a world over the workers of that moment."""
        self.members, self.broken, self.stranded, self.recovering = None, None, [], set()

    def worker_left(self, worker: str, under_way=()) -> None:
        """``worker`` left; ``under_way``: the rechunks submitted by then, which it may have been part of."""
        if self.members is not None and worker in self.members:
            self.broken = f"worker {worker} left the {self.world_name} world"
            self.stranded = sorted(set(self.members) - {worker})
            self.recovering |= set(under_way)

    def state(self) -> dict:
        members = list(self.members) if self.members is not None else None
        return {"world": members, "broken": self.broken, "stranded": list(self.stranded)}

    @classmethod
    def from_state(cls, state: dict) -> WorldRecord:
        """The record `state` gave (as ``status()`` carries it)."""
        members = tuple(state["world"]) if state.get("world") is not None else None
        return cls(members, state.get("broken"), list(state.get("stranded", [])))


class EngineDescription:
    """The scheduler's side of an engine: the defaults of an engine that needs nothing of the workers."""

    #: ``auto`` tries the engines from the highest preference down and takes the first that takes
    #: the rechunk; None: ``auto`` never takes it (it runs when named in ``redist.engine``)
    preference: int | None = None
    #: whether ``auto`` asks every worker first whether it can run the engine (``Engine.capabilities``)
    probes: bool = False
    #: whether it starts over a set of workers (a world) that the scheduler records; a run over
    #: other workers then needs a new one (``dask_redist.bootstrap``)
    world: bool = False
    #: what its world is called in reasons
    world_name: str = "its world"
    #: the chunk types of the rechunks it moves ("numpy", "cupy"); others it refuses
    chunk_types: tuple[str, ...] = ("numpy", "cupy")
    #: the chunk types it runs distributed FFTs on (`dask_redist.fft`); empty: it runs none
    fft_chunk_types: tuple[str, ...] = ()
    #: whether a run that the engine chosen cannot finish (workers stranded in its world) is
    #: finished on this engine: one that runs wherever Dask does
    recovery: bool = False

    def __init__(self, name: str, engine: type | None = None):
        self.name = name  # as ``redist.engine`` names it
        self.engine = engine  # its worker side, an `Engine` subclass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # -- its settings ---------------------------------------------------------------------

    #: the section of ``redist`` it owns (None: ``redist.NAME``, NAME as registered)
    settings_section: str | None = None

    def read_settings(self, section: dict) -> Any:
        """Its own settings, checked: ``section`` is ``redist.NAME.*`` as set (`Settings.section`:
        keys relative to it); raise `ConfigError` naming a key it does not take or a bad value.
        What it returns is what the engine reads (`dask_redist.engines.engine_settings`). By
        default an engine takes none."""
        if section:
            key = f"redist.{self.settings_section or self.name}.{sorted(section)[0]}"
            raise ConfigError(f"unknown option {key}: the {self.name} engine takes no settings")
        return None

    # -- which rechunks -----------------------------------------------------------------

    def refuses(self, request: Request) -> str | None:
        """Why it cannot run this rechunk at all (the run fails with it when the engine is named):
        by default, chunks of a type outside `chunk_types`."""
        if request.chunk_type not in self.chunk_types:
            return f"{request.chunks}: the {self.name} engine moves {', '.join(self.chunk_types)} chunks only"
        return None

    def declines(self, request: Request) -> str | None:
        """Why ``auto`` does not take it for this rechunk, decided without asking the workers."""
        return None

    def declines_unasked(self, request: Request) -> str | None:
        """`declines`, said where the workers were not asked yet (the scheduler asks only where the
        answer changes the choice): in words true of any cluster. By default `declines`."""
        return self.declines(request)

    def unable(self, answers: dict[str, dict], request: Request) -> str | None:
        """Why ``auto`` cannot take it on these workers, from what each answered (``answers``:
        worker -> its ``Engine.capabilities()``, ``{}`` where it gave none)."""
        bad = [w for w, a in answers.items() if not a.get("ok")]
        if not bad:
            return None
        return f"{self.name} cannot run on {bad[0]}: {answers[bad[0]].get('reason', 'no answer')}"

    def cannot_form(self, answers: dict[str, dict]) -> str | None:
        """Why it cannot run over these workers at all, from what each answered (``answers`` as
        for `unable`, each with the worker's ``host``): a run is refused before it starts, also
        when the engine is named in ``redist.engine``, and ``auto`` passes it over."""
        return None

    def chosen(self, request: Request, passed_over: list[str]) -> str:
        """Why ``auto`` took it: ``passed_over`` says why each engine preferred to it did not."""
        return passed_over[0] if passed_over else f"{request.chunks}: the most preferred engine"

    def cannot_start(self, broken: str) -> str:
        """Why ``auto`` passes it over after a run could not start (``broken``: the failure)."""
        if self.world:
            return f"{self.world_name} needs a new bootstrap ({broken}); see dask_redist.bootstrap"
        return f"{self.name} could not start ({broken}); see dask_redist.bootstrap"

    def world_changed(self) -> str:
        return f"the worker set changed since {self.world_name} was bootstrapped; see dask_redist.bootstrap"

    # -- explain, doctor, bootstrap ---------------------------------------------------------

    def mapping(self, plan: Plan, settings: Settings) -> tuple[str, int, int]:
        """``explain``'s mapping line for ``plan``, its padding bytes and rounds."""
        return f"{self.name}: pieces of the plan", 0, 1

    def worker_report(self) -> dict:
        """What ``doctor`` shows of this worker for the engine (runs on the worker)."""
        return {}

    def doctor_columns(self, report: dict) -> dict:
        """Columns of a worker's row in ``doctor`` (``report``: `worker_report` and ``capabilities``)."""
        able = report.get("capabilities", {})
        return {self.name: "ok" if able.get("ok") else able.get("reason", "no answer")}

    def doctor_line(self, reports: dict[str, dict]) -> str:
        """``doctor``'s line for the engine over every worker's report."""
        bad = [w for w, r in sorted(reports.items()) if not r.get("capabilities", {}).get("ok")]
        if not bad:
            return "runs on every worker"
        return f"not on {len(bad)} of {len(reports)} workers ({bad[0]}: {reports[bad[0]]['capabilities'].get('reason')})"

    def doctor_notes(self, reports: dict[str, dict]) -> tuple[list[str], list[str]]:
        """(warnings, fixes) ``doctor`` prints for the engine."""
        return [], []

    def bootstrap_input(self, client):
        """(array, new chunks, expected values) of the small rechunk that starts its world, or None."""
        return None
