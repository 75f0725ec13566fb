"""Nothing lost, nothing hangs: killed workers, stalls, failures, memory, concurrency.

Workers are real processes under nannies and are killed for real (SIGKILL).
Faults are injected with the test engines in tests/engines.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import local_cluster, scheduler_history, worker_leftovers
from distributed import Client, Event, Scheduler, SchedulerPlugin, wait

import dask_redist
from dask_redist.core.run import WorkerRun
from dask_redist.core.spec import STAGE_PREFIX
from dask_redist.errors import RedistError, RedistTimeoutError


@pytest.fixture
def own_cluster():
    """A cluster these tests may break (workers are killed and come back)."""
    with local_cluster(3) as cluster, Client(cluster) as client:
        client.wait_for_workers(3)
        yield cluster, client


def data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _pid():
    return os.getpid()


def _stopped(pid: int) -> bool:
    """Is process ``pid`` stopped (SIGSTOP)?"""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


def kill_one_worker(client, when):
    """SIGKILL a worker process once ``when()`` is true (polled on a thread)."""
    pids = client.run(_pid)
    victim = sorted(pids)[-1]

    def killer():
        deadline = time.monotonic() + 60
        while not when() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(pids[victim], signal.SIGKILL)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    return victim, t


def _in_phase(client, phase):
    def check():
        try:
            workers = dask_redist.status(client)["workers"].values()
            return any(phase in w["runs"].values() for w in workers)
        except Exception:
            return False

    return check


class _BadChunk(Exception):
    pass


def _fails_at_the_last_chunk(b, block_info=None):
    if block_info[None]["chunk-location"][0] == 15:
        time.sleep(0.5)  # (the others are staged by then)
        raise _BadChunk("chunk 15 is bad")
    return b


@pytest.mark.parametrize("end", ["an input raises", "cancelled"])
def test_the_first_rechunk_of_a_cluster_ending_before_its_barrier_leaves_nothing_staged(end):
    """The plugins that drop staged chunks used to register at the first barrier: a first rechunk
    that failed or was cancelled before it left the chunks already staged held for good."""
    with local_cluster(2) as cluster, Client(cluster) as client, dask_redist.enable(engine="dask"):
        x = da.from_array(data((64, 32)), chunks=(4, 32))
        if end == "an input raises":
            with pytest.raises(_BadChunk, match="chunk 15 is bad"):
                x.map_blocks(_fails_at_the_last_chunk, dtype=float).rechunk((64, 4)).compute()
        else:
            y = x.map_blocks(lambda b: time.sleep(0.2) or b, dtype=float).rechunk((64, 4)).persist()
            time.sleep(1)  # some chunks staged, the barrier not run
            client.cancel(y)
            del y
        assert worker_leftovers(client, timeout=15) == {}
        np.testing.assert_array_equal(x.rechunk((64, 8)).compute(), x.compute())


def _plugins_then_whether_the_worker_plugin_is_here():
    from distributed import get_worker

    from dask_redist.runtime.tasks import ensure_plugins

    worker = get_worker()
    ensure_plugins(worker, 30)
    return "redist" in worker.plugins, time.monotonic()


def test_a_stage_task_waits_for_the_worker_plugin_another_worker_is_still_adding():
    """The scheduler plugin is in place as soon as its start begins, which then adds the worker
    plugin to every worker: a stage task on another worker that registered meanwhile went on
    without it, and when it was cancelled while it ran its chunks stayed held for good (once, in
    CI). Here the worker plugin comes a second late."""
    from dask_redist.runtime.scheduler import RedistSchedulerPlugin
    from dask_redist.runtime.worker_plugin import RedistWorkerPlugin

    with local_cluster(1) as cluster, Client(cluster) as client:
        client.register_plugin(RedistSchedulerPlugin(worker_plugin=None))
        future = client.submit(_plugins_then_whether_the_worker_plugin_is_here, pure=False)
        time.sleep(1)
        added = time.monotonic()
        client.register_plugin(RedistWorkerPlugin())
        here, returned = future.result(timeout=60)
    assert here
    assert returned >= added


def test_workers_of_one_process_each_wait_for_their_own_worker_plugin():
    """Workers in one process (``processes=False``) share the registration of the plugins: the
    second worker's stage task waits for its own worker plugin all the same."""
    from dask_redist.runtime.scheduler import RedistSchedulerPlugin
    from dask_redist.runtime.worker_plugin import RedistWorkerPlugin

    async def add_worker_plugin(dask_worker):
        await dask_worker.plugin_add(RedistWorkerPlugin(), name=RedistWorkerPlugin.name)

    with local_cluster(2, processes=False) as cluster, Client(cluster) as client:
        client.register_plugin(RedistSchedulerPlugin(worker_plugin=None))
        first, second = sorted(client.scheduler_info()["workers"])
        client.run(add_worker_plugin, workers=[first])
        f = _plugins_then_whether_the_worker_plugin_is_here
        assert client.submit(f, workers=[first], pure=False).result(timeout=60)[0]
        future = client.submit(f, workers=[second], pure=False)
        time.sleep(1)
        added = time.monotonic()
        client.run(add_worker_plugin, workers=[second])
        here, returned = future.result(timeout=60)
    assert here
    assert returned >= added


def test_worker_killed_mid_exchange(own_cluster):
    cluster, client = own_cluster
    a = data((60, 40, 8))
    x = da.from_array(a, chunks=(5, 40, 8))
    with dask_redist.enable(engine="engines:SlowEngine"):
        y = x.rechunk((60, 4, 8))
        future = client.compute(y)
        victim, killer = kill_one_worker(client, _in_phase(client, "exchange"))
        got = future.result(timeout=120)
    killer.join(5)
    np.testing.assert_array_equal(got, a)
    outcomes = [h["outcome"] for h in scheduler_history(client)]
    assert "restarted" in outcomes and outcomes[-1] == "done", outcomes


def test_outputs_lost_with_a_worker_after_the_run_are_computed_again(own_cluster):
    """A worker holding persisted output chunks dies after the run finished: Dask recomputes
    them, which runs the barrier (released once every output was in memory) and so a new
    collective run for the lost chunks; the values are right and no error reaches the logs."""
    cluster, client = own_cluster
    a = data((60, 40))
    x = da.from_array(a, chunks=(5, 40))
    with dask_redist.enable(engine="dask"):
        y = x.rechunk((60, 4)).persist()
        wait(y)
        done = len(scheduler_history(client))
        held = {w for ws in client.who_has(y).values() for w in ws}
        victim = sorted(held)[0]
        pid = client.run(_pid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in client.scheduler_info(n_workers=-1)["workers"] and time.monotonic() < deadline:
            time.sleep(0.05)
        got = y.compute()
    np.testing.assert_array_equal(got, a)
    history = scheduler_history(client)
    assert len(history) > done and history[-1]["outcome"] == "done", history[done - 1 :]
    logs = [m for _, m in client.get_scheduler_logs(n=1000)] + [
        m for lines in client.get_worker_logs(n=1000).values() for _, m in lines
    ]
    assert not [m for m in logs if "RedistConsistencyError" in m], "an unpack error reached the logs"


def test_worker_killed_mid_stage(own_cluster):
    cluster, client = own_cluster
    a = data((48, 48))

    def slow_identity(b):
        time.sleep(0.2)
        return b

    x = da.from_array(a, chunks=(4, 48)).map_blocks(slow_identity)
    with dask_redist.enable(engine="dask"):
        future = client.compute(x.rechunk((48, 4)))
        victim, killer = kill_one_worker(client, lambda: time.sleep(0.5) or True)
        got = future.result(timeout=120)
    killer.join(5)
    np.testing.assert_array_equal(got, a)


def test_a_stalled_rank_times_out_with_run_rank_and_phase(own_cluster):
    cluster, client = own_cluster
    x = da.from_array(data((30, 30)), chunks=(3, 30))
    with dask_redist.enable(engine="engines:StallingEngine", timeouts={"collective": "2s"}):
        start = time.monotonic()
        with pytest.raises(RedistTimeoutError) as info:
            x.rechunk((30, 3)).compute()
    message = str(info.value)
    assert "run 1" in message and "rank" in message and "'exchange'" in message, message
    assert time.monotonic() - start < 60
    assert worker_leftovers(client, timeout=15) == {}


def test_a_timeout_set_too_short_names_the_setting_and_blames_no_worker(own_cluster):
    """A collective timeout given in the wrong unit (here 1 µs) fails the run, saying which setting
    to raise; the workers, all alive, are not named as stopped or frozen (the scheduler's question
    whether they are alive was bounded by that same timeout, so none could answer in time)."""
    cluster, client = own_cluster
    x = da.from_array(data((30, 30)), chunks=(3, 30))
    with dask_redist.enable(engine="engines:StallingEngine", timeouts={"collective": "1us"}):
        with pytest.raises(RedistTimeoutError) as info:
            x.rechunk((30, 3)).compute()
    message = str(info.value)
    assert "redist.timeouts.collective" in message and "answered nothing" not in message, message
    assert len(client.scheduler_info()["workers"]) == 3
    assert worker_leftovers(client, timeout=15) == {}


@pytest.mark.parametrize("engine", ["StopsItselfEngine", "StopsAtOnceEngine", "StopsAfterBarrierEngine"])
def test_a_rank_stopped_mid_run_is_named_in_the_timeout(own_cluster, engine):
    """Rank 0's process is stopped (SIGSTOP) mid-run, or as its run starts (when the barrier task
    may still be fetching a stage marker from it: the scheduler fails that task too), or the rank
    that ran the barrier task stops as the others' unpack tasks go to fetch its result (the
    scheduler fails those): its peers time out, the scheduler finds it silent and, as it does not
    leave either, fails the run within the collective timeout of the peers' with an error naming
    it; resumed, it takes part in the next rechunk."""
    _, client = own_cluster
    client.wait_for_workers(3)
    before = client.run(_pid)
    stopped = sorted(before)[0]
    x = da.from_array(data((30, 30), seed=13), chunks=(3, 30))
    try:
        with dask_redist.enable(engine=f"engines:{engine}", timeouts={"collective": "3s"}):
            start = time.monotonic()
            with pytest.raises(RedistTimeoutError, match="answered nothing either") as info:
                client.compute(x.rechunk((30, 3))).result(timeout=60)
        assert time.monotonic() - start < 30
        if engine == "StopsAfterBarrierEngine":
            (stopped,) = [w for w, pid in before.items() if _stopped(pid)]
        assert stopped in str(info.value), info.value
    finally:
        for pid in before.values():
            os.kill(pid, signal.SIGCONT)
    with dask_redist.enable(engine="dask"):
        np.testing.assert_array_equal(x.rechunk((30, 3)).compute(), x.compute())
    assert client.run(_pid) == before


def _held(name: str) -> str:
    Event(name).wait(timeout=60)
    return "released"


def _task_state(key, dask_worker=None):
    ts = dask_worker.state.tasks.get(key)
    return None if ts is None else ts.state


def _fail_as_stuck(key, dask_scheduler=None):
    from types import SimpleNamespace

    from dask_redist.runtime.lifecycle import Rechunks

    rechunks = Rechunks()
    rechunks.scheduler = dask_scheduler
    spec = SimpleNamespace(token="t", describe=lambda: "a held task")  # (what _fail names)
    rechunks._fail([dask_scheduler.tasks[key]], spec, RedistTimeoutError("rank 0 answered nothing"))


def test_a_task_failed_for_a_silent_worker_is_no_longer_that_workers(own_cluster):
    """The scheduler fails a task of a stuck run as if its worker had reported the error
    (`Rechunks.fail_stuck`), and tells that worker too: a stopped worker that resumed with the
    task still its own would fetch its inputs, report them, be asked to drop them (released with
    the failed task) while the task executes, and close (distributed refuses that)."""
    _, client = own_cluster
    future = client.submit(_held, "redist-test-held", key="held-task", pure=False)
    deadline = time.monotonic() + 30
    while "executing" not in client.run(_task_state, "held-task").values():
        assert time.monotonic() < deadline, client.run(_task_state, "held-task")
        time.sleep(0.05)
    try:
        client.run_on_scheduler(_fail_as_stuck, "held-task")
        with pytest.raises(RedistTimeoutError, match="answered nothing"):
            future.result(timeout=30)
        while any(
            state in ("executing", "long-running") for state in client.run(_task_state, "held-task").values()
        ):
            assert time.monotonic() < deadline, client.run(_task_state, "held-task")
            time.sleep(0.05)
    finally:
        Event("redist-test-held", client=client).set()


def test_a_failing_rank_releases_the_others_at_once(own_cluster):
    cluster, client = own_cluster
    x = da.from_array(data((30, 30)), chunks=(3, 30))
    with dask_redist.enable(engine="engines:FailingEngine", timeouts={"collective": "120s"}):
        start = time.monotonic()
        with pytest.raises(RedistError, match="injected failure on rank 0"):
            x.rechunk((30, 3)).compute()
    assert time.monotonic() - start < 60  # far below the 120 s timeout: nobody waited for it


def test_a_run_that_leaves_a_world_untrusted_says_later_rechunks_pass_its_engine_over(own_cluster):
    """A world engine's run failed on a rank: the user's error says why and what follows (later
    rechunks under auto run elsewhere until a new bootstrap), and they do; bootstrap brings the
    engine back."""
    _, client = own_cluster
    a = data((30, 30), seed=5)
    engines = {"stand-in": "engines:PreferredFailingWorldEngine"}
    with dask_redist.enable(engine="auto", engines=engines, timeouts={"collective": "120s"}):
        with pytest.raises(RedistError, match="injected failure on rank 0") as info:
            da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
        said = str(info.value)
        assert "later rechunks under redist.engine: auto pass stand-in over" in said, said
        assert "the stand-in's world needs a new bootstrap" in said and "dask_redist.bootstrap" in said, said
        got = da.from_array(a + 1, chunks=(3, 30)).rechunk((30, 3)).compute()
        np.testing.assert_array_equal(got, a + 1)
        assert [r["engine"] for r in scheduler_history(client)] == ["stand-in", "dask"]
        assert dask_redist.status(client)["engines"]["records"]["stand-in"]["broken"]
        dask_redist.bootstrap(client, engine="stand-in")  # (it has no bootstrap rechunk of its own)
        assert dask_redist.status(client)["engines"]["records"]["stand-in"]["broken"] is None
        with pytest.raises(RedistError, match="injected failure on rank 0"):  # auto takes it again
            da.from_array(a + 2, chunks=(3, 30)).rechunk((30, 3)).compute()
    assert [r["engine"] for r in scheduler_history(client)] == ["stand-in", "dask", "stand-in"]


def test_a_world_engines_timeout_says_later_rechunks_pass_it_over(own_cluster):
    """A world engine's run timed out (a rank never sent): the user's timeout says what follows,
    as a failure does, and the next rechunk under auto runs elsewhere."""
    _, client = own_cluster
    a = data((30, 30), seed=6)
    engines = {"stand-in": "engines:PreferredStallingWorldEngine"}
    with dask_redist.enable(engine="auto", engines=engines, timeouts={"collective": "2s"}):
        with pytest.raises(RedistTimeoutError) as info:
            da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
        said = str(info.value)
        assert (
            "timed out" in said and "later rechunks under redist.engine: auto pass stand-in over" in said
        ), said
        got = da.from_array(a + 1, chunks=(3, 30)).rechunk((30, 3)).compute()
        np.testing.assert_array_equal(got, a + 1)
    assert [r["engine"] for r in scheduler_history(client)] == ["stand-in", "dask"]
    assert worker_leftovers(client, timeout=15) == {}


def test_new_workers_take_part_in_the_next_run(own_cluster):
    cluster, client = own_cluster
    a = data((40, 40))
    with dask_redist.enable(engine="dask"):
        np.testing.assert_array_equal(da.from_array(a, chunks=(4, 40)).rechunk((40, 4)).compute(), a)
        cluster.scale(4)
        client.wait_for_workers(4)
        np.testing.assert_array_equal(da.from_array(a + 1, chunks=(4, 40)).rechunk((40, 4)).compute(), a + 1)
    assert scheduler_history(client)[-1]["workers"] == 4


def test_many_rechunks_from_threads_and_two_clients(own_cluster):
    cluster, client = own_cluster
    other = Client(cluster)
    errors = []
    results = {}

    def work(i, c):
        try:
            a = data((36, 24), seed=i)
            x = da.from_array(a, chunks=(3 + i % 4, 24))
            y = x.rechunk((36, 2 + i % 5)).rechunk((5 + i % 3, 24))
            results[i] = (c.compute(y).result(timeout=120), a)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    with dask_redist.enable(engine="dask"):
        threads = [threading.Thread(target=work, args=(i, client if i % 2 else other)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
    other.close()
    assert not errors, errors
    assert len(results) == 8
    for got, expected in results.values():
        np.testing.assert_array_equal(got, expected)


def test_collective_next_to_a_p2p_rechunk_in_one_graph(own_cluster):
    cluster, client = own_cluster
    big, small = data((64, 64)), data((8, 8), seed=1)
    with dask_redist.enable(engine="dask", min_bytes=10_000, respect_method=False):
        y = da.from_array(big, chunks=(8, 64)).rechunk((64, 8), method="p2p")  # becomes a collective
        z = da.from_array(small, chunks=(1, 8)).rechunk((8, 1), method="p2p")  # stays dask's p2p
        before = len(scheduler_history(client))
        gy, gz = dask.compute(y, z)
    np.testing.assert_array_equal(gy, big)
    np.testing.assert_array_equal(gz, small)
    assert len(scheduler_history(client)) == before + 1


def test_status_answers_while_a_worker_is_stopped():
    """A worker stopped (SIGSTOP) held status() until it was resumed: it is named instead."""
    with local_cluster(2, threads_per_worker=1) as cluster, Client(cluster) as client:
        dask_redist.status(client)  # (the plugins registered, as after a first rechunk)
        pids = client.run(os.getpid)
        stopped = sorted(pids)[0]
        os.kill(pids[stopped], signal.SIGSTOP)
        try:
            start = time.monotonic()
            state = dask_redist.status(client)
            took = time.monotonic() - start
        finally:
            os.kill(pids[stopped], signal.SIGCONT)
        assert took < 30 and "no answer" in state["unanswered"][stopped], state["unanswered"]
        assert list(state["workers"]) == [w for w in pids if w != stopped]
        assert dask_redist.status(client)["unanswered"] == {}


def test_status_just_after_a_worker_is_killed_names_it_and_logs_no_error():
    """A worker killed (SIGKILL) and not yet removed by the scheduler is named in the answer; the
    scheduler logs no error for it (the question went through `Scheduler.broadcast`, which logs
    one for each worker it cannot reach)."""
    records = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append
    with local_cluster(2, threads_per_worker=1) as cluster, Client(cluster) as client:
        dask_redist.status(client)
        pids = client.run(os.getpid)
        killed = sorted(pids)[0]
        logging.getLogger("distributed.scheduler").addHandler(handler)
        try:
            os.kill(pids[killed], signal.SIGKILL)
            state = dask_redist.status(client)
        finally:
            logging.getLogger("distributed.scheduler").removeHandler(handler)
        assert killed not in state["workers"]
        assert killed in state["unanswered"] or killed not in client.scheduler_info()["workers"]
    assert [r.getMessage() for r in records] == []


class StageKeys(SchedulerPlugin):
    """Counts the stage tasks of each graph the scheduler is given."""

    name = "test-stage-keys"

    def __init__(self):
        self.counts = []

    def update_graph(self, scheduler, *, keys, tasks=(), **kwargs):
        self.counts.append(sum(isinstance(k, tuple) and str(k[0]).startswith(STAGE_PREFIX) for k in tasks))


def test_persisted_input_is_staged_by_one_task_per_worker_beside_another_scheduler(cluster):
    """Several schedulers in one process (two LocalClusters in a notebook, the session cluster
    of these tests): the rewrite reads the state of the scheduler building the graph. It read
    none, so a persisted input got one stage task per chunk, which work stealing spread."""
    a = data((64, 48, 8))
    with local_cluster(2, threads_per_worker=1) as other, Client(other) as client:
        assert len([s for s in Scheduler._instances if s.status.name == "running"]) == 2
        x = client.persist(da.from_array(a, chunks=(4, 48, 8)))  # 16 chunks on 2 workers
        wait(x)
        client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.add_plugin(StageKeys()))
        with dask_redist.enable(engine="dask"):
            np.testing.assert_array_equal(x.rechunk((64, 4, 8)).compute(), a)
        counts = client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins["test-stage-keys"].counts
        )
        holders = len({w for ws in client.who_has(x).values() for w in ws})
        assert counts == [holders], counts


def test_larger_than_worker_memory_keeps_dasks_rechunk_or_fails_clearly(cluster):
    """A run cannot spill: beyond what the workers hold together Dask's rechunk is kept (it can
    spill); where it fits in all but one worker would hold too much, the barrier refuses it
    naming that worker, instead of the nanny killing it. (``cluster``: with another scheduler
    running in this process, as in the whole suite.)"""
    with local_cluster(2, threads_per_worker=1, memory_limit="200MiB") as cluster, Client(cluster) as client:
        x = da.zeros((1024, 1024, 64), chunks=(64, 1024, 64))  # 512 MiB (broadcast chunks: no real memory)
        with dask_redist.enable(engine="dask"):
            entry = dask_redist.explain(x.rechunk((1024, 64, 64)))[0]
            assert entry.runs == "dask-rechunk" and "cannot spill" in entry.reason, entry
            first = sorted(client.scheduler_info()["workers"])[0]
            with dask.annotate(workers=[first]):
                y = da.zeros((1024, 1024, 16), chunks=(64, 1024, 16))  # 128 MiB, all on one worker
            y = y.persist(optimize_graph=False)  # (dask's optimization drops layer annotations)
            wait(y)  # (in memory: staged where it is, by one stage task)
            with pytest.raises(RedistError, match="memory limit"):
                y.rechunk((1024, 64, 16)).sum().compute()
            last = scheduler_history(client)[-1]  # (it was empty: no run ended, none started)
            assert last["outcome"] == "failed" and "memory limit" in last["why"], last


def test_fortran_ordered_and_sliced_chunks(client):
    a = data((30, 20, 10))
    x = da.from_array(a, chunks=(6, 20, 10)).map_blocks(np.asfortranarray)
    y = da.from_array(np.concatenate([a, a], axis=2), chunks=(6, 20, 20))[:, :, ::2]  # strided views
    with dask_redist.enable(engine="dask"):
        np.testing.assert_array_equal(x.rechunk((30, 4, 10)).compute(), a)
        np.testing.assert_array_equal(
            y.rechunk((30, 4, 5)).compute(), np.concatenate([a, a], axis=2)[:, :, ::2]
        )


def test_config_of_the_wrong_type_is_named():
    from dask_redist.config import ConfigError

    for key, value in [("retries", "many"), ("chunk-types", ["numpy", "sparse"]), ("timeouts.barrier", -1)]:
        with dask.config.set({f"redist.{key}": value}):
            with pytest.raises(ConfigError, match=f"redist.{key}"):
                dask_redist.enable()


def test_zero_d_and_negative_chunks_get_dask_behaviour(client):
    x0 = da.from_array(np.float64(3.0))
    with pytest.raises(Exception) as plain:
        da.ones(10, chunks=5).rechunk(((-5, 15),))  # what dask itself does
    with dask_redist.enable(engine="dask"):
        assert x0.rechunk(()).compute() == 3.0
        with pytest.raises(type(plain.value)):
            da.ones(10, chunks=5).rechunk(((-5, 15),)).compute()


def _break_engine(reason):
    from dask_redist.engines import get_engine

    get_engine("cufftmp").broken = reason


def test_bootstrap_names_workers_whose_nvshmem_is_unusable(client):
    """A worker whose GPU was left inside a collective cannot join a new world: say which, and how to fix it."""
    address = sorted(client.scheduler_info()["workers"])[0]
    client.run(_break_engine, "run X was left unfinished on the GPU", workers=[address])
    try:
        with pytest.raises(dask_redist.RedistError, match="restart_broken") as info:
            dask_redist.bootstrap(client)
        assert address in str(info.value) and "left unfinished" in str(info.value)
    finally:
        client.run(_break_engine, None)


def _pretend_nvshmem_world(dask_scheduler):
    world = dask_scheduler.plugins["redist"].engines.record("cufftmp")
    world.members = tuple(sorted(dask_scheduler.workers))
    return world.members


def test_survivors_of_a_world_that_lost_a_worker_are_named_by_bootstrap(own_cluster):
    """NVSHMEM cannot finalize in a process whose peer died: bootstrap must not try, and must say so."""
    _, client = own_cluster
    x = da.from_array(data((32, 32)), chunks=(8, 32))
    with dask_redist.enable(engine="dask"):
        x.rechunk((32, 8)).compute()  # registers the scheduler plugin
    world = client.run_on_scheduler(_pretend_nvshmem_world)
    victim, killer = kill_one_worker(client, lambda: True)
    killer.join()
    deadline = time.monotonic() + 60
    while victim in client.scheduler_info()["workers"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(RedistError, match="restart_broken") as info:
        dask_redist.bootstrap(client)
    survivors = [w for w in world if w != victim]
    assert all(w in str(info.value) for w in survivors) and victim not in str(info.value)
    assert "its NVSHMEM world died" in str(info.value)


def test_an_engine_that_cannot_start_fails_clearly_when_chosen(own_cluster):
    """redist.engine set explicitly: the user sees why the engine could not start, at once."""
    _, client = own_cluster
    x = da.from_array(data((30, 30)), chunks=(3, 30))
    with dask_redist.enable(engine="engines:UnavailableEngine", timeouts={"collective": "120s"}):
        start = time.monotonic()
        with pytest.raises(dask_redist.EngineUnavailableError, match="redist.injected-key"):
            x.rechunk((30, 3)).compute()
    assert time.monotonic() - start < 60
    assert worker_leftovers(client, timeout=15) == {}


def test_under_auto_an_engine_that_cannot_start_falls_back_to_dask(own_cluster):
    """What auto does when its preferred engine cannot start (cufftmp where an RMM pool holds the
    GPU): the same rechunk is rerun on the next engine, and the reason names the setting to change.
    The stand-in is registered by configuration (redist.engines), preferred to every built-in one."""
    _, client = own_cluster
    a = data((30, 30), seed=4)
    with dask_redist.enable(engine="auto", engines={"stand-in": "engines:PreferredUnavailableEngine"}):
        before = dask_redist.doctor(client)
        got = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
        after = dask_redist.doctor(client)
        explained = dask_redist.explain(da.from_array(a, chunks=(3, 30)).rechunk((30, 3)))[0]
    np.testing.assert_array_equal(got, a)
    runs = scheduler_history(client)
    assert [r["engine"] for r in runs] == ["stand-in", "dask"], runs
    assert runs[-1]["outcome"] == "done" and "redist.injected-key" in runs[-1]["why"], runs
    assert dask_redist.status(client)["engines"]["records"]["stand-in"][
        "broken"
    ]  # passed over until bootstrap()
    # doctor answers as explain and the scheduler do (`cluster.engine_for`), the world's records too
    picked = {t: (engine, why) for t, engine, why in after.picks}
    assert [e for t, e, _ in before.picks if t == "numpy"] == ["stand-in"], before.picks
    assert picked["numpy"][0] == explained.engine == "dask" and "redist.injected-key" in picked["numpy"][1]
    assert "redist.injected-key" in explained.engine_reason and "auto` picks for NumPy chunks: dask" in str(
        after
    )
    assert worker_leftovers(client, timeout=15) == {}


@pytest.mark.parametrize(
    "text, nbytes",
    [("4G", 4 * 2**30), ("512M", 512 * 2**20), ("1073741824", 2**30), ("1.5g", 3 * 2**29), ("2GB", 2**31)],
)
def test_symmetric_size_is_read_as_nvshmem_reads_it(text, nbytes):
    from dask_redist.engines.cufftmp.nvshmem import parse_symmetric_size

    assert parse_symmetric_size(text) == nbytes


def test_a_symmetric_size_nvshmem_cannot_read_is_named():
    from dask_redist.engines.cufftmp.nvshmem import parse_symmetric_size

    with pytest.raises(ValueError, match="NVSHMEM_SYMMETRIC_SIZE='4GiB'.*redist.nvshmem.symmetric-size"):
        parse_symmetric_size("4GiB")


def test_a_heap_that_cannot_fit_names_the_settings_and_the_pool():
    from dask_redist.engines.cufftmp.nvshmem import heap_problem

    GiB = 2**30
    assert heap_problem(4 * GiB, free=10 * GiB, total=140 * GiB) is None
    message = heap_problem(16 * GiB, free=10 * GiB, total=140 * GiB, pool="an RMM PoolMemoryResource")
    assert "16.00 GiB" in message and "10.00 GiB" in message and "140.00 GiB" in message
    assert "redist.nvshmem.symmetric-size" in message and "rmm_pool_size" in message
    assert "PoolMemoryResource" in message


def test_a_rank_stuck_in_an_aborted_run_does_not_hold_up_the_retry(own_cluster):
    """A peer died and the survivor's engine sits in a call that ignores the abort: the retry runs
    on a fresh collective thread of that worker, long before the call returns (without it, the
    retry would queue behind the call and time out)."""
    _, client = own_cluster
    a = data((30, 30), seed=5)
    with dask_redist.enable(engine="engines:StuckEngine", timeouts={"collective": "10s"}):
        start = time.monotonic()
        got = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
    assert time.monotonic() - start < 25  # the stuck call lasts 30 s
    np.testing.assert_array_equal(got, a)
    assert [h["outcome"] for h in scheduler_history(client)] == ["restarted", "done"]


def test_a_thread_stuck_in_an_aborted_run_is_replaced():
    """The unit behind the test above: a run submitted while the current one is aborted
    but has not returned gets a new thread, and the engine is told once."""
    from dask_redist.runtime.collective import CollectiveThread

    release, ran, abandoned = threading.Event(), [], []

    def execute(run):
        ran.append(run.spec.seq)
        run.phase = "started"  # as WorkerRun.start does
        if run.spec.seq == 1:
            release.wait(30)  # ignores the abort

    thread = CollectiveThread(execute, "test", on_abandon=abandoned.append)
    first, second, third = FakeRun(1), FakeRun(2), FakeRun(3)
    thread.submit(first)
    while ran != [1]:
        time.sleep(0.01)
    first.state = "failed"  # aborted from outside; execute does not return
    thread.submit(second)
    thread.submit(third)  # queued behind the second on the new thread: not a second abandon
    deadline = time.monotonic() + 10
    while ran != [1, 2, 3]:
        assert time.monotonic() < deadline, ran
        time.sleep(0.01)
    assert abandoned == [first]
    release.set()
    thread.close()


@pytest.mark.parametrize("gone", [(), ("tcp://b",)])
def test_an_aborted_run_being_completed_keeps_its_thread_unless_a_rank_is_gone(gone, monkeypatch):
    """A run of an engine that completes aborted runs (cufftmp) is still queuing its rounds
    after the abort: the next run waits for it on the same thread (two threads would queue
    collective calls at once) unless a rank is gone, when nothing can complete it."""
    from dask_redist.runtime import collective
    from dask_redist.runtime.collective import CollectiveThread

    monkeypatch.setattr(collective, "ABANDON_AFTER_S", 0.1)

    release, ran, abandoned = threading.Event(), [], []

    def execute(run):
        ran.append((run.spec.seq, threading.current_thread()))
        run.phase = "exchange"
        if run.spec.seq == 1:
            release.wait(30)

    thread = CollectiveThread(execute, "test", on_abandon=abandoned.append)
    first, second = FakeRun(1, completes=True), FakeRun(2, completes=True)
    thread.submit(first)
    while not ran:
        time.sleep(0.01)
    first.state, first.gone = "failed", gone
    thread.submit(second)
    time.sleep(0.3)
    assert [seq for seq, _ in ran] == ([1, 2] if gone else [1])
    release.set()
    deadline = time.monotonic() + 10
    while len(ran) < 2:
        assert time.monotonic() < deadline, ran
        time.sleep(0.01)
    assert abandoned == ([first] if gone else []) and (ran[0][1] is ran[1][1]) is not bool(gone)
    thread.close()


def test_an_aborted_run_that_returns_soon_keeps_its_thread():
    """A cancel and at once another rechunk (a notebook cell run again): the next run arrives
    while the aborted one is still on its way out of its engine. It waits for that thread, which
    returns a moment later, and nothing is abandoned (no warning that an engine has not returned;
    before, it got a new thread at once and the worker logged it)."""
    from dask_redist.runtime.collective import CollectiveThread

    ran, abandoned = [], []

    def execute(run):
        ran.append((run.spec.seq, threading.current_thread()))
        run.phase = "exchange"
        if run.spec.seq == 1:
            while not run.must_stop():
                time.sleep(0.01)
            time.sleep(0.3)  # on its way out: an abort is seen at the engine's next wait

    thread = CollectiveThread(execute, "test", on_abandon=abandoned.append)
    first, second = FakeRun(1), FakeRun(2)
    thread.submit(first)
    while not ran:
        time.sleep(0.01)
    first.state = "failed"
    thread.submit(second)
    deadline = time.monotonic() + 10
    while len(ran) < 2:
        assert time.monotonic() < deadline, ran
        time.sleep(0.01)
    assert abandoned == [] and ran[0][1] is ran[1][1]
    thread.close()


def test_a_run_aborted_before_it_started_is_not_abandoned():
    """Aborted between leaving the queue and starting, a run returns at once: the next
    run waits for the same thread, and the engine is not told it was abandoned."""
    from dask_redist.runtime.collective import CollectiveThread

    popped, release, ran, abandoned = threading.Event(), threading.Event(), [], []

    def execute(run):
        if run.spec.seq == 1:
            popped.set()
            release.wait(30)  # still in phase 'queued', as before WorkerRun.start
        ran.append((run.spec.seq, threading.current_thread()))

    thread = CollectiveThread(execute, "test", on_abandon=abandoned.append)
    first, second = FakeRun(1), FakeRun(2)
    thread.submit(first)
    assert popped.wait(10)
    first.state = "failed"
    thread.submit(second)
    release.set()
    deadline = time.monotonic() + 10
    while len(ran) < 2:
        assert time.monotonic() < deadline, ran
        time.sleep(0.01)
    assert abandoned == [] and [seq for seq, _ in ran] == [1, 2] and ran[0][1] is ran[1][1]
    thread.close()


def test_closing_fails_the_run_executing_before_waiting_for_its_thread():
    """A worker closing fails the run its collective thread is executing, so that the run's
    waits end and the thread exits: closing does not sit out the join's timeout."""
    from dask_redist.runtime.collective import CollectiveThread

    started, exited = threading.Event(), threading.Event()

    def execute(run):
        run.phase = "exchange"
        started.set()
        while not run.must_stop():  # a wait that ends with the run, as the engines' do
            time.sleep(0.01)
        exited.set()

    thread = CollectiveThread(execute, "test")
    run = FakeRun(1)
    thread.submit(run)
    assert started.wait(10)
    thread.close(timeout=60)
    assert exited.is_set() and run.state == "failed" and "closing" in str(run.error)


class FakeRun:
    """What CollectiveThread reads of a WorkerRun (its ``must_stop`` is the real one)."""

    must_stop = WorkerRun.must_stop

    def __init__(self, seq, completes=False):
        self.spec = type("Spec", (), {"seq": seq})()
        self.state = "queued"
        self.phase = "queued"
        self.gone, self.completes_when_aborted = (), completes
        self.error = None

    def name(self) -> str:
        return f"run {self.spec.seq}"

    def fail(self, error, gone=()):
        self.state, self.error = "failed", error


def test_a_bug_in_one_run_does_not_stop_the_runs_after_it():
    from dask_redist.runtime.collective import CollectiveThread

    ran = []

    def execute(run):
        ran.append(run.spec.seq)
        if run.spec.seq == 1:
            raise KeyError("a bug")

    thread = CollectiveThread(execute, "test")
    first, second = FakeRun(1), FakeRun(2)
    thread.submit(first)
    thread.submit(second)
    deadline = time.monotonic() + 10
    while ran != [1, 2]:
        assert time.monotonic() < deadline, ran
        time.sleep(0.01)
    assert first.state == "failed" and "KeyError" in str(first.error)
    thread.close()


def _slow_first_block(block, block_info=None):
    if block_info[0]["chunk-location"][0] == 0:
        time.sleep(4)
    return block


def _stage_state(dask_scheduler):
    """Stage keys in memory -> the workers holding their markers; and who runs the slow block."""
    staged = {
        ts.key: sorted(ws.address for ws in ts.who_has)
        for ts in dask_scheduler.tasks.values()
        if type(ts.key) is tuple and str(ts.key[0]).startswith("redist-stage-") and ts.state == "memory"
    }
    slow = [
        ts.processing_on.address
        for ts in dask_scheduler.tasks.values()
        if type(ts.key) is tuple
        and str(ts.key[0]).startswith("_slow_first_block")
        and ts.key[1] == 0
        and ts.processing_on is not None
    ]
    return staged, slow


async def _copy_everywhere(keys, dask_scheduler):
    await dask_scheduler.replicate(keys=keys, n=len(dask_scheduler.workers))


def test_a_worker_dying_after_staging_has_its_stage_tasks_rerun(own_cluster):
    """The staged chunks die with the worker, but copies of its stage markers can live on
    elsewhere (the barrier's worker fetches them): those stage tasks must be rerun, not the
    barrier retried on the stale markers forever."""
    _, client = own_cluster
    a = data((48, 48), seed=6)
    x = da.from_array(a, chunks=(4, 48)).map_blocks(_slow_first_block, dtype=a.dtype)
    # (a stage task per chunk: fused, the from_array chunks and the step run in one per thread)
    with dask_redist.enable(engine="dask", retries=2, fuse=False):
        future = client.compute(x.rechunk((48, 4)))
        deadline = time.monotonic() + 30
        while len((state := client.run_on_scheduler(_stage_state))[0]) < 11:  # all but the slow chunk
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
        staged, slow = state
        homes = {w for holders in staged.values() for w in holders}
        victim = sorted(homes - set(slow))[0]
        client.run_on_scheduler(_copy_everywhere, list(staged))  # copies of the markers on every worker
        pids = client.run(_pid)
        os.kill(pids[victim], signal.SIGKILL)
        got = future.result(timeout=120)
    np.testing.assert_array_equal(got, a)
    assert scheduler_history(client)[-1]["outcome"] == "done"


def test_a_rank_asking_for_a_restart_does_not_fail_the_computation(own_cluster):
    """The rank reports and waits for the scheduler's restart: its unpack tasks must not
    fail the computation first (they did, when the rank aborted its own run)."""
    _, client = own_cluster
    a = data((30, 30), seed=7)
    with dask_redist.enable(engine="engines:RestartingEngine"):
        got = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
    np.testing.assert_array_equal(got, a)
    assert [h["outcome"] for h in scheduler_history(client)] == ["restarted", "done"]


def _late_barrier_results(dask_worker):
    """The barrier task's result reaches the scheduler a second after the task finished."""
    send = dask_worker.batched_send

    def late(msg):
        key = msg.get("key")
        if msg.get("op") == "task-finished" and isinstance(key, str) and key.startswith("redist-barrier-"):
            dask_worker.loop.call_later(1.0, send, msg)
        else:
            send(msg)

    dask_worker.batched_send = late


@pytest.mark.parametrize(
    "workers, engine",
    [(1, "RestartingEngine"), (2, "BarrierElsewhereDiesEngine")],
    ids=["a rank asks", "a worker leaves"],
)
def test_a_restart_before_the_barrier_task_finished_happens_once(workers, engine):
    """A run is restarted (a rank asks for it; a worker that did not run the barrier task
    dies) while the barrier task's result is still on its way. Releasing the task then races
    its completion: distributed takes the late result for a stale one and releases the task
    again, restarting the new run too (CI saw an extra run; with every result late, as here,
    it never ends). The restart waits for the result. (One worker for the first case, so
    that the barrier task always runs again where it ran first.)"""
    with local_cluster(workers) as cluster, Client(cluster) as client:
        client.run(_late_barrier_results)
        a = data((30, 30), seed=8)
        with dask_redist.enable(engine=f"engines:{engine}"):
            future = client.compute(da.from_array(a, chunks=(3, 30)).rechunk((30, 3)))
            np.testing.assert_array_equal(future.result(timeout=60), a)
        assert [r["outcome"] for r in scheduler_history(client)] == ["restarted", "done"]


def test_a_worker_whose_gpu_is_stuck_exits_and_the_rechunk_completes(own_cluster):
    """A peer dies mid-run and rank 0's GPU work can never finish: rank 0's process exits
    (redist.nvshmem.exit-when-stuck), its nanny starts a new one, and the rechunk completes."""
    _, client = own_cluster
    before = client.run(_pid)
    a = data((30, 30), seed=8)
    with dask_redist.enable(engine="engines:StuckGpuEngine"):
        got = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
    np.testing.assert_array_equal(got, a)
    assert scheduler_history(client)[-1]["outcome"] == "done"
    client.wait_for_workers(3)
    assert len(set(before.values()) - set(client.run(_pid).values())) == 2  # both processes replaced


def _short_stuck_grace(seconds=1.0, dask_worker=None):
    from dask_redist.runtime import collective

    collective.STUCK_GRACE_S = seconds


@pytest.mark.parametrize(
    "engine, exit_when_stuck",
    [("BlockedGpuEngine", True), ("BlockedGpuEngine", False), ("BlockedBootstrapEngine", True)],
)
def test_a_worker_blocked_behind_its_stuck_gpu_exits(own_cluster, engine, exit_when_stuck):
    """Rank 0's thread blocks inside a call (behind GPU work that waits for a dead peer, or in
    NVSHMEM's bootstrap) and never sees the abort: the watchdog ends its process once the
    grace has passed. The rechunk completes either way (the blocked thread is left behind);
    with the setting off only the dead worker's process is new."""
    _, client = own_cluster
    client.run(_short_stuck_grace)
    before = client.run(_pid)
    a = data((30, 30), seed=9)
    with dask_redist.enable(engine=f"engines:{engine}", nvshmem={"exit-when-stuck": exit_when_stuck}):
        got = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
    np.testing.assert_array_equal(got, a)
    assert scheduler_history(client)[-1]["outcome"] == "done"
    # the watchdog fires a grace after the abort, maybe after the rechunk is done; with the
    # setting off, wait long enough that an exit would have been seen
    settle = time.monotonic() + (30 if exit_when_stuck else 5)
    while time.monotonic() < settle:
        client.wait_for_workers(3)
        now = client.run(_pid, on_error="return")  # a worker may be exiting right now
        replaced = set(before.values()) - {p for p in now.values() if isinstance(p, int)}
        if exit_when_stuck and len(replaced) == 2:
            break
        time.sleep(0.5)
    assert len(replaced) == (2 if exit_when_stuck else 1)


def test_a_worker_frozen_inside_a_native_call_exits_by_the_dead_mans_switch(own_cluster):
    """Rank 0's thread blocks inside a native call that holds the interpreter lock (NVSHMEM's
    host-side wait for a dead PE did, on PEs sharing a GPU): no thread of that process runs, the
    watchdog included, so the faulthandler timer the watchdog keeps re-arming ends it. The
    rechunk completes; the dead and the frozen worker's processes are both new (a peer blocked
    sending to the frozen one past the grace may exit too: the stand-in engine is watched)."""
    _, client = own_cluster
    client.run(_short_stuck_grace)
    before = client.run(_pid)
    a = data((30, 30), seed=10)
    with dask_redist.enable(engine="engines:FrozenGpuEngine", timeouts={"collective": "5s"}):
        got = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
    np.testing.assert_array_equal(got, a)
    frozen, dead = before[sorted(before)[0]], before[sorted(before)[-1]]  # ranks 0 and 2 of run 1
    deadline = time.monotonic() + 60
    while True:
        client.wait_for_workers(3)
        now = client.run(_pid, on_error="return")
        replaced = set(before.values()) - {p for p in now.values() if isinstance(p, int)}
        if {frozen, dead} <= replaced or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {frozen, dead} <= replaced, (before, now)


def test_a_timeout_waiting_for_a_frozen_rank_restarts_once_it_exits(own_cluster):
    """Rank 0 freezes holding the interpreter lock; its peers time out sending to it (4s) before
    its dead man's switch ends it (4s + the 1s grace). That timeout is not the user's error: the
    scheduler finds rank 0 silent, waits for it to leave, and restarts the rechunk without it."""
    _, client = own_cluster
    client.run(_short_stuck_grace, 1.0)
    before = client.run(_pid)
    a = data((30, 30), seed=12)
    with dask_redist.enable(engine="engines:FrozenAmongLiveEngine", timeouts={"collective": "4s"}):
        got = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).compute()
    np.testing.assert_array_equal(got, a)
    outcomes = [h["outcome"] for h in scheduler_history(client)[-2:]]
    assert outcomes == ["restarted", "done"], scheduler_history(client)[-2:]
    frozen = before[sorted(before)[0]]
    assert frozen not in client.run(_pid, on_error="return").values()


def test_exit_when_stuck_can_be_turned_off():
    from dask_redist.config import Settings

    with dask.config.set({"redist.nvshmem.exit-when-stuck": False}):
        assert Settings.from_config().exit_when_stuck is False
    with dask.config.set({"redist.nvshmem.exit-when-stuck": "yes"}):
        with pytest.raises(dask_redist.ConfigError, match="redist.nvshmem.exit-when-stuck"):
            Settings.from_config()


def _lockstep_folder(folder):
    import engines

    engines.LockstepEngine.folder = folder


def test_a_cancel_mid_run_costs_no_worker_when_ranks_must_make_matching_calls(own_cluster, tmp_path):
    """The ranks of an engine whose calls must match (LockstepEngine: cufftmp's rounds on a
    stand-in for NVSHMEM) see a cancel after different numbers of rounds: each completes
    the run dry, every round queued by every rank, so none is left waiting and no worker
    exits; the next rechunk runs on the same processes."""
    _, client = own_cluster
    client.wait_for_workers(3)
    client.run(_lockstep_folder, str(tmp_path))
    before = client.run(_pid)
    a = data((60, 60), seed=11)
    with dask_redist.enable(engine="engines:LockstepEngine"):
        x = client.persist(da.from_array(a, chunks=(6, 60)))
        wait(x)
        y = x.rechunk((60, 6)).persist()
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("*/*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # some rounds in: the fast rank is ahead of the slow ones
        client.cancel(y)
        del y
        while time.monotonic() < deadline and (
            not scheduler_history(client) or scheduler_history(client)[-1]["outcome"] != "cancelled"
        ):
            time.sleep(0.05)
        assert scheduler_history(client)[-1]["outcome"] == "cancelled", scheduler_history(client)[-1]
        (folder,) = tmp_path.iterdir()
        ranks = {p.name.split(".")[1] for p in folder.iterdir()}
        settle = time.monotonic() + 15  # every rank completes its rounds; a stuck one would exit by now
        while len(list(folder.iterdir())) < 40 * len(ranks) and time.monotonic() < settle:
            time.sleep(0.05)
        assert len(ranks) >= 2 and len(list(folder.iterdir())) == 40 * len(ranks)
        time.sleep(max(0.0, settle - time.monotonic()))
        assert client.run(_pid) == before  # no worker exited
        got = x.rechunk((60, 6)).compute()
    np.testing.assert_array_equal(got, a)
    assert scheduler_history(client)[-1]["outcome"] == "done" and client.run(_pid) == before


def test_a_rank_killed_mid_run_leaves_the_others_stuck_only_then(own_cluster, tmp_path):
    """The other side of completing aborted runs: when a rank DIES mid-run (LockstepEngine), the
    scheduler's abort names it gone and the survivors stop instead of completing (nothing
    would match their rounds); those that queued rounds the dead rank never queued drain,
    count as stuck and exit (redist.nvshmem.exit-when-stuck), and the nannies restart them.
    (The restarted run may fail where a survivor's engine is broken, as cufftmp's would be;
    under engine=auto the scheduler then moves the rechunk to the dask engine.)"""
    _, client = own_cluster
    client.wait_for_workers(3)
    client.run(_lockstep_folder, str(tmp_path))
    client.run(_short_drain)
    before = client.run(_pid)
    a = data((60, 60), seed=12)
    x = client.persist(da.from_array(a, chunks=(6, 60)))
    wait(x)
    victim, killer = kill_one_worker(client, lambda: len(list(tmp_path.glob("*/*"))) > 6)
    with dask_redist.enable(engine="engines:LockstepEngine"), contextlib.suppress(RedistError):
        x.rechunk((60, 6)).compute()
    killer.join()
    (first, *_) = sorted(tmp_path.iterdir())
    held = {r: sum(1 for p in first.iterdir() if p.name.endswith(f".{r}")) for r in range(3)}
    assert held[2] < max(held.values()), held  # the dead rank (the slowest) queued fewest rounds
    deadline, replaced = time.monotonic() + 60, set()
    while len(replaced) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        with contextlib.suppress(OSError):  # (a worker exiting while asked)
            replaced = set(before.values()) - set(client.run(_pid, on_error="ignore").values())
    assert len(replaced) >= 2, replaced  # the victim, and a survivor stuck behind it
    assert scheduler_history(client)[-1]["outcome"] in ("done", "failed")
    client.wait_for_workers(3)
    with dask_redist.enable(engine="dask"):
        np.testing.assert_array_equal(x.rechunk((60, 6)).compute(), a)


def _short_drain(dask_worker):
    from dask_redist.engines import rounds

    rounds.DRAIN_S = 0.5


def test_bootstrap_without_cupy_says_what_it_needs(client):
    """docs/quickstart.md's `dask_redist.bootstrap(client)` is for GPU workers; run where CuPy cannot be
    imported (a CPU machine) it raised a bare ``ModuleNotFoundError: No module named 'cupy'`` from
    inside the engine; now an `EngineUnavailableError` saying what bootstrap needs."""
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    with pytest.raises(dask_redist.errors.EngineUnavailableError, match=r"CuPy.*\[gpu\] extra") as info:
        dask_redist.bootstrap(client)
    assert "cufftmp" in str(info.value) and "dask-redist doctor" in str(info.value), str(info.value)


def _set_status(status, dask_worker=None):
    dask_worker.status = status


def test_a_worker_paused_holding_a_finished_run_s_outputs_fails_the_run_and_survives():
    """A paused worker starts no task: the unpack tasks pinned to one holding a finished run's
    outputs (memory Dask cannot spill) never start. After a collective timeout paused, the run
    fails with an error saying so, the scheduler fails those tasks, and the worker, unpaused,
    runs the next rechunk (`runtime.handover`). The worker is paused by hand, its memory monitor's
    pausing off (it would unpause a worker whose memory is low)."""
    from distributed.core import Status

    a = np.arange(64 * 512.0).reshape(64, 512)
    with (
        dask.config.set({"distributed.worker.memory.pause": False}),
        local_cluster(2, threads_per_worker=1) as cluster,
        Client(cluster) as client,
        dask_redist.enable(engine="dask", min_bytes=0),
    ):
        first, second = sorted(client.scheduler_info()["workers"])
        x = client.persist(da.from_array(a, chunks=(8, 512)), workers=[first])
        wait(x)
        client.run(_set_status, Status.paused, workers=[second])
        with dask.config.set({"redist.timeouts.collective": "2s"}):
            y = x.rechunk((64, 64)).persist()
        with pytest.raises(RedistError, match=f"worker {second} was paused for 2s holding"):
            client.compute(y).result(timeout=60)
        assert scheduler_history(client)[-1]["outcome"] == "failed"
        client.run(_set_status, Status.running, workers=[second])
        z = x.rechunk((64, 32)).persist()
        wait(z)
        assert set().union(*client.who_has(z).values()) == {first, second}  # (the worker runs tasks again)
        np.testing.assert_array_equal(z.compute(), a)
