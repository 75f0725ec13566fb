"""What the bench asks of the workers' GPUs: to finish what they were given before a timer starts
or stops (`gpus_idle`), and the memory a run added (`gpu_baseline`, `gpu_added`, `added_text`)."""

from __future__ import annotations

import time

from dask.utils import format_bytes


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


def gpu_baseline(client, keys: int) -> dict:
    """Per worker, the GPU bytes in use once the scheduler holds only ``keys`` tasks (the run's
    input) and CuPy's cached free blocks are handed back: what `gpu_added` counts from. Taken
    before a warm-up run only: the timed runs would pay for fresh allocations."""
    _settle(client, keys)
    return client.run(_gpu_used, True)


def _gpu_used_and_cached() -> tuple[int, int]:
    """Bytes in use on this worker's GPU, and of them the free blocks CuPy's default pool keeps."""
    import cupy

    return _gpu_used(), int(cupy.get_default_memory_pool().free_bytes())


def gpu_added(client, r, before: dict) -> None:
    """Set on ``r`` (a `dask_redist.bench.harness.Result`), per worker, the GPU bytes in use now
    beyond ``before`` (`gpu_baseline`): CuPy's pool keeps the blocks a run freed, so about what the
    run needed at its peak; and of them, the free blocks the pool keeps (memory the run needed
    once, which later allocations of other sizes may not reuse). One call to the workers."""
    now = client.run(_gpu_used_and_cached)
    r.peak_gpu_bytes = {w: used - before.get(w, 0) for w, (used, _) in now.items()}
    r.gpu_cached_bytes = {w: cached for w, (_, cached) in now.items()}


def added_text(added: dict | None, cached: dict | None) -> str:
    """The busiest worker's GPU memory added (`gpu_added`), and how much of it CuPy's pool kept as
    free blocks after the run, where any."""
    if not added:
        return ""
    w = max(added, key=added.get)
    kept = (cached or {}).get(w, 0)
    return format_bytes(added[w]) + (f" ({format_bytes(kept)} of it cached free)" if kept > 0 else "")
