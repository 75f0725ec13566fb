"""PEs sharing one GPU: cufftmp copies every piece from its input chunk straight into its owner's
output chunk through CUDA IPC, without the symmetric heap's rounds (marker ``gpu``; runs with
``REDIST_TEST_GPUS=1 REDIST_TEST_PES=2`` or more, skipped otherwise). Values against NumPy; a
cancel and a kill while a rank is held inside the path; the switch that turns it off."""

from __future__ import annotations

import math
import time

import dask.array as da
import numpy as np
import pytest
from conftest import scheduler_history
from gpu_helpers import case, engine_health, kill_one_worker, layouts_of_a_run, worker_pid
from distributed import wait

import conftest
import dask_redist
from dask_redist.bench import engine_stats, placed_array

pytestmark = pytest.mark.gpu

#: Longest a held rank waits for the abort (below the watchdog's limit).
HOLD_S = 20.0


@pytest.fixture(scope="module")
def shared():
    gpus, pes = conftest.gpu_layout()
    if gpus != 1 or pes < 2:
        pytest.skip("needs several PEs on one GPU: REDIST_TEST_GPUS=1 REDIST_TEST_PES=2 (or more)")
    yield from conftest.gpu_client()


CASES = [
    case((64, 48, 32), (8, 48, 32), (64, 6, 32), name="slabs"),
    case((60, 50, 40), (7, 50, 40), (60, 11, 40), name="uneven slabs"),
    case((32, 32, 32), (8, 8, 32), (32, 8, 8), name="pencils"),
    case((64, 48), (8, 48), (64, 6), "float16", name="float16, 2-D"),
    case((40, 30, 20), (5, 30, 20), (40, 3, 20), "complex128", name="complex128"),
    case((50, 50), (3, 50), (50, 7), "int8", name="int8, many chunks per worker"),
    case((1000,), (7,), (33,), "float32", name="1-D uneven"),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_pes_on_one_gpu_copy_chunk_to_chunk(shared, c):
    assert set(layouts_of_a_run(shared, c, 3)) == {"peers (one GPU: chunk to chunk through CUDA IPC)"}


def test_the_pes_all_gather_through_files(shared):
    """PEs of one machine all-gather through files (engines.cufftmp.hostfiles), not the scheduler."""
    assert set(layouts_of_a_run(shared, CASES[0], 11)) == {"peers (one GPU: chunk to chunk through CUDA IPC)"}
    stats = engine_stats(shared, "cufftmp")
    assert {s["last"]["all-gathers"] for s in stats.values()} == {"files"}, stats


def test_a_placement_that_is_not_box_shaped_copies_chunk_to_chunk(shared):
    got = layouts_of_a_run(shared, CASES[0], 4, placement=lambda i, n, w: (i * 7 + 3) % w)
    assert all(layout.startswith("peers") for layout in got), got


def test_rechunks_after_an_fft_still_copy_chunk_to_chunk(shared):
    """An FFT's leg in writes into the transform's operand, memory of the symmetric heap, which
    CUDA IPC cannot export: that leg takes the heap's rounds, right, and the world's rechunks after
    it still copy chunk to chunk (the refusal was the leg's own, not the world's)."""
    import cupy

    import dask_redist.fft as F

    a = np.random.default_rng(5).standard_normal((64, 48, 40)) + 0j
    meta = cupy.empty((0, 0, 0), dtype=a.dtype)
    x = da.from_array(a, chunks=(16, 48, 40)).map_blocks(cupy.asarray, meta=meta, dtype=a.dtype)
    expected = np.fft.fftn(a)
    np.testing.assert_allclose(
        F.fftn(x).compute().get(), expected, rtol=1e-10, atol=1e-10 * np.abs(expected).max()
    )
    paths = {s["last fft's path"] for s in engine_stats(shared, "cufftmp").values()}
    assert paths == {"cuFFTMp, the leg in into its operand"}, paths
    assert set(layouts_of_a_run(shared, CASES[0], 12)) == {"peers (one GPU: chunk to chunk through CUDA IPC)"}


def test_switched_off_or_in_4_d_the_heaps_rounds_run(shared):
    off = layouts_of_a_run(shared, CASES[1], 5, nvshmem={"shared-gpu-copies": False})
    assert not any(layout.startswith("peers") for layout in off), off
    four_d = case((12, 10, 8, 6), (3, 10, 8, 6), (12, 10, 2, 6), name="4-D")
    assert not any(layout.startswith("peers") for layout in layouts_of_a_run(shared, four_d, 6))
    assert set(layouts_of_a_run(shared, CASES[1], 7)) == {"peers (one GPU: chunk to chunk through CUDA IPC)"}


def _hold_in_gather(call: int, seconds: float) -> None:
    """On this worker: the next run of this path holds before its all-gather number ``call``
    (1: the exported chunks, 2: the agreement that the copies are done) until the run is
    aborted (at most ``seconds``), then goes on as ever."""
    from dask_redist.engines.cufftmp import peers

    real = getattr(peers, "real_gather", peers.gather)
    calls: list = []
    held: list = []

    def gather(run, group, payload):
        calls.append(run.name())
        if len(calls) == call and not held:
            held.append(run.name())
            deadline = time.monotonic() + seconds
            while run.state != "failed" and time.monotonic() < deadline:
                time.sleep(0.001)
        return real(run, group, payload)

    peers.real_gather, peers.gather, peers.held = real, gather, held


def _held() -> list:
    from dask_redist.engines.cufftmp import peers

    return list(getattr(peers, "held", []))


def _release() -> None:
    from dask_redist.engines.cufftmp import peers

    if hasattr(peers, "real_gather"):
        peers.gather = peers.real_gather
        del peers.real_gather, peers.held


def _wait_held(client, worker: str, deadline: float) -> None:
    while not client.run(_held, workers=[worker])[worker]:
        assert time.monotonic() < deadline, f"no run held: {scheduler_history(client)[-1:]}"
        time.sleep(0.01)


def test_a_cancel_while_a_rank_is_held_costs_no_worker(shared):
    """A persist cancelled while one rank holds before sending its chunks (its peers wait for it
    in the all-gather): every rank ends the run, it is recorded cancelled, no worker process is
    replaced, no engine is broken, and the next rechunk copies chunk to chunk again, right."""
    c = case((256, 128, 128), (16, 128, 128), (256, 8, 128), name="32 MiB")
    x = placed_array(shared, c, 8, kind="cupy")
    dask_redist.bootstrap(shared)
    pids = shared.run(worker_pid)
    slow = sorted(pids)[0]
    shared.run(_hold_in_gather, 1, HOLD_S, workers=[slow])
    try:
        with dask_redist.enable(engine="cufftmp"):
            y = x.rechunk(c.new).persist()
            deadline = time.monotonic() + 120
            _wait_held(shared, slow, deadline)
            shared.cancel(y)
            del y
            while (scheduler_history(shared) or [{"outcome": None}])[-1]["outcome"] != "cancelled":
                assert time.monotonic() < deadline, scheduler_history(shared)[-1:]
                time.sleep(0.05)
    finally:
        shared.run(_release)
    time.sleep(12)  # past the watchdog's grace (10 s): a worker that had to go has gone by now
    assert shared.run(worker_pid) == pids
    health = shared.run(engine_health)
    assert all(h == {"broken": None, "stuck": False, "in flight": False} for h in health.values()), health
    del x
    assert set(layouts_of_a_run(shared, CASES[0], 9)) == {"peers (one GPU: chunk to chunk through CUDA IPC)"}


# Last: this changes the module cluster's worker set.


def test_a_rank_killed_before_the_agreement_leaves_no_peer_waiting(shared):
    """A rank killed after its copies, before the all-gather that says they are done: its peers
    stop waiting once the scheduler sees it gone, the rechunk completes, right, on the dask engine
    (the NVSHMEM world lost a PE), and after ``bootstrap(restart_broken=True)`` the PEs copy chunk
    to chunk again."""
    import threading

    import cupy

    c = case((256, 128, 128), (16, 128, 128), (256, 8, 128), name="32 MiB")
    # not placed_array: the killed worker's chunks must be recomputable elsewhere
    x = da.arange(math.prod(c.shape), chunks=16 * 128 * 128, dtype="float64").reshape(c.shape)
    x = x.rechunk(c.old).map_blocks(cupy.asarray).persist()
    wait(x)
    expected = np.arange(math.prod(c.shape), dtype="float64").reshape(c.shape)
    dask_redist.bootstrap(shared)
    before = len(scheduler_history(shared))
    victim = sorted(shared.scheduler_info()["workers"])[0]  # (the one kill_one_worker picks first)
    shared.run(_hold_in_gather, 2, 120.0, workers=[victim])
    killed: list = []

    def killer():
        _wait_held(shared, victim, time.monotonic() + 60)
        killed.append(kill_one_worker(shared, pick=0))

    thread = threading.Thread(target=killer)
    with dask_redist.enable(engine="auto", timeouts={"collective": "30s"}):
        thread.start()
        started = time.monotonic()
        y = x.rechunk(c.new).persist()
        wait(y)
        took = time.monotonic() - started
        thread.join()
    assert killed == [victim]
    np.testing.assert_array_equal(cupy.asnumpy(y.compute()), expected)
    runs = scheduler_history(shared)[before:]
    assert runs[0]["engine"] == "cufftmp" and runs[0]["outcome"] != "done", runs
    assert runs[-1]["outcome"] == "done", runs
    print(f"killed {victim}; the rechunk was done {took:.1f} s after it started; runs: {runs}")
    dask_redist.bootstrap(shared, restart_broken=True)
    assert set(layouts_of_a_run(shared, CASES[2], 10)) == {"peers (one GPU: chunk to chunk through CUDA IPC)"}
