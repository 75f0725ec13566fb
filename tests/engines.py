"""Engines for fault-injection tests, selected with ``redist.engine="engines:SlowEngine"``."""

from __future__ import annotations

import time

from dask_redist.engines.dask import DaskEngine


class SlowEngine(DaskEngine):
    """The dask engine, after a pause: a window to kill a worker mid-exchange."""

    pause = 3.0

    def execute(self, run, transport):
        run.set_phase("exchange")
        deadline = time.monotonic() + self.pause
        while time.monotonic() < deadline and run.state != "failed":
            time.sleep(0.05)
        super().execute(run, transport)


class StallingEngine(DaskEngine):
    """The last rank never sends (until the run is aborted): the others must time out."""

    def execute(self, run, transport):
        if run.rank == len(run.spec.workers) - 1:
            run.set_phase("stalled")
            deadline = time.monotonic() + 120
            while run.state != "failed" and time.monotonic() < deadline:
                time.sleep(0.05)
            run.set_phase("stalled")  # raises the abort error
        super().execute(run, transport)


class FailingEngine(DaskEngine):
    """Rank 0 raises at once: the others must be released without waiting for a timeout."""

    def execute(self, run, transport):
        if run.rank == 0:
            raise ValueError("injected failure on rank 0")
        super().execute(run, transport)


class UnavailableEngine(DaskEngine):
    """Every rank refuses to start, as cufftmp does when NVSHMEM's heap cannot fit the GPU."""

    def execute(self, run, transport):
        from dask_redist.errors import EngineUnavailableError

        raise EngineUnavailableError(f"{run.name()}: cannot start here: set redist.injected-key lower")
