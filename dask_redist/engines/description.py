"""The scheduler's side of an engine.

`WorldRecord`: the scheduler's record of an engine's *world*, the set of workers it was
started over (NVSHMEM's, for cufftmp: `dask_redist.engines.cufftmp.world`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WorldRecord:
    """The scheduler's record of an engine's world (NVSHMEM's: `dask_redist.engines.cufftmp.world`)."""

    members: tuple[str, ...] | None = None  # the workers NVSHMEM was bootstrapped over
    broken: str | None = None  # why the world cannot be used any more
    # members of a world that lost a PE: NVSHMEM's finalize waits for the dead PE forever
    # (measured on the node), so these processes cannot join a new world until restarted
    stranded: list[str] = field(default_factory=list)

    def forget(self) -> None:
        """The next cufftmp run bootstraps NVSHMEM over the workers of that moment."""
        self.members, self.broken, self.stranded = None, None, []

    def worker_left(self, worker: str) -> None:
        if self.members is not None and worker in self.members:
            self.broken = f"worker {worker} left the NVSHMEM world"
            self.stranded = sorted(set(self.members) - {worker})
