"""Engines: the same plan, different transports.

An engine executes one rank's part of a run (`dask_redist._run.WorkerRun`)
on the worker's collective thread. ``dask`` moves pieces over Dask's own comms
(TCP or UCX, NumPy or CuPy); ``cufftmp`` moves them GPU to GPU through NVSHMEM
with one cuFFTMp reshape per round. ``redist.engine`` also accepts
``"package.module:EngineClass"`` for an engine of your own.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dask_redist._run import WorkerRun

_BUILTIN = {
    "dask": "dask_redist.engines.dask:DaskEngine",
    "cufftmp": "dask_redist.engines.cufftmp:CufftMpEngine",
}
_instances: dict[str, Engine] = {}


class Transport(Protocol):
    """How an engine reaches the other ranks of a run (injected, so tests can fake it)."""

    def send(self, batches: list) -> None:
        """Deliver ``(dst_rank, first, Packed)`` batches; raise on failure or timeout."""


class Engine(Protocol):
    name: str

    def execute(self, run: WorkerRun, transport: Transport) -> None:
        """Move this rank's pieces and finish ``run`` with its output chunks."""

    # optional: ``abandoned(run)``, told when ``run`` was aborted but ``execute`` has not
    # returned and later runs go on without it (a GPU engine cannot be trusted any more);
    # ``stuck``, true once work of an aborted run can never finish in this process
    # (the worker then exits, see redist.nvshmem.exit-when-stuck); ``in_flight_since``,
    # when the run's first work that only its peers can complete was queued (None when
    # there is none): a watchdog ends the process if ``execute`` blocks behind that work


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
        return "dask", "NumPy chunks"
    bad = [w for w in workers if not capabilities.get(w, {}).get("cufftmp", {}).get("ok")]
    if bad:
        why = capabilities.get(bad[0], {}).get("cufftmp", {}).get("reason", "no answer")
        return "dask", f"cufftmp unusable on {bad[0]}: {why}"
    if world_broken:
        return "dask", f"NVSHMEM needs a new bootstrap ({world_broken}); see dask_redist.bootstrap"
    if world is not None and tuple(world) != tuple(workers):
        return "dask", "the worker set changed since NVSHMEM was bootstrapped; see dask_redist.bootstrap"
    return "cufftmp", "CuPy chunks, and every worker can run cuFFTMp over NVSHMEM"


def get_engine(name: str) -> Engine:
    """The engine called ``name`` (one instance per process: engines keep caches)."""
    if name not in _instances:
        path = _BUILTIN.get(name, name)
        module, _, attr = path.partition(":")
        if not attr:
            raise ValueError(f"unknown engine {name!r}: expected one of {sorted(_BUILTIN)} or 'module:Class'")
        _instances[name] = getattr(importlib.import_module(module), attr)()
    return _instances[name]
