"""What the bench asks of the workers' GPUs: to finish what they were given before a timer starts
or stops (`gpus_idle`), and the memory a warm-up run added (`gpu_memory_of`, `added_text`)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager, suppress

from dask.utils import format_bytes

#: How often a worker reads what its CuPy arrays hold during a warm-up (`PeakWatch`), in seconds.
WATCH_EVERY_S = 0.001
#: A watch left running (its warm-up failed before `gpu_added`) ends by itself after this long.
WATCH_LIMIT_S = 900.0


def _settle(client, keys: int, timeout: float = 10) -> None:
    """Wait until the scheduler holds only ``keys`` tasks: earlier results are released everywhere."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_task_count) > keys and time.monotonic() < deadline:
        time.sleep(0.05)


def _task_count(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def _gpu_idle() -> None:
    """Wait for this worker's GPU to finish what it was given. A CuPy input's chunks are returned
    by their tasks while the kernels computing them still run (the bench's formula over a large
    input: long enough to count); a method that waits for its inputs (the collective does) would pay for them in its
    time, and one that does not (Dask's rechunk queues its copies and returns) would not."""
    import cupy

    cupy.cuda.Device().synchronize()


def gpus_idle(client, kind: str) -> None:
    """With CuPy chunks (``kind``), wait until every worker's GPU has finished what it was given
    (`_gpu_idle`); nothing with NumPy's."""
    if kind == "cupy":
        client.run(_gpu_idle)


def _gpu_used(reset: bool = False) -> int:
    """Bytes in use on this worker's GPU; ``reset`` first hands CuPy's cached free blocks back."""
    import cupy

    if reset:
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    return int(total - free)


class PeakWatch:
    """The most ``read()`` returned, read on a thread of its own every ``every`` seconds from now
    until `stop` (or ``limit`` seconds): a high-water mark where the reading has none of its own."""

    def __init__(self, read, every: float = WATCH_EVERY_S, limit: float = WATCH_LIMIT_S):
        self._read, self._every = read, every
        self.first = self.peak = read()
        self._deadline = time.monotonic() + limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="redist-bench-peak-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self._every) and time.monotonic() < self._deadline:
            self.peak = max(self.peak, self._read())

    def stop(self) -> int:
        """The highest reading, the one now included."""
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._read())
        return self.peak


_watches: dict[str, PeakWatch] = {}  # on a worker: the watch of the warm-up under way


def _in_cupy_arrays(device: int):
    """A reading of the bytes CuPy's default pool has handed out on ``device`` (its arrays)."""
    import cupy

    def read() -> int:
        with cupy.cuda.Device(device):
            return int(cupy.get_default_memory_pool().used_bytes())

    return read


def _baseline_and_watch() -> int:
    """`_gpu_used` with CuPy's cached blocks handed back, and a watch of the bytes in CuPy arrays
    started (any left by a failed warm-up stopped)."""
    import cupy

    used = _gpu_used(reset=True)
    _stop_watch()
    _watches["arrays"] = PeakWatch(_in_cupy_arrays(cupy.cuda.Device().id))
    return used


def _stop_watch() -> int | None:
    """The most bytes CuPy arrays held beyond those held as the watch began; None without one."""
    watch = _watches.pop("arrays", None)
    return None if watch is None else watch.stop() - watch.first


def _gpu_used_cached_and_peak() -> tuple[int, int, int | None]:
    """Bytes in use on this worker's GPU; of them, the free blocks CuPy's default pool keeps; and
    the most bytes its CuPy arrays held at once beyond the input (`_stop_watch`)."""
    import cupy

    return _gpu_used(), int(cupy.get_default_memory_pool().free_bytes()), _stop_watch()


def gpu_baseline(client, keys: int) -> dict:
    """Per worker, the GPU bytes in use once the scheduler holds only ``keys`` tasks (the run's
    input) and CuPy's cached free blocks are handed back: what `gpu_added` counts from; and the
    watch of what CuPy arrays hold started. Taken before a warm-up run only: the timed runs would
    pay for fresh allocations."""
    _settle(client, keys)
    return client.run(_baseline_and_watch)


def gpu_added(client, r, before: dict) -> None:
    """Set on ``r`` (a `dask_redist.bench.harness.Result`), per worker, the GPU bytes in use now
    beyond ``before`` (`gpu_baseline`): CuPy's pool keeps the blocks a run freed, so about what the
    run needed at its peak; of them, the free blocks the pool keeps (memory the run needed once,
    which later allocations of other sizes may not reuse); and the most its CuPy arrays held at
    once beyond the input, read every `WATCH_EVERY_S` (what the run needs live: a pool that runs
    short hands its free blocks back and tries again). One call to the workers."""
    now = client.run(_gpu_used_cached_and_peak)
    r.peak_gpu_bytes = {w: used - before.get(w, 0) for w, (used, _, _) in now.items()}
    r.gpu_cached_bytes = {w: cached for w, (_, cached, _) in now.items()}
    r.gpu_array_peak_bytes = {w: peak for w, (_, _, peak) in now.items() if peak is not None} or None


@contextmanager
def gpu_memory_of(client, r, keys: int | None):
    """Around a warm-up run on CuPy chunks: `gpu_baseline` before it, `gpu_added` on ``r`` after it;
    a run that fails stops the workers' watches. ``keys``: the tasks the scheduler holds before the
    run (its input); None: nothing measured."""
    if keys is None:
        yield
        return
    before = gpu_baseline(client, keys)
    try:
        yield
    except BaseException:
        with suppress(Exception):  # (the cluster may be why it failed)
            client.run(_stop_watch)
        raise
    gpu_added(client, r, before)


def added_text(added: dict | None, cached: dict | None, arrays: dict | None = None) -> str:
    """The busiest worker's GPU memory added (`gpu_added`), how much of it CuPy's pool kept as free
    blocks after the run, where any, and the most its CuPy arrays held at once, where read."""
    if not added:
        return ""
    w = max(added, key=added.get)
    said = []
    if (kept := (cached or {}).get(w, 0)) > 0:
        said.append(f"{format_bytes(kept)} of it cached free")
    if (live := (arrays or {}).get(w)) is not None:
        said.append(f"CuPy arrays at most {format_bytes(live)} more")
    return format_bytes(added[w]) + (f" ({'; '.join(said)})" if said else "")
