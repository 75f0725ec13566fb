"""The cuFFTMp reshape plans of one engine: made once per geometry, kept for later runs, bounded.

Making a reshape plan is collective (every PE calls ``cufftMpMakeReshape`` in the same
order) and costs tens of milliseconds, so plans are kept across runs, keyed by the
geometry of every rank (the key is the same on every rank). A session of many different
rechunks made one plan per new geometry without a bound (docs/benchmarks.md, "Figures
moved out of the code"); at most `RESHAPE_PLANS_KEPT` are kept, the least recently used destroyed first, at
the end of a run when no GPU work uses them. Every rank of a world runs the same runs in
the same order and so keeps and destroys the same plans.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

#: Reshape plans kept for later runs (see the module docstring).
RESHAPE_PLANS_KEPT = 64


@dataclass
class ReshapePlan:
    handle: int
    workspace: int


class Plans:
    """Geometry -> `ReshapePlan`, least recently used first; ``stats`` counts plans made and seconds."""

    def __init__(self, stats: dict):
        self._plans: OrderedDict = OrderedDict()
        self.stats = stats

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key, make: Callable[[], ReshapePlan]) -> ReshapePlan:
        """The plan for ``key``, made by ``make()`` the first time."""
        if key in self._plans:
            self._plans.move_to_end(key)
        else:
            start = time.perf_counter()
            self._plans[key] = make()
            self.stats["plans"] += 1
            self.stats["plan_s"] += time.perf_counter() - start
        return self._plans[key]

    def forget(self, kept: int | None = None) -> None:
        """Destroy the least recently used plans beyond ``kept`` (default `RESHAPE_PLANS_KEPT`; 0: all)."""
        from nvmath.bindings import cufftMp

        kept = RESHAPE_PLANS_KEPT if kept is None else kept
        while len(self._plans) > kept:
            _, plan = self._plans.popitem(last=False)
            cufftMp.destroy_reshape(plan.handle)
