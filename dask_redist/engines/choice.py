"""The scheduler's side of the engines: what every worker can run, and the engine of each run.

`EngineSelector` is what the scheduler plugin holds of engines: the capabilities each
worker reported (``Engine.capabilities``, asked once per worker), the record of the
NVSHMEM world (`dask_redist.engines.cufftmp.world.WorldRecord`), and `choose_engine`,
the pure rule ``redist.engine: auto`` follows (``explain`` applies the same rule).
"""

from __future__ import annotations

from dask_redist.engines.cufftmp.world import WorldRecord


def choose_engine(
    setting: str, kind: str, capabilities: dict, workers, world=None, world_broken: str | None = None
) -> tuple[str, str]:
    """The engine for a run over ``workers`` and why: ``auto`` takes cufftmp for CuPy chunks where it can.

    ``capabilities`` maps each worker to what it reported (``{"cufftmp": {"ok": ..., "reason": ...}}``);
    ``world`` is the worker set NVSHMEM was bootstrapped over, ``world_broken`` why it can no longer be used.
    """
    if setting != "auto":
        return setting, "set by redist.engine"
    if kind != "cupy":
        # through the GPUs on request only (redist.engine=cufftmp): not measured on 2 GPUs yet
        return "dask", "NumPy chunks (redist.engine=cufftmp takes them through the GPUs)"
    bad = [w for w in workers if not capabilities.get(w, {}).get("cufftmp", {}).get("ok")]
    if bad:
        why = capabilities.get(bad[0], {}).get("cufftmp", {}).get("reason", "no answer")
        return "dask", f"cufftmp unusable on {bad[0]}: {why}"
    if world_broken:
        return "dask", f"NVSHMEM needs a new bootstrap ({world_broken}); see dask_redist.bootstrap"
    if world is not None and tuple(world) != tuple(workers):
        return "dask", "the worker set changed since NVSHMEM was bootstrapped; see dask_redist.bootstrap"
    return "cufftmp", "CuPy chunks, and every worker can run cuFFTMp over NVSHMEM"


class EngineSelector:
    """Capabilities of the workers, the NVSHMEM world, and the choice of engine per run."""

    def __init__(self):
        self.capabilities: dict[str, dict] = {}  # worker -> {engine name: {"ok": ..., "reason": ...}}
        self.world = WorldRecord()

    def needs_probe(self, setting: str, kind: str, workers) -> list[str]:
        """Workers whose capabilities the choice needs and nobody asked yet."""
        if setting != "auto" or kind != "cupy":
            return []
        return [w for w in workers if w not in self.capabilities]

    def learn(self, answers: dict) -> None:
        """Capabilities as workers answered (anything but a dict: no answer, asked again next time)."""
        self.capabilities.update({w: a for w, a in answers.items() if isinstance(a, dict)})

    def choose(self, setting: str, kind: str, workers) -> tuple[str, str]:
        return choose_engine(setting, kind, self.capabilities, workers, self.world.members, self.world.broken)

    def run_started(self, engine: str, workers) -> None:
        if engine == "cufftmp":
            self.world.members = tuple(workers)  # the workers bootstrap over this set if they have not yet

    def run_failed(self, engine: str, unavailable: bool, why: str) -> None:
        """A rank of a run failed: an engine that could not start (checked before NVSHMEM started:
        bootstrap may try again once fixed), or a cufftmp run that failed on a rank."""
        if unavailable:
            self.world.broken = why  # choose() answers "dask" from now on, with this reason
        elif engine == "cufftmp":
            self.world.broken = why

    def worker_left(self, worker: str) -> None:
        self.capabilities.pop(worker, None)
        self.world.worker_left(worker)

    def state(self) -> dict:
        """For ``dask_redist.status`` and ``explain``: what the choice depends on."""
        return {
            "capabilities": dict(self.capabilities),
            "world": list(self.world.members) if self.world.members is not None else None,
            "world broken": self.world.broken,
            "stranded": list(self.world.stranded),
        }
