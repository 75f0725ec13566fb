"""What the soak records: a step (what ran, how long, its problems) and the report of a whole soak."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Step:
    index: int
    kind: str
    case: str
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    cancelled_by_dask: int = 0  # re-submits Dask cancelled right after a cancel (not a problem)
    engines: list[str] = field(default_factory=list)  # the engine of each collective run the step ended
    memory_delta: int = 0  # bytes the workers alive before and after the step grew by, together
    killed: list[str] = field(default_factory=list)  # the worker the step killed
    exited: list[str] = field(
        default_factory=list
    )  # GPU peers of a killed worker that exited or were restarted

    def line(self) -> str:
        """One line for the soak's progress: what ran, on which engines, how long, its problems."""
        engines = ",".join(sorted(set(self.engines))) or "-"
        outcome = "; ".join(self.problems) if self.problems else "ok"
        return f"step {self.index:4d} {self.kind:8s} {self.seconds:7.2f}s  engines {engines:13s} {self.case}: {outcome}"


@dataclass
class SoakReport:
    seed: int
    steps: list[Step] = field(default_factory=list)
    memory: dict[str, list[int]] = field(default_factory=dict)  # worker -> process memory after each step

    @property
    def problems(self) -> list[str]:
        return [f"step {s.index} ({s.kind}, {s.case}): {p}" for s in self.steps for p in s.problems]
