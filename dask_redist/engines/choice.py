"""The scheduler's side of the engines: what every worker can run, and the engine of each run.

`EngineSelector` is what the scheduler plugin holds of engines: the capabilities each
worker reported (``Engine.capabilities``, asked once per worker), the record of the
NVSHMEM world (`dask_redist.engines.description.WorldRecord`), and `choose_engine`,
the pure rule ``redist.engine: auto`` follows (``explain`` applies the same rule).

NumPy chunks go through the GPUs under ``auto`` from ``redist.numpy-via-gpus`` bytes on
(`numpy_stays_on_host`), where every worker can run cufftmp. On ONE H200 (where the dask
engine sends nothing over the network) the GPU path won from 32 MiB up, the smallest size
measured; the default (256 MiB) is higher because a session's first GPU run bootstraps
NVSHMEM and reserves its heap on every GPU (docs/benchmarks.md, "Where `auto` starts
taking NumPy chunks through the GPUs").
"""

from __future__ import annotations

from dask.utils import format_bytes

from dask_redist.config import Settings
from dask_redist.core.spec import CollectiveSpec
from dask_redist.engines.cufftmp.host import host_dtype_problem
from dask_redist.engines.description import WorldRecord

#: What ``choose_engine`` is told about NumPy chunks when nobody asked ``numpy_stays_on_host``.
NUMPY_ON_HOST = "NumPy chunks (redist.engine=cufftmp takes them through the GPUs)"


def numpy_stays_on_host(settings: Settings, nbytes: int, dtype) -> str | None:
    """Why ``auto`` keeps a NumPy rechunk of ``nbytes`` on the dask engine, or None where it may
    go through the GPUs (if every worker can run cufftmp: `choose_engine` decides that)."""
    limit = settings.numpy_via_gpus
    if limit is None:
        return "NumPy chunks (redist.numpy-via-gpus is false)"
    if nbytes < limit:
        return f"NumPy chunks, {format_bytes(nbytes)} is below redist.numpy-via-gpus ({format_bytes(limit)})"
    if host_dtype_problem(dtype):
        return f"NumPy chunks of {dtype}, which only the dask engine moves"
    return None


def choose_engine(
    setting: str,
    kind: str,
    capabilities: dict,
    workers,
    world=None,
    world_broken: str | None = None,
    numpy_reason: str | None = NUMPY_ON_HOST,
) -> tuple[str, str]:
    """The engine for a run over ``workers`` and why: ``auto`` takes cufftmp for CuPy chunks where
    it can, and for NumPy chunks where ``numpy_reason`` (`numpy_stays_on_host`) is None too.

    ``capabilities`` maps each worker to what it reported (``{"cufftmp": {"ok": ..., "reason": ...}}``);
    ``world`` is the worker set NVSHMEM was bootstrapped over, ``world_broken`` why it can no longer be used.
    """
    if setting != "auto":
        return setting, "set by redist.engine"
    if kind != "cupy" and numpy_reason:
        return "dask", numpy_reason
    bad = [w for w in workers if not capabilities.get(w, {}).get("cufftmp", {}).get("ok")]
    if bad:
        why = capabilities.get(bad[0], {}).get("cufftmp", {}).get("reason", "no answer")
        return "dask", f"cufftmp unusable on {bad[0]}: {why}"
    if world_broken:
        return "dask", f"NVSHMEM needs a new bootstrap ({world_broken}); see dask_redist.bootstrap"
    if world is not None and tuple(world) != tuple(workers):
        return "dask", "the worker set changed since NVSHMEM was bootstrapped; see dask_redist.bootstrap"
    if kind != "cupy":
        return "cufftmp", "NumPy chunks of at least redist.numpy-via-gpus, and every worker can run cuFFTMp: through the GPUs"
    return "cufftmp", "CuPy chunks, and every worker can run cuFFTMp over NVSHMEM"


def _numpy_reason(spec: CollectiveSpec, kind: str) -> str | None:
    return numpy_stays_on_host(spec.settings, spec.rechunk.nbytes, spec.dtype) if kind != "cupy" else None


class EngineSelector:
    """Capabilities of the workers, the NVSHMEM world, and the choice of engine per run."""

    def __init__(self):
        self.capabilities: dict[str, dict] = {}  # worker -> {engine name: {"ok": ..., "reason": ...}}
        self.world = WorldRecord()

    def needs_probe(self, spec: CollectiveSpec, kind: str, workers) -> list[str]:
        """Workers whose capabilities the choice for ``spec`` needs and nobody asked yet."""
        if spec.settings.engine != "auto" or (kind != "cupy" and _numpy_reason(spec, kind)):
            return []
        return [w for w in workers if w not in self.capabilities]

    def learn(self, answers: dict) -> None:
        """Capabilities as workers answered (anything but a dict: no answer, asked again next time)."""
        self.capabilities.update({w: a for w, a in answers.items() if isinstance(a, dict)})

    def choose(self, spec: CollectiveSpec, kind: str, workers) -> tuple[str, str]:
        """The engine for a run of ``spec`` over ``workers``, whose staged chunks are of ``kind``."""
        return choose_engine(
            spec.settings.engine,
            kind,
            self.capabilities,
            workers,
            self.world.members,
            self.world.broken,
            _numpy_reason(spec, kind),
        )

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
