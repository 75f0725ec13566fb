"""The cufftmp engine on dask-cuda workers (marker ``gpu``; skipped without GPUs).

Run on the GPU node as docs/gpu-testing.md says. Every case builds CuPy chunks
with known values on chosen workers, rechunks them with a plain ``x.rechunk``
under ``dask_redist.enable()``, checks every output chunk on the workers, and
checks in the scheduler's history that the run went through cufftmp.
"""

from __future__ import annotations

import contextlib
import math

import dask.array as da
import numpy as np
import pytest
import conftest
from conftest import scheduler_history
from gpu_helpers import case, engine_health, kill_one_worker, worker_pid
from distributed import futures_of, wait

import dask_redist
from dask_redist.bench import Case, check, contiguous, engine_stats, placed_array

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_client():
    yield from conftest.gpu_client()


def run_case(client, case: Case, placement=contiguous, seed=1, kind="cupy", expect="cufftmp", **options):
    """``case`` rechunked under ``options``, its values checked, every run of it done on ``expect``."""
    x = placed_array(client, case, seed, kind=kind, placement=placement)
    before = len(scheduler_history(client))
    with dask_redist.enable(**options):
        y = x.rechunk(case.new).persist()
        wait(y)
    assert check(y, case, seed), f"{case.name}: values differ"
    runs = scheduler_history(client)[before:]
    assert runs and all(r["engine"] == expect and r["outcome"] == "done" for r in runs), runs
    return y


CASES = [
    case((64, 48, 32), (8, 48, 32), (64, 6, 32), name="slab->slab"),
    case((60, 50, 40), (7, 50, 40), (60, 11, 40), name="uneven slabs"),
    case((32, 32, 32), (8, 8, 32), (32, 8, 8), name="pencil->pencil"),
    case((12, 10, 8, 6), (3, 10, 8, 6), (12, 10, 2, 6), name="4-D"),
    case((6, 5, 4, 3, 8), (2, 5, 4, 3, 8), (6, 5, 4, 1, 8), name="5-D"),
    case((64, 48), (8, 48), (64, 6), "float16", name="float16"),
    case((40, 30, 20), (5, 30, 20), (40, 3, 20), "complex128", name="complex128"),
    case((50, 50), (3, 50), (50, 7), "int8", name="int8, many chunks per worker"),
    case((1000,), (7,), (33,), "float32", name="1-D uneven"),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_cufftmp_equals_numpy(gpu_client, c):
    run_case(gpu_client, c, engine="cufftmp")


def test_auto_picks_cufftmp_for_cupy(gpu_client):
    run_case(gpu_client, CASES[0], engine="auto")
    assert "CuPy chunks" in scheduler_history(gpu_client)[-1]["why"]


def two_workers(client):
    if len(client.scheduler_info()["workers"]) < 2:
        pytest.skip("needs 2 workers: REDIST_TEST_GPUS=2, or REDIST_TEST_PES=2 on one GPU")


def _set_local_max(n):
    from dask_redist.engines.cufftmp import engine

    old, engine.LOCAL_MAX_PIECES = engine.LOCAL_MAX_PIECES, n
    return old


@contextlib.contextmanager
def arena_rounds(client):
    """A world of one PE (REDIST_TEST_GPUS=1) copies chunk to chunk without rounds: the tests of
    rounds take the arena's rounds there too, as on several GPUs."""
    old = client.run(_set_local_max, -1)
    try:
        yield
    finally:
        client.run(_set_local_max, max(old.values()))


def test_placement_that_is_not_box_shaped(gpu_client):
    two_workers(gpu_client)
    # round robin: every worker holds every other slab -> packed layout (on the heap: PEs sharing
    # a GPU would copy chunk to chunk, tests/test_gpu_peers.py)
    heap = {"nvshmem": {"shared-gpu-copies": False}}
    run_case(gpu_client, CASES[0], placement=lambda i, n, w: i % w, engine="cufftmp", **heap)
    run_case(gpu_client, CASES[3], placement=lambda i, n, w: (i * 7 + 3) % w, engine="cufftmp", **heap)


def test_rounds_when_the_run_exceeds_the_budget(gpu_client):
    c = case((128, 64, 64), (16, 64, 64), (128, 8, 64), name="4 MiB in rounds")
    with arena_rounds(gpu_client):
        run_case(gpu_client, c, engine="cufftmp", memory_budget="1MiB")  # direct, in slabs
    heap = {"nvshmem": {"shared-gpu-copies": False}}  # (PEs sharing a GPU: the heap's rounds too)
    run_case(
        gpu_client, c, placement=lambda i, n, w: i % w, engine="cufftmp", memory_budget="1MiB", **heap
    )  # packed


@pytest.mark.parametrize("c", [CASES[0], CASES[1], CASES[3], CASES[6]], ids=lambda c: c.name)
def test_numpy_chunks_through_the_gpus(gpu_client, c):
    """NumPy chunks on dask-cuda workers with redist.engine=cufftmp: NumPy out, equal to NumPy
    (the 4-D case takes the one-copy-per-box path, the others the batched kernel)."""
    y = run_case(gpu_client, c, kind="numpy", engine="cufftmp")
    assert type(y.blocks[(0,) * y.ndim].compute()) is np.ndarray


def test_auto_takes_numpy_chunks_through_the_gpus_from_a_size_on(gpu_client):
    """redist.engine=auto: NumPy chunks of at least redist.numpy-via-gpus go through cufftmp
    (NumPy out), smaller ones take the dask engine; the history says why."""
    c = CASES[0]  # 768 KiB
    y = run_case(gpu_client, c, seed=5, kind="numpy", engine="auto", numpy_via_gpus="512KiB")
    assert type(y.blocks[(0,) * y.ndim].compute()) is np.ndarray
    assert "NumPy chunks of at least redist.numpy-via-gpus" in scheduler_history(gpu_client)[-1]["why"]
    x = placed_array(gpu_client, c, 6, kind="numpy")
    with dask_redist.enable(engine="auto", numpy_via_gpus="1MiB"):
        y = x.rechunk(c.new).persist()
        wait(y)
    assert check(y, c, 6)
    last = scheduler_history(gpu_client)[-1]
    assert last["engine"] == "dask" and "below redist.numpy-via-gpus" in last["why"], last


def test_numpy_chunks_in_rounds_keep_gpu_memory_to_a_round(gpu_client):
    """A 32 MiB NumPy array in 1 MiB rounds: CuPy's pool never holds more than a fraction of it
    (each round uploads only its parts), direct and packed; results equal."""
    c = case((256, 128, 128), (32, 128, 128), (256, 16, 128), name="32 MiB NumPy in rounds")

    def pool_bytes(free=False):
        import cupy

        pool = cupy.get_default_memory_pool()
        if free:
            pool.free_all_blocks()
        return pool.total_bytes()

    placements = [contiguous] + (
        [lambda i, n, w: i % w] if len(gpu_client.scheduler_info()["workers"]) > 1 else []
    )
    for placement in placements:  # direct, then packed
        gpu_client.run(pool_bytes, True)
        run_case(gpu_client, c, placement=placement, kind="numpy", engine="cufftmp", memory_budget="1MiB")
        held = gpu_client.run(pool_bytes)
        assert max(held.values()) < c.nbytes // 4, held


def test_several_rechunks_in_a_row_reuse_the_arena_and_plans(gpu_client):
    with arena_rounds(gpu_client):
        run_case(gpu_client, CASES[0], seed=2, engine="cufftmp")
        before = engine_stats(gpu_client, "cufftmp")
        for seed in range(3, 7):
            run_case(gpu_client, CASES[0], seed=seed, engine="cufftmp")
        after = engine_stats(gpu_client, "cufftmp")
    for w in before:
        assert after[w]["runs"] == before[w]["runs"] + 4
        assert after[w]["plans"] == before[w]["plans"]  # plans are cached by geometry


def test_rechunk_inside_a_cupy_pipeline(gpu_client):
    import cupy

    c = case((64, 32, 16), (8, 32, 16), (64, 4, 16), name="pipeline")
    x = placed_array(gpu_client, c, 3, kind="cupy")
    with dask_redist.enable(engine="cufftmp"):
        z = ((x * 2).rechunk(c.new) + 1).sum(axis=1)
        got = z.compute()
    a = x.compute()
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_allclose(cupy.asnumpy(got), cupy.asnumpy((a * 2 + 1).sum(axis=1)))


def test_bootstrap_is_paid_once(gpu_client):
    info = dask_redist.bootstrap(gpu_client)
    assert set(info) == set(gpu_client.scheduler_info()["workers"])  # one entry per worker
    assert all(s["bootstrap_s"] is not None for s in info.values())
    assert math.isfinite(max(s["bootstrap_s"] for s in info.values()))


def test_mixed_numpy_and_cupy_chunks_fail_clearly(gpu_client):
    import cupy

    def some_on_gpu(block, block_id=None):
        return cupy.asarray(block) if block_id[0] % 2 else block

    x = da.ones((16, 16), chunks=(4, 16)).map_blocks(some_on_gpu, dtype=float)
    with dask_redist.enable(engine="auto"), pytest.raises(TypeError, match="mixed types"):
        x.rechunk((16, 4)).compute()


@pytest.mark.parametrize(
    "inputs, output_type", [("mixed", "numpy"), ("mixed", "cupy"), ("numpy", "cupy"), ("cupy", "numpy")]
)
def test_output_type_converts_the_chunks(gpu_client, inputs, output_type):
    """redist.output-type: every input chunk converted when staged, mixed inputs included; the
    outputs are of that type and equal; dask_redist.rechunk gives the array that meta."""
    import cupy

    def placed(block, block_id=None):
        on_gpu = inputs == "cupy" or (inputs == "mixed" and block_id[0] % 2)
        return cupy.asarray(block) if on_gpu else block

    a = np.arange(64 * 48, dtype="float64").reshape(64, 48)
    x = da.from_array(a, chunks=(8, 48)).map_blocks(placed, dtype=float).persist()
    wait(x)
    xp = cupy if output_type == "cupy" else np
    with dask_redist.enable(engine="auto", output_type=output_type):
        y = x.rechunk((64, 6)).persist()
        wait(y)
    from distributed import futures_of

    blocks = gpu_client.gather(futures_of(y))
    assert {type(b) for b in blocks} == {xp.ndarray}, {type(b) for b in blocks}
    got = y.compute()
    np.testing.assert_array_equal(cupy.asnumpy(got) if output_type == "cupy" else got, a)
    z = dask_redist.rechunk(x, (64, 6), output_type=output_type)
    assert type(z._meta) is xp.ndarray


def test_raw_redistribute(gpu_client):
    """The benchmark's reference point works: nvmath's own Redistribute, in processes of its own
    (as many as the cluster has workers, sharing the GPUs as the workers do)."""
    two_workers(gpu_client)
    pytest.importorskip("torch")  # (nvmath bootstraps NVSHMEM through torch's gloo group there)
    from dask_redist.bench.baselines import raw_redistribute

    # next to a cluster whose workers hold an NVSHMEM world, as in the benchmark
    run_case(gpu_client, CASES[0], seed=9, engine="cufftmp")
    times, correct = raw_redistribute((64, 48, 32), "float64", seed=3, reps=2)
    assert correct and len(times) == 2 and all(t > 0 for t in times)


def test_the_link_ceiling():
    cupy = pytest.importorskip("cupy")
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("the peer-copy ceiling needs 2 GPUs visible to this process")
    from dask_redist.bench.baselines import link_ceiling

    ceiling = link_ceiling(nbytes=2**26, reps=2)
    assert ceiling["peer GB/s per direction"] > 0 and ceiling["local copy GB/s (read + write)"] > 0


def _pool_held(drain: bool = False) -> int:
    """Bytes CuPy's pool holds in this worker process (``drain``: hand its free blocks back first).
    Blocks freed during a run stay in the pool, so its growth over a run from a drained pool is the
    run's high-water mark of device allocations in this process (NVSHMEM's heap is not in it)."""
    import cupy

    pool = cupy.get_default_memory_pool()
    if drain:
        cupy.cuda.Device().synchronize()
        pool.free_all_blocks()
    return int(pool.total_bytes())


def _held_bytes(keys, dask_worker=None) -> int:
    return sum(int(dask_worker.data[k].nbytes) for k in keys if k in dask_worker.data)


def test_peak_gpu_memory_per_worker_is_its_outputs_plus_a_tenth(gpu_client):
    """Per worker (per PE where several share a GPU), a cufftmp run adds at most its output chunks
    + 10% (+ 16 MiB of small buffers) to the device memory CuPy holds: no whole-array temporaries.
    The staging goes through the arena on NVSHMEM's heap, whose size is reported."""
    from distributed import futures_of

    c = case((256, 256, 512), (32, 256, 512), (256, 32, 512), name="256 MiB")
    x = placed_array(gpu_client, c, 7, kind="cupy")
    dask_redist.bootstrap(gpu_client)  # (the arena and plans of bootstrap are not this run's)
    before = gpu_client.run(_pool_held, True)
    with dask_redist.enable(engine="cufftmp", memory_budget="64MiB"):
        y = x.rechunk(c.new).persist()
        wait(y)
    added = {w: n - before[w] for w, n in gpu_client.run(_pool_held).items()}
    outputs = gpu_client.run(_held_bytes, [f.key for f in futures_of(y)])
    assert check(y, c, 7)
    assert sum(outputs.values()) == math.prod(c.shape) * 8
    for w, grew in added.items():
        assert grew <= 1.1 * outputs[w] + 16 * 2**20, (w, grew, outputs[w])
    arena = {w: s["last"]["arena bytes"] for w, s in engine_stats(gpu_client, "cufftmp").items()}
    print(f"per worker: CuPy pool grew {added}, outputs {outputs}, arena {arena}")


# Order matters below: these change the worker set of the module's cluster.


#: Longest a held rank waits for the abort (`held_after_a_round`): below the watchdog's limit
#: (``redist.timeouts.collective`` + 10 s) also where check.sh sets the timeout to 30 s.
HOLD_S = 20.0


def _hold_after_a_round(seconds: float) -> None:
    """On this worker: the cufftmp engine's next run, once its first round is queued, waits
    before the next one until the run is aborted (at most ``seconds``), then goes on as ever."""
    import time

    from dask_redist.engines import get_engine

    rounds = get_engine("cufftmp").rounds
    queue_next = type(rounds).next_round
    held: list = []

    def next_round(run):
        if rounds.pending and not held:  # a round is on the GPU, the next not queued yet
            held.append(run.name())
            deadline = time.monotonic() + seconds
            while run.state != "failed" and time.monotonic() < deadline:
                time.sleep(0.001)
        return queue_next(rounds, run)

    rounds.next_round, rounds.held = next_round, held  # (instance attributes: `_release` drops them)


def _held() -> list:
    from dask_redist.engines import get_engine

    return list(getattr(get_engine("cufftmp").rounds, "held", []))


def _release() -> None:
    from dask_redist.engines import get_engine

    for name in ("next_round", "held"):
        vars(get_engine("cufftmp").rounds).pop(name, None)


@contextlib.contextmanager
def held_after_a_round(client, worker: str):
    """``worker`` holds the next GPU run after its first round until the run is aborted: a
    cancel then lands mid-run whatever the run's speed (1 PE or 8 sharing a busy GPU); the
    other ranks queue their rounds ahead and wait for it, as behind a slow peer."""
    client.run(_hold_after_a_round, HOLD_S, workers=[worker])
    try:
        yield
    finally:
        client.run(_release, workers=[worker])


def test_a_cancel_mid_run_is_completed_dry_and_costs_no_worker(gpu_client):
    """A persist cancelled while its rounds are on the GPUs (1 GiB in 1 MiB rounds): every rank
    queues the rest of the run's reshapes with their copies skipped (dask_redist.engines.rounds),
    the run is recorded cancelled, no worker process is replaced, no engine is broken or stuck,
    and the next rechunk runs on cufftmp, right. One worker holds the run after its first round
    until the abort reaches it (`held_after_a_round`): the cancel lands mid-run, with the ranks
    at different rounds, at any number of PEs and however fast the run."""
    import time

    c = case((512, 512, 512), (64, 512, 512), (512, 64, 512), name="1 GiB in many rounds")
    x = placed_array(gpu_client, c, 5, kind="cupy")
    dask_redist.bootstrap(gpu_client)
    pids = gpu_client.run(worker_pid)
    slow = sorted(pids)[0]
    with (
        dask_redist.enable(engine="cufftmp", memory_budget="1MiB"),
        arena_rounds(gpu_client),
        held_after_a_round(gpu_client, slow),
    ):
        y = x.rechunk(c.new).persist()
        deadline = time.monotonic() + 120
        while not gpu_client.run(_held, workers=[slow])[slow]:
            for f in futures_of(y):  # (its input could not be made: that error, not a timeout)
                if f.status == "error":
                    f.result()
            assert time.monotonic() < deadline, (
                f"the run never queued its second round: {scheduler_history(gpu_client)[-1:]}"
            )
            time.sleep(0.01)
        assert gpu_client.run(engine_health, workers=[slow])[slow][
            "in flight"
        ]  # its first round is on the GPU
        gpu_client.cancel(y)
        del y
        while (scheduler_history(gpu_client) or [{"outcome": None}])[-1]["outcome"] != "cancelled":
            assert time.monotonic() < deadline, scheduler_history(gpu_client)[-1:]
            time.sleep(0.05)
    time.sleep(15)  # past the drain (5 s) and the watchdog's grace (10 s): a stuck worker has exited by now
    assert gpu_client.run(worker_pid) == pids
    health = gpu_client.run(engine_health)
    assert all(h == {"broken": None, "stuck": False, "in flight": False} for h in health.values()), health
    del x
    run_case(gpu_client, CASES[0], seed=23, engine="cufftmp")


def test_worker_loss_then_rebootstrap(gpu_client):
    """A dead PE breaks the NVSHMEM world: later GPU rechunks use the dask engine; bootstrap
    names the stranded survivor, and with restart_broken=True restarts it and forms a new world."""
    two_workers(gpu_client)
    run_case(gpu_client, CASES[0], seed=11, engine="auto")  # NVSHMEM world = the current workers
    kill_one_worker(gpu_client)

    x = placed_array(gpu_client, CASES[0], 12, kind="cupy")
    with dask_redist.enable(engine="auto"):
        y = x.rechunk(CASES[0].new).persist()
        wait(y)
        explained = dask_redist.explain(x.rechunk(CASES[0].new))
    assert check(y, CASES[0], 12)
    last = scheduler_history(gpu_client)[-1]
    fallback = "hybrid" if conftest.gpu_hosts() > 1 else "dask"  # (CuPy chunks on 2 pseudo-hosts)
    assert last["engine"] == fallback and "NVSHMEM" in last["why"], last
    assert explained[0].engine.startswith(fallback)

    with pytest.raises(dask_redist.RedistError, match="restart_broken"):
        dask_redist.bootstrap(gpu_client)
    info = dask_redist.bootstrap(gpu_client, restart_broken=True)
    assert all(s["bootstrap_s"] is not None for s in info.values())
    run_case(gpu_client, CASES[1], seed=13, engine="auto")  # cufftmp again (run_case checks the engine)


def test_worker_killed_during_a_cufftmp_run(gpu_client):
    """Killed mid-run: the rechunk still completes, correctly, on the dask engine; then a new
    world forms and cufftmp runs again."""
    two_workers(gpu_client)
    import threading
    import time

    import cupy

    c = case((512, 512, 512), (64, 512, 512), (512, 64, 512), name="1 GiB in many rounds")
    # not placed_array: its chunks are pinned to their workers, so the killed worker's could
    # never be recomputed; these can, anywhere
    x = da.arange(math.prod(c.shape), chunks=512 * 512 * 64, dtype="float64").reshape(c.shape)
    x = x.rechunk(c.old).map_blocks(cupy.asarray).persist()
    wait(x)
    expected = np.arange(math.prod(c.shape), dtype="float64").reshape(c.shape)
    dask_redist.bootstrap(gpu_client)  # so that the kill lands in the exchange, not in NVSHMEM's bootstrap
    before = len(scheduler_history(gpu_client))
    victim = sorted(gpu_client.scheduler_info()["workers"])[0]

    def reshaping():  # on the victim: rounds of the run are on its GPU
        from dask_redist.engines import get_engine

        return get_engine("cufftmp").health().in_flight_since is not None

    def killer():
        deadline = time.monotonic() + 60
        while not gpu_client.run(reshaping, workers=[victim])[victim]:
            assert time.monotonic() < deadline, "the run never had rounds on the GPU"
            time.sleep(0.001)
        killed.append(kill_one_worker(gpu_client, pick=0))

    killed: list = []
    thread = threading.Thread(target=killer)
    # should a worker hang, the watchdog's dead man's switch (faulthandler) ends it, its stacks in the log
    with dask_redist.enable(
        engine="auto",
        memory_budget="1MiB",
        timeouts={"collective": "30s"},
        nvshmem={"shared-gpu-copies": False},  # (rounds on the GPU also where PEs share it)
    ):
        thread.start()
        y = x.rechunk(c.new).persist()
        wait(y)
        thread.join()
    assert killed
    np.testing.assert_array_equal(cupy.asnumpy(y.compute()), expected)
    runs = scheduler_history(gpu_client)[before:]
    assert runs[0]["engine"] == "cufftmp" and runs[0]["outcome"] != "done", runs
    fallback = "hybrid" if conftest.gpu_hosts() > 1 else "dask"  # (CuPy chunks on 2 pseudo-hosts)
    assert runs[-1]["outcome"] == "done" and runs[-1]["engine"] == fallback, runs

    # the survivor either exited (its GPU was stuck in the reshape: redist.nvshmem.exit-when-stuck)
    # or is stranded in the old world: restart_broken covers both
    dask_redist.bootstrap(gpu_client, restart_broken=True)
    run_case(gpu_client, CASES[0], seed=22, engine="auto")


def test_a_pipeline_around_a_rechunk_is_fused_and_equals_numpy(gpu_client):
    """Producer steps in the stage tasks, the consumer in the unpack tasks (`graph.fuse`), on CuPy
    chunks through cufftmp: NumPy's values, and no task of the pipeline's steps of their own."""
    import collections

    import cupy
    from dask.utils import key_split

    a = np.random.default_rng(11).standard_normal((64, 48, 32))
    x = da.from_array(a, chunks=(8, 48, 32)).map_blocks(cupy.asarray, meta=cupy.empty((0, 0, 0))).persist()
    wait(x)
    before = len(scheduler_history(gpu_client))
    # (the tasks this persist added: a test before may have left some of its own)
    earlier = gpu_client.run_on_scheduler(lambda dask_scheduler: set(dask_scheduler.tasks))
    with dask_redist.enable(engine="cufftmp", min_bytes=0):
        y = (((2 * x + 1).rechunk((64, 6, 32))) ** 2).persist()
        wait(y)
        held = gpu_client.run_on_scheduler(
            lambda dask_scheduler: dict(
                collections.Counter(key_split(k) for k in dask_scheduler.tasks if k not in earlier)
            )
        )
        np.testing.assert_allclose(y.compute().get(), (2 * a + 1) ** 2)
        z = ((x * 3).rechunk((64, 6, 32)) + 1).sum(axis=0).compute().get()
    np.testing.assert_allclose(z, (a * 3 + 1).sum(axis=0))
    runs = scheduler_history(gpu_client)[before:]
    assert len(runs) == 2 and all(r["engine"] == "cufftmp" and r["outcome"] == "done" for r in runs), runs
    assert held.pop("pow") == 8 and held.pop("redist-barrier") == 1, held
    assert held.pop("redist-stage") <= len(gpu_client.nthreads()), held


def _asks_its_worker(block):
    """A CuPy step that blocks as a task may: a task of its own submitted from a seceded thread
    (on the worker's event loop, where fused CuPy consumers ran before, this cannot work)."""
    from distributed import get_client, get_worker, worker_client

    assert get_worker().address in get_client().nthreads()
    with worker_client() as c:
        two = c.submit(sum, [1, 1], pure=False).result()
    return block * two


def test_a_fused_cupy_consumer_runs_as_its_own_task_would(gpu_client):
    """A CuPy step fused into the unpack tasks runs in the worker's thread pool, with a task's
    state: ``worker_client`` and a blocking ``result()`` work there."""
    import cupy

    a = np.random.default_rng(12).standard_normal((64, 48, 32))
    x = da.from_array(a, chunks=(8, 48, 32)).map_blocks(cupy.asarray, meta=cupy.empty((0, 0, 0))).persist()
    wait(x)
    with dask_redist.enable(engine="cufftmp", min_bytes=0):
        y = x.rechunk((64, 6, 32)).map_blocks(_asks_its_worker, meta=cupy.empty((0, 0, 0)))
        assert dask_redist.explain(y).entries[0].fused == f"unpack tasks compute {y.name}"
        np.testing.assert_allclose(y.compute().get(), 2 * a)
