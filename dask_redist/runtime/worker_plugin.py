"""The worker plugin: each worker's `WorkerState` (`get_state`), hooked into its comms and its
tasks' transitions by `RedistWorkerPlugin`, which the scheduler plugin registers on every worker."""

from __future__ import annotations

import asyncio
import threading
import weakref

from distributed.diagnostics.plugin import WorkerPlugin

from dask_redist.core import messages as m
from dask_redist.core.spec import stage_token
from dask_redist.engines.exchange import bound_send_buffers
from dask_redist.runtime.transport import flush
from dask_redist.runtime.worker import WorkerState

_states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_states_lock = threading.Lock()


def get_state(worker) -> WorkerState:
    with _states_lock:
        state = _states.get(worker)
        if state is None:
            state = _states[worker] = WorkerState(worker)
        return state


class RedistWorkerPlugin(WorkerPlugin):
    """Hooks the worker's `WorkerState` into its comms; registered by the scheduler plugin."""

    name = "redist"
    idempotent = True

    def __reduce__(self):  # (travels without the worker it was set up on)
        return (type(self), ())

    def setup(self, worker):
        self._worker = worker
        bound_send_buffers(getattr(getattr(worker, "memory_manager", None), "memory_limit", None))
        state = self._state = get_state(worker)
        worker.handlers[m.Pieces.op] = state.handle_receive
        worker.handlers[m.Capabilities.op] = state.handle_capabilities
        worker.handlers[m.WorkerStatus.op] = state.handle_status
        worker.stream_handlers.update(
            {
                m.Start.op: lambda run: state.handle_start(run),
                m.Abort.op: state.handle_abort,
                m.Gone.op: state.handle_gone,
                m.Cleanup.op: state.handle_cleanup,
                m.Forget.op: state.handle_forget,
                m.Drop.op: state.handle_drop,
            }
        )

    def transition(self, key, start, finish, **kwargs):
        """A task's result in memory: a stage task's event goes with it (`WorkerState.stage_finished`),
        and after a run's last unpack the worker's stream is written at once (`WorkerState.take_flush`;
        the callback runs after this transition's own messages are queued).

        A stage task whose key was released while it ran (a cancel) staged its chunks all
        the same once it finished; the scheduler never saw that result, so it will never send
        `handle_drop` for it: drop them here. (A stage task resubmitted meanwhile is resumed,
        not finished from ``cancelled``; replicas removed from memory are the scheduler's.)"""
        state = self._state
        if start == "executing" and finish == "memory" and state.take_flush():
            self._worker.loop.add_callback(flush, self._worker.batched_stream)
        if (token := stage_token(key)) is None:
            return
        if start in ("executing", "cancelled"):
            state.stage_finished(key, start == "executing" and finish == "memory")
        if start == "cancelled" and finish in ("memory", "error", "released", "missing", "rescheduled"):
            state.staging.drop(token, tuple(key[1:]))

    async def teardown(self, worker):
        await asyncio.to_thread(get_state(worker).close)  # (joins the collective thread)
