"""What the soak's kill step asks of the cluster: a worker killed once the scheduler holds the
rechunk, its nanny's new process awaited, and on GPUs the world re-formed as users are told to.

Each returns what went wrong as a problem (a string) rather than raising: the step goes on to
bring the cluster back for the next one.
"""

from __future__ import annotations

import os
import signal
import time

from dask.core import flatten
from distributed import Future

from dask_redist.bench.watch import within
from dask_redist.compat import worker_info


def until_submitted(client, y, limit: float) -> str | None:
    """Until the scheduler holds the graph of ``y`` (a collection, or a Future): ``persist`` sends it on the client's stream,
    while a kill goes by another comm and could overtake it. A rechunk whose graph reaches the
    scheduler only after a worker died was submitted after the death (on an engine the user
    forced, a world that lost a PE then refuses it with the remedy): not a kill during a rechunk."""
    key = y.key if isinstance(y, Future) else next(iter(flatten(y.__dask_keys__())))
    deadline = time.monotonic() + limit
    while not client.run_on_scheduler(_holds, key):
        if time.monotonic() > deadline:
            return f"the scheduler did not receive the graph within {limit:g}s"
        time.sleep(0.01)
    return None


def kill(client, victim: str) -> None:
    """SIGKILL the process of worker ``victim`` (its nanny starts another)."""
    client.run(_die, workers=[victim], wait=False)


def wait_for_replacement(client, victim: str, n: int, limit: float) -> str | None:
    """Until the killed worker is gone from the scheduler and its nanny's new process joined.

    On a loaded machine a restart can take many seconds: that is slow, not lost; this waits
    (up to ``limit``) rather than let the next step start with the dead worker still listed,
    which it would count as "left that was not killed"."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        workers = worker_info(client)
        if victim not in workers and len(workers) >= n:
            return None
        time.sleep(0.2)
    return f"the nanny of killed worker {victim} did not bring a new one within {limit:g}s"


def reform_world(client, ask_s: float) -> list[str]:
    """After a kill on GPUs the survivors are stranded in a world that lost a PE: do what a user
    is told to, ``bootstrap(restart_broken=True)``; the workers it restarted (exited by design).
    Nothing where no world lost a member (the runs took an engine without one, as across hosts
    that no world can span): there a bootstrap would be refused."""
    import dask_redist
    from dask_redist.config import Settings

    records = dask_redist.status(client)["engines"]["records"]
    if not any(r.get("stranded") for r in records.values()):
        return []
    before = set(worker_info(client))
    limit = 2 * Settings.from_config().bootstrap_timeout + ask_s
    within(limit, dask_redist.bootstrap, client, restart_broken=True)
    return sorted(before - set(worker_info(client)))


def _holds(key, dask_scheduler=None) -> bool:
    return key in dask_scheduler.tasks


async def _die() -> None:  # a coroutine: Client.run(wait=False) takes only those
    os.kill(os.getpid(), signal.SIGKILL)
