"""Questions to a cluster whose workers may be frozen: bounded calls, and stacks a frozen worker still gives.

A worker whose interpreter is held inside a native call (an NVSHMEM free waiting for a dead PE)
answers nothing: distributed's log and ``run`` calls wait for every worker, so a tool that asks
would freeze with it. `within` bounds any call; `StackDumps` has each worker dump its threads'
stacks on a signal, which `faulthandler` serves without the interpreter lock, and `stacks` has
each worker's nanny (a process of its own) send that signal and read what was written.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import tempfile
import threading
from typing import Callable

from distributed.diagnostics.plugin import WorkerPlugin

#: The signal on which a watched worker dumps its threads' stacks (`StackDumps`).
DUMP_SIGNAL = signal.SIGUSR1


def within(seconds: float, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a helper thread: its result, or TimeoutError after ``seconds``
    (the call is left to finish on its own). Questions to a cluster whose worker may
    be frozen must not freeze the asker: distributed's log and run calls wait for every worker."""
    done, box = threading.Event(), {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: B036 - handed to the caller
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="redist-bounded-call", daemon=True).start()
    if not done.wait(seconds):
        raise TimeoutError(f"{getattr(fn, '__name__', fn)} gave no answer within {seconds:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _stack_file(pid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"dask-redist-stacks-{pid}.txt")


class StackDumps(WorkerPlugin):
    """Watched workers dump every thread's stack into a file on `DUMP_SIGNAL` (`faulthandler`
    writes them without the interpreter lock, so a worker held inside a native call answers)."""

    name = "redist-stack-dumps"
    idempotent = True

    def setup(self, worker):
        self._file = open(_stack_file(os.getpid()), "a")  # noqa: SIM115 - open while registered
        faulthandler.register(DUMP_SIGNAL, file=self._file, all_threads=True)

    def teardown(self, worker):
        faulthandler.unregister(DUMP_SIGNAL)
        self._file.close()


async def _dump_stacks(dask_worker) -> str:
    """On a worker's nanny: signal the worker process to dump its stacks; what it wrote."""
    pid = dask_worker.process.process.pid
    path = _stack_file(pid)
    start = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        os.kill(pid, DUMP_SIGNAL)
    except ProcessLookupError:
        return f"(no stacks: worker process {pid} has ended)"
    await asyncio.sleep(1.0)
    if not os.path.exists(path):
        return "(no stacks: the StackDumps plugin is not set up in this worker)"
    with open(path) as f:
        f.seek(start)
        return f.read() or "(no stacks written within 1 s)"


def stacks(client, timeout: float) -> dict[str, str]:
    """Every worker's thread stacks (workers with `StackDumps` set up), by worker address."""
    return within(timeout, client.run, _dump_stacks, nanny=True)
