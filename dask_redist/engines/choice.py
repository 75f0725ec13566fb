"""The scheduler's side of the engines: what every worker can run, and the engine of each run.

`choose_engine` is the one rule of ``redist.engine: auto``; the scheduler (`EngineSelector`),
``explain`` and ``doctor`` all ask it. It tries the engines of ``redist.engines`` from the
most preferred down (`dask_redist.engines.registry.descriptions`) and takes the first that
takes the rechunk; each description says why it does not (`dask_redist.engines.description`),
and the engine taken says why it was, from those reasons.

`EngineSelector` is what the scheduler plugin holds of engines: the capabilities each worker
reported (``Engine.capabilities``, asked once per worker and engine, and only where the answer
matters: `needs_probe`), and a `WorldRecord` per engine (the world it was started over, why
it can no longer be used).
"""

from __future__ import annotations

from dask_redist.config import Settings
from dask_redist.engines.description import EngineDescription, Request, WorldRecord
from dask_redist.engines.registry import description, descriptions
from dask_redist.errors import RedistError

#: `_passed_over`'s answer where the workers were not asked yet
UNASKED = "(the workers were not asked)"


def _answers(d: EngineDescription, capabilities: dict, workers) -> dict[str, dict]:
    return {w: capabilities.get(w, {}).get(d.name, {}) for w in workers}


def _passed_over(
    d: EngineDescription, request: Request, capabilities: dict | None, workers, record
) -> str | None:
    """Why ``auto`` does not take ``d`` (`UNASKED` where that depends on workers not asked), or None.

    What the workers answered comes first where every one did: on workers without GPUs the
    reason says so, not a threshold that only matters with GPUs; where they were not asked,
    the reason is in words true of any cluster (`EngineDescription.declines_unasked`; without a
    Client, what the rule alone says)."""
    known = (
        capabilities is not None and bool(workers) and all(d.name in capabilities.get(w, {}) for w in workers)
    )
    if d.probes and known and (why := d.unable(_answers(d, capabilities, workers), request)):
        return why
    unasked = d.probes and not known and capabilities is not None
    if why := (d.declines_unasked(request) if unasked else d.declines(request)) or d.refuses(request):
        return why
    if d.probes and not known:
        return UNASKED
    if record is not None and record.broken:
        return d.cannot_start(record.broken)
    if (
        d.world
        and record is not None
        and record.members is not None
        and tuple(record.members) != tuple(workers)
    ):
        return d.world_changed()
    return None


def untrusts_world(d: EngineDescription, failure: str) -> bool:
    """Whether a run of engine ``d`` that failed so (a `dask_redist.errors.FAILURES` name) leaves
    the engine's world not to be trusted: any failure of a world engine's run but one refused
    alike on every rank before anything moved."""
    return d.world and failure != "refused"


def passed_over_from_now_on(d: EngineDescription, why: str) -> str:
    """What a failure (``why``) that leaves engine ``d`` unusable means for later rechunks."""
    return f"later rechunks under redist.engine: auto pass {d.name} over: {d.cannot_start(why)}"


def choose_engine(
    request: Request, capabilities: dict | None, workers, records: dict[str, WorldRecord] | None = None
) -> tuple[str, str]:
    """The engine for a run over ``workers`` and why.

    ``capabilities``: worker -> {engine name: what it answered} (a worker or engine missing: no
    answer), or None where nobody can be asked (``explain`` without a Client: an engine that
    needs the answer is taken "if every worker can run it"). ``records``: engine name -> its
    `WorldRecord` on the scheduler.
    """
    setting = request.settings.engine
    if setting != "auto":
        return setting, "set by redist.engine"
    passed_over = []
    for d in descriptions(request.settings):
        if d.preference is None:
            continue
        why = _passed_over(d, request, capabilities, workers, (records or {}).get(d.name))
        if why == UNASKED and capabilities is None:
            return d.name, "if every worker can run it; no Client to ask"
        if why is None:
            return d.name, d.chosen(request, passed_over)
        passed_over.append(why if why != UNASKED else f"{d.name}: the workers gave no answer")
    raise RedistError(
        f"no engine of redist.engines takes this rechunk under redist.engine: auto: {'; '.join(passed_over)}"
    )


def cannot_run(request: Request, capabilities: dict | None, workers) -> str | None:
    """Why the engine named in ``redist.engine`` cannot run ``request`` on ``workers``, with the
    remedy, from what they answered (``capabilities`` as for `choose_engine`); None where it can,
    where nobody was asked, or under ``auto`` (which picks an engine every worker runs)."""
    name = request.settings.engine
    if name == "auto" or capabilities is None or not workers:
        return None
    d = description(name, request.settings)
    answers = _answers(d, capabilities, workers)
    if all(a.get("ok") for a in answers.values()):
        why = d.refuses(request)
    else:
        why = d.unable(answers, request)
    if why is None:
        return None
    return (
        f"redist.engine is {name!r}, which cannot run this rechunk: {why}. Set redist.engine to auto "
        "(it picks an engine every worker runs) or to an engine the workers have; `dask-redist doctor` "
        "shows what each worker can run"
    )


def needs_probe(request: Request, capabilities: dict, workers, records: dict | None = None) -> list[str]:
    """Workers the choice for ``request`` must ask first: those that never said whether they can
    run the most preferred engine that is not passed over without asking (none where that engine
    needs no answer); under an engine named in ``redist.engine`` that probes, those that never
    answered for it (whether it can run over them at all: `EngineSelector.refusal`)."""
    if request.settings.engine != "auto":  # (named: asked whether it can run over them at all)
        d = description(request.settings.engine, request.settings)
        return [w for w in workers if d.name not in capabilities.get(w, {})] if d.probes else []
    for d in descriptions(request.settings):
        if d.preference is None:
            continue
        why = _passed_over(d, request, capabilities, workers, (records or {}).get(d.name))
        if why == UNASKED:
            return [w for w in workers if d.name not in capabilities.get(w, {})]
        if why is None:
            return []
    return []


def recovery_engine(settings: Settings) -> str:
    """The engine a run recovers on where the engine chosen cannot finish it: the most preferred
    engine whose description says it runs wherever Dask does (`EngineDescription.recovery`)."""
    for d in descriptions(settings):
        if d.recovery:
            return d.name
    raise RedistError("no engine of redist.engines can finish a recovery (EngineDescription.recovery)")


def fft_engines(settings: Settings) -> dict[str, tuple[str, ...]]:
    """The engines of ``redist.engines`` that run distributed FFTs, most preferred first, and the
    chunk types each runs them on (`EngineDescription.fft_chunk_types`)."""
    return {d.name: d.fft_chunk_types for d in descriptions(settings) if d.fft_chunk_types}


class EngineSelector:
    """Capabilities of the workers, each engine's record, and the choice of engine per run."""

    def __init__(self):
        self.capabilities: dict[str, dict] = {}  # worker -> {engine name: {"ok": ..., "reason": ...}}
        self.records: dict[str, WorldRecord] = {}  # engine name -> its world, or why it cannot start

    def record(self, engine: str) -> WorldRecord:
        return self.records.setdefault(engine, WorldRecord())

    def needs_probe(self, request: Request, workers) -> list[str]:
        """Workers whose capabilities the choice for ``request`` needs and nobody asked yet."""
        return needs_probe(request, self.capabilities, workers, self.records)

    def learn(self, answers: dict) -> None:
        """Capabilities as workers answered (anything but a dict: no answer, asked again next time)."""
        for w, a in answers.items():
            if isinstance(a, dict):
                self.capabilities.setdefault(w, {}).update(a)

    def choose(
        self, request: Request, workers, restarting: bool = False, token: str | None = None
    ) -> tuple[str, str]:
        """The engine for a run of ``request`` (rechunk ``token``) over ``workers``.

        A recovery finishes on the recovery engine (`recovery_engine`) where the engine chosen would need workers stranded
        in the world that lost a worker, even where that engine is named in ``redist.engine``:
        nothing the user asked for is lost to it. A recovery is a run restarted after a worker left
        (``restarting``), or the first run of a rechunk submitted before the world lost its worker
        (Dask recomputes what the dead worker held, and the barrier comes after). A rechunk
        submitted later is refused instead (`refusal`), with the remedy.
        """
        engine, reason = choose_engine(request, self.capabilities, workers, self.records)
        if not (stranded := self.stranded(engine, workers)):
            return engine, reason
        if restarting or token in self.record(engine).recovering:
            world = description(engine, request.settings).world_name
            recovery = recovery_engine(request.settings)
            return recovery, (
                f"{stranded} are stranded in the {world} world that lost a worker while this rechunk was under "
                f"way, so the {recovery} engine finishes it ({engine} again once "
                "dask_redist.bootstrap(client, restart_broken=True) re-formed the world)"
            )
        return engine, reason

    def stranded(self, engine: str, workers) -> list[str]:
        """Those of ``workers`` stranded in ``engine``'s world (it lost a member)."""
        record = self.records.get(engine)
        return sorted(set(record.stranded) & set(workers)) if record is not None else []

    def refusal(self, engine: str, request: Request, workers) -> str | None:
        """Why a run of ``request`` on ``engine`` over ``workers`` must not start, or None: what the
        engine refuses, workers it cannot run over at all (``cannot_form``: their hosts, from their
        answers), or workers stranded in its world.

        Stranded workers cannot leave their world (NVSHMEM's frees and finalize wait for the dead
        PE, holding the process): asked to form a new one they would never return. ``auto``
        passes such an engine over; named in ``redist.engine`` it is refused here, with the remedy.
        """
        d = description(engine, request.settings)
        if problem := d.refuses(request):
            return problem
        answers = _answers(d, self.capabilities, workers)
        if d.probes and all(answers.values()) and (why := d.cannot_form(answers)):
            return (
                f"redist.engine is {engine}, but {engine} cannot run over these workers: {why} "
                "(redist.engine: auto runs such rechunks on another engine)"
            )
        if not (stranded := self.stranded(engine, workers)):
            return None
        return (
            f"redist.engine is {engine}, but workers {stranded} are stranded in a {d.world_name} world that cannot "
            f"be left ({self.records[engine].broken}). Call dask_redist.bootstrap(client, restart_broken=True) to "
            "restart them (their data is lost), or restart them yourself; meanwhile redist.engine: auto runs "
            "such rechunks on another engine"
        )

    def run_started(self, engine: str, settings: Settings, workers) -> None:
        d = description(engine, settings)
        if d.world:  # the workers start a world over this set if they have not yet
            self.record(engine).members = tuple(workers)
            self.record(engine).world_name = d.world_name

    def run_failed(self, engine: str, settings: Settings, failure: str, why: str) -> str | None:
        """A rank of a run failed: an engine that could not start (``failure`` "unavailable",
        checked before anything started: ``bootstrap`` may try again once fixed), or a run of an
        engine with a world that failed on a rank (that world cannot be trusted any more), unless
        the engine refused the run alike on every rank before anything moved (``refused``).

        Returns what this means for later rechunks where the engine was usable until now (for
        the scheduler's log; each rank's error says it too), else None."""
        d = description(engine, settings)
        if failure != "unavailable" and not untrusts_world(d, failure):
            return None
        record = self.record(engine)
        news = record.broken is None
        record.broken = why  # auto passes it over from now on, with this reason
        return passed_over_from_now_on(d, why) if news else None

    def worker_left(self, worker: str, under_way=()) -> None:
        """``worker`` left; ``under_way``: the rechunks (tokens) submitted by then (`choose`)."""
        self.capabilities.pop(worker, None)
        for record in self.records.values():
            record.worker_left(worker, under_way)

    def forget(self, engine: str | None = None) -> None:
        """The next run of ``engine`` (every engine: None) starts afresh: its world, or its failure to start."""
        for name, record in self.records.items():
            if engine is None or name == engine:
                record.forget()

    def state(self) -> dict:
        """For ``dask_redist.status`` and ``explain``: what the choice depends on."""
        return {
            "capabilities": {w: dict(a) for w, a in self.capabilities.items()},
            "records": {name: record.state() for name, record in self.records.items()},
        }
