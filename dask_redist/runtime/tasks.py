"""The functions the collective's tasks run on the workers (the graph refers to these).

* ``stage``: keeps the chunks in the worker's collective state, returns markers;
* ``barrier``: makes sure the plugins are registered, asks the scheduler to start a run;
* ``unpack``: a coroutine (distributed runs it on the worker's event loop), waits for the
  run and returns one output chunk.

The scheduler plugin is registered by the first barrier that reaches a scheduler
(`ensure_plugins`), and registers the worker plugin on every worker: users call no
setup function, and a cluster that never rechunks carries no plugin. The pair is
built here only (`plugins`, `register`): ``status()``, ``bootstrap()`` and the
scheduler preload register the same.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from distributed import get_worker
from distributed.protocol.pickle import dumps
from distributed.utils import run_in_executor_with_context, set_thread_state

from dask_redist.compat import default_client
from dask_redist.config import process_barrier_timeout
from dask_redist.core.spec import CollectiveSpec, Staged
from dask_redist.errors import RedistError
from dask_redist.runtime.scheduler import RedistSchedulerPlugin
from dask_redist.runtime.transport import call_on_loop
from dask_redist.runtime.worker_plugin import RedistWorkerPlugin, get_state

_registered: set[str] = set()  # scheduler addresses where this process registered the plugins


def stage(
    token: str, tail: tuple, indices: list[int], shapes: list, output_type: str, *chunks
) -> list[Staged]:
    worker = _worker()
    # (before the first barrier too: the plugins drop staged chunks whose rechunk fails or is
    # cancelled before its barrier ran; without them those chunks stayed held for good)
    ensure_plugins(worker)
    return get_state(worker).stage(token, tail, indices, shapes, chunks, output_type)


def barrier(spec: CollectiveSpec, *markers) -> int:
    worker = _worker()
    ensure_plugins(worker, spec.settings.barrier_timeout)
    return get_state(worker).barrier(spec, markers)


async def unpack(token: str, index: int, run_id: int):
    return await get_state(_worker()).unpack(token, index, run_id)


async def unpack_into(token: str, index: int, run_id: int, consumer: tuple, *others):
    """``unpack``, then the consumer task fused into it (`graph.fuse`) on the chunk: ``consumer``
    is (the task, the chunk's key in it, the keys of ``others``, its other inputs, this task's
    key). The consumer runs in the worker's thread pool, as a task of its own would
    (`_as_a_task`), CuPy's too: a step that blocks (a copy to the host, a lock, a client's
    ``result()``) must not stall the event loop the run and the worker's comms need."""
    worker = _worker()
    task, chunk_key, keys, key = consumer
    chunk = await get_state(worker).unpack(token, index, run_id)
    if chunk is None:  # (a stale run: this result goes nowhere)
        return None
    values = {chunk_key: chunk, **dict(zip(keys, others))}
    try:
        return await run_in_executor_with_context(
            worker.executors["default"], _as_a_task, worker, key, task, values
        )
    except BaseException as error:
        # (the step failed, or this task was cancelled: the chunk stays for a retry of this task,
        # as a task's input would)
        get_state(worker).put_back(token, index, run_id, chunk)
        if isinstance(error, Exception):  # (the step's own error again, its frames from its code on)
            raise error.with_traceback(_the_steps_frames(error.__traceback__))  # noqa: B904
        raise


#: where the frames between this task and its fused step's code come from (the thread pool's
#: hand-off, `_as_a_task`, dask's task spec), left out of a failed step's traceback as
#: distributed leaves its own out of a task's (`distributed.utils.get_traceback`)
_HAND_OFF = (
    __file__,
    os.path.join("distributed", "utils.py"),
    os.path.join("distributed", "_concurrent_futures_thread.py"),
    os.path.join("concurrent", "futures"),
    os.path.join("dask", "_task_spec"),
)


def _the_steps_frames(tb):
    """``tb`` from the first frame of the fused step's own code on (all of it where every frame is
    a hand-off's): the user's error reads as that of a task of its own."""
    first = tb
    while first is not None and any(part in first.tb_frame.f_code.co_filename for part in _HAND_OFF):
        first = first.tb_next
    return first or tb


def _as_a_task(worker, key, function, *args):
    """``function(*args)`` in a thread of the worker's pool, with the state distributed gives the
    thread of task ``key`` (`distributed.worker._run_task`; the context, with `get_worker`, is the
    caller's: `distributed.utils.run_in_executor_with_context`): so that ``get_client``,
    ``worker_client`` and ``secede`` work in a fused consumer as in a task of its own."""
    ident = threading.get_ident()
    with worker.active_threads_lock:
        worker.active_threads[ident] = key
    try:
        with set_thread_state(start_time=time.time(), execution_state=worker.execution_state, key=key):
            return function(*args)
    finally:
        with worker.active_threads_lock:
            worker.active_threads.pop(ident, None)


def _worker():
    try:
        return get_worker()
    except ValueError:
        raise RedistError(_not_on_a_worker()) from None


def _not_on_a_worker() -> str:
    """What to do about a collective task run outside a distributed worker: with no Client, make
    one; with one, the graph went to a local scheduler instead of it (``scheduler="sync"``)."""
    if default_client() is None:
        return (
            "dask-redist's collective rechunk runs on a distributed cluster: create a "
            "distributed.Client (e.g. on a LocalCluster or LocalCUDACluster) before computing"
        )
    return (
        "dask-redist's collective rechunk runs on a distributed cluster, and this graph was computed "
        "on a local scheduler although a distributed Client exists (compute(scheduler=...), or dask's "
        "'scheduler' setting, as dask.array.utils.assert_eq sets 'sync'): compute it through the Client "
        "(no scheduler= argument, or scheduler=client)"
    )


def plugins() -> RedistSchedulerPlugin:
    """The scheduler plugin, carrying the worker plugin it registers on every worker."""
    return RedistSchedulerPlugin(worker_plugin=RedistWorkerPlugin())


async def register(scheduler) -> None:
    """Register `plugins` with ``scheduler`` (a Scheduler, or an rpc to one); a plugin already
    there stays (idempotent)."""
    plugin = plugins()
    await scheduler.register_scheduler_plugin(plugin=dumps(plugin), name=plugin.name, idempotent=True)


def ensure_plugins(worker, timeout: float | None = None) -> None:
    """Register the scheduler plugin (which registers the worker plugin) once per scheduler, and
    return once the worker plugin is on ``worker`` (``timeout``: this process's
    ``redist.timeouts.barrier`` unless given, `process_barrier_timeout`). Workers of one process (``processes=False``)
    share the registration, not the worker plugin: each waits for its own."""
    address = worker.scheduler.address
    if address in _registered and RedistWorkerPlugin.name in worker.plugins:
        return
    timeout = process_barrier_timeout() if timeout is None else timeout

    async def register_here():
        await register(worker.scheduler)
        # Another worker's stage task may have registered it a moment ago, its start still
        # adding the worker plugin (`RedistSchedulerPlugin.start`): until it is here, a stage
        # task cancelled while it ran would keep its chunks for good.
        while RedistWorkerPlugin.name not in worker.plugins:
            await asyncio.sleep(0.01)

    for attempt in range(3):  # a comm can break while workers come and go
        try:
            call_on_loop(
                worker,
                register_here,
                timeout,
                "registering the dask-redist plugins (redist.timeouts.barrier)",
            )
            break
        except OSError:
            if attempt == 2:
                raise
            time.sleep(0.5)
    _registered.add(address)
