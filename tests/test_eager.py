"""Runs started from the stage tasks' events (dask_redist.runtime.eager): what a barrier task
would ask for, built from them only where every one is there, current and of one type."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dask_redist.core import messages as m
from dask_redist.core.spec import STAGE_PREFIX
from dask_redist.runtime.eager import EagerStarts

TOKEN = "t" * 32
A, B = "tcp://a:1", "tcp://b:1"


class _Running(dict):
    """The scheduler's tasks, as far as `EagerStarts.staged` asks: every stage task processing."""

    def get(self, key, default=None):
        return SimpleNamespace(key=key, state="processing")


RUNNING = _Running()


def stage_ts(tail, holder, state="memory"):
    return SimpleNamespace(
        key=(STAGE_PREFIX + TOKEN, *tail), state=state, who_has=[SimpleNamespace(address=holder)]
    )


def barrier_over(*deps):
    return SimpleNamespace(dependencies=list(deps))


def test_the_request_is_what_the_barrier_task_would_send():
    eager = EagerStarts()
    # one stage task per worker: B holds chunks 0 and 2, A chunk 1 and 3
    eager.staged(B, m.StageDone(TOKEN, [0], [0, 2], "numpy"), RUNNING)
    eager.staged(A, m.StageDone(TOKEN, [1], [1, 3], "numpy"), RUNNING)
    request = eager.request(TOKEN, barrier_over(stage_ts((0,), B), stage_ts((1,), A)))
    assert request.workers == [A, B] and request.holders == [1, 0, 1, 0] and request.chunk_type == "numpy"
    assert sorted((tuple(tail), rank) for tail, rank in request.homes) == [((0,), 1), ((1,), 0)]


@pytest.mark.parametrize("case", ["missing", "elsewhere", "released", "mixed in a task", "mixed across"])
def test_no_request_unless_every_stage_task_said_what_it_staged(case):
    eager = EagerStarts()
    eager.staged(A, m.StageDone(TOKEN, [0], [0], "mixed" if case == "mixed in a task" else "numpy"), RUNNING)
    if case != "missing":
        eager.staged(B, m.StageDone(TOKEN, [1], [1], "cupy" if case == "mixed across" else "numpy"), RUNNING)
    holder = A if case == "elsewhere" else B  # (a stage task run again on another worker, unsaid)
    second = stage_ts((1,), holder, "released" if case == "released" else "memory")
    assert eager.request(TOKEN, barrier_over(stage_ts((0,), A), second)) is None
    eager.staged(B, m.StageDone(TOKEN, [1], [1], "numpy"), RUNNING)
    eager.staged(A, m.StageDone(TOKEN, [0], [0], "numpy"), RUNNING)
    assert eager.request(TOKEN, barrier_over(stage_ts((0,), A), stage_ts((1,), B))) is not None


def test_a_dropped_stage_key_is_forgotten():
    eager = EagerStarts()
    eager.staged(A, m.StageDone(TOKEN, [0], [0], "numpy"), RUNNING)
    eager.dropped((STAGE_PREFIX + TOKEN, 0))
    assert eager.request(TOKEN, barrier_over(stage_ts((0,), A))) is None


def test_mixed_types_name_the_rechunk():
    stages = [(A, (0,), [0], {"numpy"}), (B, (1,), [1], {"cupy"})]
    with pytest.raises(TypeError, match=r"rechunk x: input chunks of mixed types \['cupy', 'numpy'\]"):
        m.Barrier.of(TOKEN, stages, "rechunk x")


def test_a_stage_task_that_staged_nothing_does_not_hold_the_start_back():
    eager = EagerStarts()
    eager.staged(A, m.StageDone(TOKEN, [0], [0, 1], "cupy"), RUNNING)
    eager.staged(B, m.StageDone(TOKEN, [1], [], ""), RUNNING)
    request = eager.request(TOKEN, barrier_over(stage_ts((0,), A), stage_ts((1,), B)))
    assert request.workers == [A] and request.holders == [0, 0] and request.chunk_type == "cupy"


def _stream_batches(dask_worker=None) -> list[list[tuple]]:
    """The batches this worker wrote to the scheduler lately: (op, topic, key) of each message."""
    batches = []
    for payload in dask_worker.batched_stream.recent_message_log:
        if isinstance(payload, list):
            batches.append([(msg.get("op"), msg.get("topic"), str(msg.get("key"))) for msg in payload])
    return batches


def test_a_stage_task_s_event_leaves_in_one_write_with_its_result(client):
    """The event goes on the worker's stream as the task's result does, in the same batch and
    just ahead of it: the scheduler starts the run on the pair without a stream interval between
    them (sent from the task, the event opened the interval that the result then waited out)."""
    from conftest import worker_leftovers

    _rechunk_a_persisted_input(seed=3)
    seen = 0
    for batches in client.run(_stream_batches).values():
        for batch in batches:
            for i, (op, topic, _) in enumerate(batch):
                if op == "log-event" and topic == m.StageDone.op:
                    seen += 1
                    following = batch[i + 1 :]
                    assert any(o == "task-finished" and STAGE_PREFIX in k for o, _, k in following), batch
    assert seen >= 1
    assert worker_leftovers(client) == {}


@pytest.mark.parametrize("state", [None, "released", "processing"])
def test_an_event_for_a_stage_task_released_meanwhile_is_not_kept(state):
    """A stage task cancelled on the scheduler while it ran on its worker sends its event with its
    result all the same; the scheduler ignores the result, so no transition of the key would ever
    drop the event: it must not be kept (it was, one per cancelled stage task, for good)."""
    from dask_redist.runtime.scheduler import RedistSchedulerPlugin

    plugin = RedistSchedulerPlugin()
    key = (STAGE_PREFIX + TOKEN, 0)
    tasks = {} if state is None else {key: SimpleNamespace(key=key, state=state)}
    plugin.scheduler = SimpleNamespace(tasks=tasks)
    event = {"worker": A, "token": TOKEN, "tail": [0], "indices": [0, 1], "chunk_type": "numpy"}
    plugin.log_event(m.StageDone.op, event)
    assert (key in plugin.eager._staged) == (state == "processing")


def test_the_scheduler_keeps_no_stage_task_event_once_read(client):
    """distributed keeps the last ``low-level-log-length`` events of every topic, and a stage task's
    event carries the indices of its chunks (thousands, one stage task per worker: 145 kB an event
    at 8192 chunks over 2 workers, kept for the session): the plugin drops them once read."""
    _rechunk_a_persisted_input(seed=4)
    assert client.run_on_scheduler(_stage_done_events) == 0


def _rechunk_a_persisted_input(seed: int) -> None:
    """A persisted input rechunked by the collective (one stage task per worker), checked."""
    import dask.array as da
    import numpy as np
    from distributed import wait

    import dask_redist

    x = da.random.default_rng(seed).random((24, 12, 10), chunks=(2, 12, 10)).persist()
    wait(x)
    with dask_redist.enable(engine="dask", min_bytes=0):
        y = x.rechunk((24, 2, 10)).persist()
        wait(y)
    np.testing.assert_array_equal(y.compute(), x.compute())


def _stage_done_events(dask_scheduler=None) -> int:
    return len(dask_scheduler.get_events(m.StageDone.op))
