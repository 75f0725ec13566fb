"""Messages to the collective's handlers that do not belong to a run are refused without
touching the run: reports from workers that are not its ranks, unknown failure kinds,
pieces from ranks that cannot send them, pieces for runs that never start or already
ended, and unpack tasks holding a stale barrier result."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from dask_redist.config import Settings
from dask_redist.core.run import WorkerRun
from dask_redist.core.spec import CollectiveSpec, RunSpec
from dask_redist.errors import RedistError
from dask_redist.planning import RechunkSpec, make_plan
from dask_redist.runtime import early as early_module
from dask_redist.runtime import worker as worker_module
from dask_redist.runtime.rechunks import ActiveRun, Rechunk
from dask_redist.runtime.scheduler import RedistSchedulerPlugin
from dask_redist.runtime.worker import WorkerState

WORKERS = ("tcp://a:1", "tcp://b:1")


def run_spec(run_id: int = 1, token: str = "t" * 32) -> RunSpec:
    rechunk = RechunkSpec(((2, 2), (4,)), ((4,), (2, 2)), 8)
    plan = make_plan(rechunk, [0, 1], 2)
    spec = CollectiveSpec(token, "x", "y", rechunk, np.dtype("float64"), Settings())
    return RunSpec(spec, run_id, 1, WORKERS, plan.in_ranks, plan.out_ranks, plan.needed, "dask")


class FakeScheduler:
    """What the plugin's failure path reads and writes of a Scheduler."""

    def __init__(self):
        self.tasks, self.sent = {}, []
        self.workers = dict.fromkeys(WORKERS)
        self.stream_comms = {
            w: SimpleNamespace(send=lambda msg, w=w: self.sent.append((w, msg))) for w in WORKERS
        }

    def set_restrictions(self, restrictions):
        pass

    def transitions(self, recommendations, stimulus_id):
        for key, finish in recommendations.items():
            self.tasks[key].state = finish

    def stimulus_queue_slots_maybe_opened(self, stimulus_id):
        pass


def plugin_with_an_active_run() -> RedistSchedulerPlugin:
    plugin = RedistSchedulerPlugin()
    plugin.scheduler = plugin.rechunks.scheduler = FakeScheduler()
    spec = run_spec()
    plugin.rechunks.by_token[spec.token] = Rechunk(spec.token, active=ActiveRun(spec, set(), {}, 0, 0))
    return plugin


@pytest.mark.parametrize("address, failure", [("tcp://intruder:1", "error"), (WORKERS[0], "no-such-failure")])
def test_a_failure_report_from_outside_the_run_is_ignored(address, failure):
    plugin = plugin_with_an_active_run()
    token = next(iter(plugin.rechunks.by_token))
    plugin.failed(token, 1, address, "boom", failure)
    assert (
        plugin.rechunks.by_token[token].active is not None
        and plugin.scheduler.sent == []
        and not plugin.history
    )


def test_a_failure_report_from_a_rank_aborts_the_run_everywhere():
    plugin = plugin_with_an_active_run()
    token = next(iter(plugin.rechunks.by_token))
    plugin.failed(token, 2, WORKERS[0], "stale report", "error")  # another run's: ignored
    assert plugin.rechunks.by_token[token].active is not None
    plugin.failed(token, 1, WORKERS[0], "boom", "error")
    assert plugin.rechunks.by_token[token].active is None and plugin.history[-1]["outcome"] == "failed"
    assert sorted(w for w, m in plugin.scheduler.sent if m["op"] == "redist-abort") == sorted(WORKERS)
    assert all(
        m["gone"] == [] for _, m in plugin.scheduler.sent
    )  # every rank alive: the run is completed dry


def test_an_abort_names_the_ranks_that_left_and_they_stop_the_run_for_good():
    """A worker that left makes the ranks stop instead of completing the run (nothing would
    complete the calls they share with it: dask_redist.engines.rounds)."""
    plugin = plugin_with_an_active_run()
    token = next(iter(plugin.rechunks.by_token))
    del plugin.scheduler.workers[WORKERS[1]]
    plugin.failed(token, 1, WORKERS[0], "boom", "error")
    (message,) = {str(m) for w, m in plugin.scheduler.sent}
    abort = plugin.scheduler.sent[0][1]
    assert abort["gone"] == [WORKERS[1]], message
    state = WorkerState(SimpleNamespace(address=WORKERS[0]))
    run = WorkerRun(run_spec(), WORKERS[0], {})
    run.completes_when_aborted = True
    state.runs[run.spec.token] = run
    state.handle_abort(run.spec.token, run.run_id, abort["reason"], abort["failure"], abort["gone"])
    assert run.state == "failed" and run.gone == (WORKERS[1],) and run.must_stop()


def test_pieces_from_a_rank_that_cannot_send_them_are_refused():
    state = WorkerState(SimpleNamespace(address=WORKERS[0]))
    run = WorkerRun(run_spec(), WORKERS[0], {})
    state.runs[run.spec.token] = run
    piece = np.zeros(16, np.uint8)
    for bad in (0, 2, -1, "1"):  # itself, out of range, negative, not a rank number
        assert asyncio.run(state.handle_receive(run.spec.token, 1, bad, 0, 1, piece)) == "refused"
    assert run._inbox == []
    assert asyncio.run(state.handle_receive(run.spec.token, 1, 1, 0, 1, piece)) == "OK"
    assert len(run._inbox) == 1


def test_pieces_for_a_run_that_never_starts_are_dropped_after_a_while(monkeypatch):
    state = WorkerState(SimpleNamespace(address=WORKERS[0]))
    clock = [1000.0]
    monkeypatch.setattr(worker_module.time, "monotonic", lambda: clock[0])
    piece = np.zeros(16, np.uint8)
    asyncio.run(state.handle_receive("u" * 32, 7, 1, 0, 1, piece))  # no such run here (yet)
    assert state.early.runs() == [("u" * 32, 7)]
    clock[0] += early_module.EARLY_TTL_S + 1
    asyncio.run(state.handle_receive("v" * 32, 1, 1, 0, 1, piece))  # any later message prunes
    assert state.early.runs() == [("v" * 32, 1)]


def test_late_pieces_of_a_run_that_ended_are_refused_and_early_ones_dropped():
    state = WorkerState(SimpleNamespace(address=WORKERS[0]))
    piece = np.zeros(16, np.uint8)
    token = "w" * 32
    asyncio.run(state.handle_receive(token, 3, 1, 0, 1, piece))  # run 3 not started here yet
    state.handle_abort(token, 3, "cancelled", "error")  # ... and it never will
    assert state.early.runs() == []
    asyncio.run(state.handle_receive(token, 3, 1, 0, 1, piece))  # a late piece of it
    asyncio.run(state.handle_receive(token, 2, 1, 0, 1, piece))  # of an older run
    assert state.early.runs() == []
    asyncio.run(state.handle_receive(token, 4, 1, 0, 1, piece))  # a later run: kept for its start
    assert state.early.runs() == [(token, 4)]


def test_a_forgotten_rechunk_takes_its_staged_chunks_and_runs_with_it():
    state = WorkerState(SimpleNamespace(address=WORKERS[0]))
    spec = run_spec()
    token = spec.token
    state.staging.put(token, (0,), {0: np.zeros(2)})  # e.g. a cancelled stage task that finished
    state.staging.put("other" * 6, (0,), {0: np.zeros(2)})
    state.runs[token] = WorkerRun(spec, WORKERS[0], {})
    state.handle_forget(token)
    assert token not in state.runs and state.staging.counts()["staged chunks"] == 1
    asyncio.run(state.handle_receive(token, 1, 1, 0, 1, np.zeros(16, np.uint8)))  # late: refused
    assert state.early.runs() == []


def test_an_unpack_with_a_stale_barrier_result_has_the_barrier_run_again():
    """The scheduler's answer to an unpack that found its output missing: stale when no run was
    started for the barrier task as it is now, or the run did not include that output (the
    rechunk persisted again onto a live barrier); then the barrier is released to run again."""
    plugin = plugin_with_an_active_run()
    token = next(iter(plugin.rechunks.by_token))
    barrier = SimpleNamespace(key="redist-barrier-" + token, state="memory", dependents=set())
    plugin.scheduler.tasks[barrier.key] = barrier
    plugin.rechunks.by_token[token].barrier = (barrier, 1, np.array([True, False]))
    run = plugin.rechunks.by_token[token].active
    run.pending.add(run.spec.collective.output_key(0))
    assert plugin.stale(token, 1, 0) == {
        "stale": False
    }  # owed by the run started for this task: a real error
    assert barrier.state == "memory"
    run.pending.clear()  # delivered already, its key forgotten and submitted again
    assert plugin.stale(token, 1, 0) == {"stale": True, "released": True}
    barrier.state = "memory"
    plugin.rechunks.by_token[token].active = run
    assert plugin.stale(token, 1, 1) == {"stale": True, "released": True}  # an output the run left out
    assert barrier.state == "released"
    assert plugin.scheduler.sent and plugin.scheduler.sent[-1][1]["op"] == "redist-abort"  # the run stops
    barrier.state = "memory"
    assert plugin.stale(token, 0, 0) == {"stale": True, "released": True}  # a re-adopted result
    assert barrier.state == "released"
    barrier.state = "processing"  # running again already: nothing to release
    assert plugin.stale(token, 0, 0) == {"stale": True, "released": False}
    plugin.rechunks.by_token.clear()  # forgotten meanwhile, then resubmitted: no run for this task at all
    barrier.state = "memory"
    assert plugin.stale(token, 1, 0) == {"stale": True, "released": True}


def test_a_worker_leaving_stops_the_completion_of_runs_aborted_before():
    """A run aborted by a cancel is being completed (every rank alive); when a rank then dies,
    the scheduler's redist-gone makes it stop for good instead of waiting for the dead rank's
    calls until the collective timeout. Runs still running learn it from their own abort."""
    state = WorkerState(SimpleNamespace(address=WORKERS[0]))
    aborted, running = (
        WorkerRun(run_spec(), WORKERS[0], {}),
        WorkerRun(run_spec(token="other"), WORKERS[0], {}),
    )
    for run in (aborted, running):
        run.completes_when_aborted = True
        state.runs[run.spec.token] = run
    aborted.fail(RedistError("all outputs forgotten"))
    assert not aborted.must_stop()
    state.handle_gone(WORKERS[1])
    assert aborted.must_stop() and aborted.gone == (WORKERS[1],)
    assert running.state != "failed" and running.gone == ()


def test_set_phase_raises_an_abort_unless_the_run_is_being_completed():
    for completes, gone, raises in [(False, (), True), (True, (), False), (True, (WORKERS[1],), True)]:
        run = WorkerRun(run_spec(), WORKERS[0], {})
        run.completes_when_aborted = completes
        run.fail(RedistError("cancelled"), gone=gone)
        if raises:
            with pytest.raises(RedistError, match="cancelled"):
                run.set_phase("exchange")
        else:
            run.set_phase("exchange")
        assert run.phase == "exchange"


def test_every_message_matches_the_handler_that_takes_it():
    """The typed messages (dask_redist.core.messages) are the one source of names and fields:
    each handler the plugins register under a message's op takes exactly its fields."""
    import dataclasses
    import inspect

    from dask_redist.core import messages as m
    from dask_redist.runtime.worker_plugin import RedistWorkerPlugin

    class Worker:  # (what the worker plugin's setup touches; weak-referenceable, as a Worker is)
        address, handlers, stream_handlers = WORKERS[0], {}, {}

    worker = Worker()
    RedistWorkerPlugin().setup(worker)
    plugin = RedistSchedulerPlugin()
    scheduler = SimpleNamespace(
        plugins={}, handlers={}, add_plugin=lambda *a, **k: None, worker_plugins={}, workers={}
    )
    asyncio.run(plugin.start(scheduler))
    handlers = {**worker.handlers, **worker.stream_handlers, **scheduler.handlers}
    messages = [
        c
        for c in vars(m).values()
        if isinstance(c, type)
        and issubclass(c, m.Message)
        and not issubclass(c, m.Event)
        and c is not m.Message
    ]
    assert {c.op for c in messages} == set(
        handlers
    )  # a handler for every message, a message for every handler
    assert len({c.op for c in messages}) == len(messages)  # one handler, one message: no op shared
    for cls in messages:
        fields = [f.name for f in dataclasses.fields(cls)]
        side = (
            worker.handlers
            if cls is m.WorkerStatus
            else scheduler.handlers
            if cls is m.SchedulerStatus
            else handlers
        )
        params = list(inspect.signature(side[cls.op]).parameters)
        assert params == fields, (cls.__name__, params, fields)


def test_every_event_is_taken_by_the_scheduler_plugin():
    """Events (dask_redist.core.messages.Event) reach the scheduler plugin's log_event as the
    worker's log_event sends them: a dict of their fields, with the sending worker added."""
    from dask_redist.core import messages as m
    from dask_redist.core.spec import STAGE_PREFIX

    sent = []
    worker = SimpleNamespace(log_event=lambda topic, msg: sent.append((topic, msg)))
    m.StageDone("t" * 32, [3], [5, 6], "numpy").send(worker)
    (topic, msg), plugin = sent[0], plugin_with_an_active_run()
    key = (STAGE_PREFIX + "t" * 32, 3)
    plugin.scheduler.tasks[key] = SimpleNamespace(state="processing")  # (kept while its task runs)
    plugin.log_event(topic, {**msg, "worker": WORKERS[1]})
    assert plugin.eager._staged == {key: (WORKERS[1], [5, 6], "numpy")}


def test_a_start_is_written_at_once_not_after_the_streams_interval():
    """`transport.send_now` on distributed's BatchedSend: a message queued behind a write that
    just happened goes out at once; a plain send waits for the stream's interval, unless the
    stream is flushed (`transport.flush`)."""
    from distributed.batched import BatchedSend

    from dask_redist.runtime.transport import flush, send_now

    class Comm:
        def __init__(self):
            self.written = []

        def closed(self):
            return False

        async def write(self, payload, serializers=None, on_error=None):
            self.written.append(list(payload))
            return 1

    async def main():
        comm, stream = Comm(), BatchedSend(interval="10s")
        stream.start(comm)
        stream.send({"op": "first"})  # (written at once: nothing was written before)
        await asyncio.sleep(0.1)
        stream.send({"op": "waits"})
        await asyncio.sleep(0.2)
        assert comm.written == [[{"op": "first"}]]  # (the interval has not passed)
        send_now(stream, {"op": "start"})
        await asyncio.sleep(0.2)
        assert comm.written == [[{"op": "first"}], [{"op": "waits"}, {"op": "start"}]]
        stream.send({"op": "result"})  # (waits for the interval again: `flush` writes it)
        await asyncio.sleep(0.1)
        assert len(comm.written) == 2
        flush(stream)
        await asyncio.sleep(0.1)
        assert comm.written[2:] == [[{"op": "result"}]]
        stream.please_stop = True
        stream.waker.set()

    asyncio.run(main())


def test_a_field_left_at_its_default_is_not_sent():
    """A message's fields at their default stay home: a handler from before such a field was
    added (a scheduler with an older dask-redist) still answers; one set is sent."""
    from dask_redist.core import messages as m

    def old_probe(engines):  # (the handler before ``keys``)
        return {"engines": engines}

    rpc = SimpleNamespace(redist_probe=lambda **kw: asyncio.sleep(0, old_probe(**kw)))
    assert asyncio.run(m.Probe({"dask": "path"}).call(rpc)) == {"engines": {"dask": "path"}}
    with pytest.raises(TypeError, match="keys"):
        asyncio.run(m.Probe({"dask": "path"}, (("x", 0),)).call(rpc))
    assert m.ForgetWorld()._non_default() == {} and m.ForgetWorld("dask")._non_default() == {"engine": "dask"}


def test_the_result_of_a_run_s_last_unpack_is_written_at_once():
    """Once the unpack tasks took every output of a run on this worker, the next result to reach
    memory (the last unpack's) has the worker's stream written at once (`take_flush`), once."""
    state = WorkerState(SimpleNamespace(address=WORKERS[0]))
    run = WorkerRun(run_spec(), WORKERS[0], {})
    state.runs[run.spec.token] = run
    run.finish({0: np.zeros(2), 1: np.ones(2)})
    first = asyncio.run(state.unpack(run.spec.token, 0, run.run_id))
    assert state.take_flush() is False and float(first.sum()) == 0
    last = asyncio.run(state.unpack(run.spec.token, 1, run.run_id))
    assert float(last.sum()) == 2
    assert state.take_flush() is True and state.take_flush() is False


def _worker_using(process: int, managed: int = 0, limit: int = 300 * 2**20, pause=0.8, data=None):
    """A worker whose process uses ``process`` bytes, ``managed`` of them Dask's (spillable where
    ``data``, its data, is no `SpillBuffer`)."""
    return SimpleNamespace(
        address=WORKERS[0],
        data=data,
        memory_manager=SimpleNamespace(memory_limit=limit, memory_pause_fraction=pause),
        monitor=SimpleNamespace(get_process_memory=lambda: process),
        state=SimpleNamespace(nbytes=managed),
    )


def test_a_stage_task_that_would_pause_its_worker_for_good_fails_and_keeps_nothing():
    """Staged chunks that put the memory Dask cannot spill over the pause threshold would pause
    the worker before its last stage tasks, and the barrier would never run (a rechunk restarted
    under memory pressure waited for good): the stage task fails with the numbers instead."""
    mib, token = 2**20, "s" * 32
    chunk = np.zeros(8 * mib // 8)
    state = WorkerState(_worker_using(process=246 * mib))  # 6 MiB over 80% of 300 MiB, 8 staged
    with pytest.raises(RedistError, match=r"staged input chunks \(8.00 MiB\).*over 80% of its memory limit"):
        state.stage(token, (0,), [0], [chunk.shape], [chunk])
    assert state.staging.counts()["staged chunks"] == 0 and state.staging.nbytes == 0
    # what Dask can spill does not count; nor a worker over the threshold by more than it staged
    for worker in (
        _worker_using(246 * mib, managed=20 * mib),
        _worker_using(260 * mib),
        _worker_using(246 * mib, pause=False),
    ):
        state = WorkerState(worker)
        state.stage(token, (0,), [0], [chunk.shape], [chunk])
        assert state.staging.nbytes == chunk.nbytes


def test_a_stage_task_counts_spilled_and_staged_data_as_what_dask_cannot_free(tmp_path):
    """Dask's ``nbytes`` counts the data it spilled to disk too, and spilling an input chunk that is
    also staged frees nothing: a persisted input spilled under a small ``memory_limit`` and read back
    by the stage tasks looked spillable, the stage task passed, the worker paused for good holding
    its staged chunks, and the rechunk waited forever (2 workers of 170 MiB, 64 MiB persisted, then
    rechunked). The stage task fails with the numbers instead; Dask's data in RAM still counts."""
    from distributed.spill import SpillBuffer

    mib, token = 2**20, "s" * 32
    chunk, other = np.zeros(8 * mib // 8), np.ones(8 * mib // 8)
    data = SpillBuffer(str(tmp_path), target=2**40)
    data["x-1"] = other
    data["x-0"] = chunk  # the input chunk the stage task stages, in RAM
    data.evict()  # x-1, spilled to disk: still in Dask's nbytes
    assert list(data.fast) == ["x-0"] and list(data.slow) == ["x-1"]
    state = WorkerState(_worker_using(246 * mib, managed=16 * mib, data=data))  # 6 MiB over 80%
    with pytest.raises(RedistError, match=r"staged input chunks \(8.00 MiB\).*over 80% of its memory limit"):
        state.stage(token, (0,), [0], [chunk.shape], [chunk])
    assert state.staging.nbytes == 0
    # a chunk in Dask's RAM that is not staged can be spilled: it counts as before
    state = WorkerState(_worker_using(246 * mib, managed=16 * mib, data=data))
    state.stage(token, (0,), [0], [other.shape], [other.copy()])
    assert state.staging.nbytes == other.nbytes
