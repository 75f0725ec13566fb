"""A finished run's outputs on a paused worker, whose unpack tasks never start.

distributed pauses a worker whose process memory is over ``distributed.worker.memory.pause`` (a
fraction of its memory limit) and starts no task there until it is below again. It spills what Dask
holds to get there, but the outputs a finished run keeps for the unpack tasks pinned to the worker
are memory it cannot spill: paused with them, the worker would wait for good, and the user's
computation with it (plain Dask's tasks end such a case with ``KilledWorker``). So while a run's
outputs wait on a worker, the worker is watched: paused `PAUSED_S` (or a collective timeout,
``redist.timeouts.collective``, where that is shorter), the run fails with an error saying so, the scheduler fails the
unpack tasks that cannot start (`lifecycle.Rechunks.abort`), and the outputs are dropped.
"""

from __future__ import annotations

import time

from dask.utils import format_bytes
from distributed.core import Status

from dask_redist.core.run import WorkerRun
from dask_redist.errors import RedistError

CHECK_S = 1.0  # how often a worker holding a finished run's outputs is looked at (at most)
#: how long such a worker may stay paused: spilling what Dask holds takes it below the pause
#: threshold in seconds where it can, and the unpack tasks then run (the collective timeout's
#: default, minutes, is for a wait on peers)
PAUSED_S = 30.0


def watch(worker, run: WorkerRun, fail) -> None:
    """From when ``run`` is done on ``worker`` until its outputs there are taken: ``fail(run,
    error)`` if the worker stays paused `PAUSED_S` meanwhile (a collective timeout where shorter)."""
    paused_since, wait = None, min(PAUSED_S, run.timeout)

    def check() -> None:
        nonlocal paused_since
        if run.state != "done" or not run.outputs:
            return
        if worker.status != Status.paused:
            paused_since = None
        elif paused_since is None:
            paused_since = time.monotonic()
        elif time.monotonic() - paused_since >= wait:
            fail(run, paused_error(worker, run, wait))
            return
        worker.loop.call_later(min(CHECK_S, wait / 4), check)

    run.when_finished(lambda: worker.loop.add_callback(check))


def paused_error(worker, run: WorkerRun, wait: float) -> RedistError:
    outputs = list(run.outputs.values())
    held = format_bytes(sum(int(getattr(o, "nbytes", 0)) for o in outputs))
    manager = worker.memory_manager
    limit = format_bytes(manager.memory_limit) if manager.memory_limit else "no limit"
    pause = manager.memory_pause_fraction
    at = f"{pause:.0%} of its memory_limit, {limit}" if pause else "off on this worker: paused by hand?"
    return RedistError(
        f"{run.name()}: worker {worker.address} was paused for {wait:g}s holding {len(outputs)} "
        f"output chunks ({held}) of the finished run, which Dask cannot spill; a paused worker starts "
        f"no task, so their unpack tasks could not take them. distributed pauses a worker whose process "
        f"memory is over distributed.worker.memory.pause ({at}): give the workers more memory, or rechunk less at once"
    )
