"""Survivors of an NVSHMEM world that lost a PE: refused at once, never asked to leave it.

NVSHMEM's frees and finalize wait for every PE of the world; in a survivor whose peer died they
never return and hold the process (seen on the GPU node: a soak with `redist.engine: cufftmp`
stalled for minutes after its first kill). So the scheduler refuses cufftmp runs over stranded
workers with the remedy, and each worker's engine, told that a member of its world left,
refuses to touch that world again. On CPU the world is pretended (the scheduler's record, the
engine's members), and so is the workers' answer that they can run cufftmp (else it is refused
at submission, tests/test_unrunnable_engine.py); the messages and refusals are the real ones.
"""

from __future__ import annotations

import os
import signal
import time

import dask.array as da
import numpy as np
import pytest
from conftest import local_cluster, scheduler_history, wait_for_active_run
from distributed import Client

import dask_redist
from dask_redist.engines.cufftmp.world import World
from dask_redist.errors import RedistError


@pytest.fixture
def own_cluster():
    with local_cluster(3) as cluster, Client(cluster) as client:
        client.wait_for_workers(3)
        yield client


def _pretend_world_on_scheduler(dask_scheduler):
    _pretend_cufftmp_runs(dask_scheduler)
    world = dask_scheduler.plugins["redist"].engines.record("cufftmp")
    world.members = tuple(sorted(dask_scheduler.workers))
    return world.members


def _pretend_cufftmp_runs(dask_scheduler):
    """Every worker answered that it can run cufftmp (asked once: the answer is kept)."""
    for w in dask_scheduler.workers:
        answers = dask_scheduler.plugins["redist"].engines.capabilities.setdefault(w, {})
        answers["cufftmp"] = {"ok": True, "reason": "pretended by the test"}
        answers.setdefault("dask", {"ok": True})  # (a worker missing an answer is asked for all)
        answers.setdefault("hybrid", {"ok": False, "reason": "no GPU (pretended by the test)"})


def _replaced(client) -> None:
    """The killed worker's nanny started another, which (pretends it) can run cufftmp too."""
    client.wait_for_workers(3, timeout=60)
    client.run_on_scheduler(_pretend_cufftmp_runs)


def _pretend_world_on_worker(members):
    from dask_redist.engines import get_engine

    get_engine("cufftmp").world.members = tuple(members)


def _cufftmp_broken():
    from dask_redist.engines import get_engine

    return get_engine("cufftmp").health().broken


def _kill(client, victim: str) -> None:
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while victim in client.scheduler_info()["workers"]:
        assert time.monotonic() < deadline, "the killed worker never left"
        time.sleep(0.1)


def test_a_world_member_leaving_breaks_the_world_with_the_remedy():
    world = World()
    world.member_left("tcp://10.0.0.9:1")  # no world yet: nothing to break
    assert world.broken is None
    world.members = ("tcp://10.0.0.1:1", "tcp://10.0.0.2:1")
    world.member_left("tcp://10.0.0.9:1")  # not a member
    assert world.broken is None
    world.member_left("tcp://10.0.0.2:1")
    assert "tcp://10.0.0.2:1" in world.broken and "restart_broken=True" in world.broken


def test_forced_cufftmp_over_stranded_survivors_fails_at_once_with_the_remedy(own_cluster):
    client = own_cluster
    x = da.from_array(np.arange(32 * 32.0).reshape(32, 32), chunks=(8, 32))
    with dask_redist.enable(engine="dask"):
        x.rechunk((32, 8)).compute()  # registers the plugins
    members = client.run_on_scheduler(_pretend_world_on_scheduler)
    client.run(_pretend_world_on_worker, members)
    victim = members[0]
    _kill(client, victim)

    # every survivor's engine heard that its world lost a PE (the scheduler's redist-gone)
    survivors = [w for w in members if w != victim]
    deadline = time.monotonic() + 30
    while not all(client.run(_cufftmp_broken, workers=survivors).values()):
        assert time.monotonic() < deadline, client.run(_cufftmp_broken, workers=survivors)
        time.sleep(0.1)
    assert all(victim in why for why in client.run(_cufftmp_broken, workers=survivors).values())

    _replaced(client)
    start = time.monotonic()
    with dask_redist.enable(engine="cufftmp", timeouts={"collective": "120s", "bootstrap": "120s"}):
        with pytest.raises(RedistError, match="stranded") as info:
            x.rechunk((32, 8)).compute()
    assert time.monotonic() - start < 30  # refused at the barrier, not after a timeout
    assert "restart_broken=True" in str(info.value)
    assert any(w in str(info.value) for w in survivors)
    # the status of every worker still answers (nothing blocked behind the refused run)
    assert dask_redist.status(client)["unanswered"] == {}


def _gated(block, gate: str):
    from distributed import Event

    Event(gate).wait(timeout=120)
    return block


def _barriers_held(dask_scheduler) -> int:
    return len(dask_scheduler.plugins["redist"].rechunks.under_way())


def test_a_rechunk_submitted_before_the_world_lost_a_pe_finishes_on_dask(own_cluster):
    """The soak's kill step on the GPU node (2026-12-02, 2 and 4 PEs): a rechunk persisted, a PE
    killed before its barrier ran; Dask recomputed the dead worker's inputs, and the barrier that
    came after was refused as over stranded workers (22 of 140 steps). A rechunk submitted before
    the world lost its PE is a recovery: it finishes on the dask engine, with its values."""
    from distributed import Event

    client = own_cluster
    base = np.arange(32 * 32.0).reshape(32, 32)
    with dask_redist.enable(engine="dask"):
        da.from_array(base, chunks=(8, 32)).rechunk((32, 8)).compute()  # registers the plugins
    members = client.run_on_scheduler(_pretend_world_on_scheduler)
    client.run(_pretend_world_on_worker, members)
    gate = f"redist-test-gate-{time.time_ns()}"
    x = da.from_array(base, chunks=(8, 32)).map_blocks(_gated, gate, dtype=base.dtype)
    with dask_redist.enable(engine="cufftmp", timeouts={"collective": "120s", "bootstrap": "120s"}):
        y = x.rechunk((32, 8)).persist()
        deadline = time.monotonic() + 30
        while not client.run_on_scheduler(_barriers_held):
            assert time.monotonic() < deadline, "the scheduler never held the rechunk's barrier"
            time.sleep(0.05)
        _kill(client, members[0])
        Event(gate, client=client).set()
        np.testing.assert_array_equal(y.compute(), base)
    last = scheduler_history(client)[-1]
    assert last["engine"] == "dask" and last["outcome"] == "done", last
    assert "stranded" in last["why"] and "under way" in last["why"], last
    # a rechunk submitted now, forced onto the broken world, is still refused with the remedy
    _replaced(client)
    with dask_redist.enable(engine="cufftmp", timeouts={"collective": "120s", "bootstrap": "120s"}):
        with pytest.raises(RedistError, match="restart_broken=True"):
            da.from_array(base, chunks=(8, 32)).rechunk((32, 16)).compute()


def _defer_a_restart(dask_scheduler, reason: str) -> str:
    """What a worker leaving does while the barrier task of the active run is still processing
    (`Rechunks.worker_left` -> `restart_once_barrier_done`): the restart waits for the barrier."""
    from dask_redist.runtime.rechunks import PendingRestart

    rechunks = dask_scheduler.plugins["redist"].rechunks
    (token,) = [t for t, r in rechunks.by_token.items() if r.active is not None]
    rechunk = rechunks.by_token[token]
    rechunk.pending_restart = PendingRestart(rechunk.active.spec.run_id, reason, [])
    return token


def _hear_failures_late(dask_scheduler, delay: float | None) -> None:
    """The scheduler takes a rank's failure report ``delay`` seconds late (None: at once again)."""
    import asyncio

    from dask_redist.core.messages import Failed

    plugin = dask_scheduler.plugins["redist"]
    if delay is None:
        dask_scheduler.handlers[Failed.op] = plugin.failed
        return

    async def late(**kwargs):
        await asyncio.sleep(delay)
        return plugin.failed(**kwargs)

    dask_scheduler.handlers[Failed.op] = late


@pytest.mark.parametrize("late", [None, 1.0])
def test_a_survivor_refusing_a_run_that_a_worker_left_restarts_it(client, late):
    """The GPU soak at 2 PEs, engine cufftmp (seed 57): a worker was killed while the barrier task
    of run 1 was still processing, so its restart waited; the survivor, told its world lost a PE,
    refused run 1 ("NVSHMEM is unusable in this worker") and the scheduler failed the rechunk with
    that error. A failure of a run that a worker left is that worker's doing: the rechunk restarts.

    The refusing rank's unpack tasks wait for the scheduler's answer to its report, however
    late: raising its error before then failed the user's computation (CI, once in many runs)."""
    from engines import unusable_gate

    a = np.arange(32 * 32.0).reshape(32, 32) + (late or 0)  # (a rechunk of its own each time)
    x = da.from_array(a, chunks=(8, 32)).persist()
    with dask_redist.enable(engine="engines:UnusableWorldEngine", timeouts={"collective": "60s"}):
        y = x.rechunk((32, 8)).persist()
        wait_for_active_run(client, 30, "run 1 never started")
        client.run_on_scheduler(_hear_failures_late, delay=late)
        token = client.run_on_scheduler(_defer_a_restart, reason="worker tcp://gone:1 left during run 1")
        with open(unusable_gate(token), "w"):
            pass
        try:
            np.testing.assert_array_equal(y.compute(), a)
        finally:
            os.remove(unusable_gate(token))
            client.run_on_scheduler(_hear_failures_late, delay=None)
    last = scheduler_history(client)[-1]
    assert last["run"] == 2 and last["outcome"] == "done", last
