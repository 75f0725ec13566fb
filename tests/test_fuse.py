"""A rechunk between other steps, fused with them (`dask_redist.graph.fuse`): NumPy's values,
the tasks the scheduler really ran, what keeps its own tasks, and a worker killed mid-run."""

from __future__ import annotations

import collections
import time
import traceback

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import runs_since, scheduler_history, worker_leftovers
from dask.utils import key_split
from distributed import wait
from test_reliability import _in_phase, kill_one_worker, own_cluster  # noqa: F401 (a fixture)

import dask_redist

pytestmark = pytest.mark.filterwarnings("ignore:Sending large graph:UserWarning")


@pytest.fixture
def enabled():
    with dask_redist.enable(engine="dask", min_bytes=0):  # (the cost model would keep small ones for Dask)
        yield


def _prefixes(dask_scheduler) -> dict:
    return dict(collections.Counter(key_split(k) for k in dask_scheduler.tasks))


def tasks_of(client, y, summary=_prefixes):
    """The tasks, by prefix (or as ``summary`` of the scheduler gives them), that the scheduler
    holds for ``y`` persisted (nothing else held)."""
    y = y.persist()
    wait(y)
    held = client.run_on_scheduler(summary)
    del y
    return held


@pytest.fixture
def persisted(client):
    a = np.random.default_rng(1).standard_normal((48, 24, 6))
    x = da.from_array(a, chunks=(4, 24, 6)).persist()
    wait(x)
    yield a, x
    del x


def test_neighbours_run_inside_the_collective_tasks(client, enabled, persisted):
    a, x = persisted
    y = ((2 * x + 1).rechunk((48, 4, 6))) ** 2
    np.testing.assert_allclose(y.compute(), (2 * a + 1) ** 2)
    held = tasks_of(client, y)
    threads = sum(client.nthreads().values())
    # without the rechunk: a task per chunk; with it: what the rechunk alone has (a stage task per thread)
    assert held.pop(y.name[: y.name.rindex("-")]) == 6, held  # unpack tasks under the consumer's keys
    assert held.pop("redist-stage") <= threads and held.pop("redist-barrier") == 1, held
    assert set(held) == {"array"}, held  # (the persisted input)


def test_off_every_step_keeps_its_tasks(client, enabled, persisted):
    a, x = persisted
    with dask.config.set({"redist.fuse": False}):
        y = ((2 * x + 1).rechunk((48, 4, 6))) ** 2
        held = tasks_of(client, y)
        np.testing.assert_allclose(y.compute(), (2 * a + 1) ** 2)
    assert held["redist-stage"] == 12 and held["pow"] == 6 and held["rechunk"] == 6, held


def test_an_output_used_twice_or_requested_keeps_its_unpack_tasks(client, enabled, persisted):
    a, x = persisted
    y = (2 * x).rechunk((48, 4, 6))
    twice = y + y.sum()
    np.testing.assert_allclose(twice.compute(), 2 * a + (2 * a).sum())
    assert tasks_of(client, twice)["rechunk"] == 6
    z = y + 1
    y_held, z_held = dask.persist(y, z)
    wait([y_held, z_held])
    np.testing.assert_allclose(z_held.compute(), 2 * a + 1)
    assert client.run_on_scheduler(_prefixes)["rechunk"] == 6
    del y_held, z_held


def test_a_persisted_output_is_used_not_moved_again(client, enabled, persisted):
    # y persisted, then computed on from y itself (not the persisted copy): Dask computes from the
    # chunks it holds; a consumer fused into the unpack tasks ran the whole rechunk again
    a, x = persisted
    y = (2 * x).rechunk((48, 4, 6))
    assert "unpack tasks compute" in dask_redist.explain(y + 1).entries[0].fused
    y_held = y.persist()
    wait(y_held)
    assert "unpack tasks compute" not in dask_redist.explain(y + 1).entries[0].fused  # (as it runs)
    before = scheduler_history(client)
    np.testing.assert_allclose((y + 1).compute(), 2 * a + 1)
    np.testing.assert_allclose(y.sum(axis=0).compute(), (2 * a).sum(axis=0))
    np.testing.assert_allclose((y - y.mean(axis=0)).compute(), 2 * a - (2 * a).mean(axis=0))
    assert runs_since(client, before) == []
    del y_held


def test_an_annotated_consumer_keeps_its_tasks(client, enabled, persisted):
    a, x = persisted
    y = x.rechunk((48, 4, 6))
    with dask.annotate(retries=2):
        z = y + 1
    np.testing.assert_allclose(z.compute(), a + 1)
    held = tasks_of(client, z)
    assert held["rechunk"] == 6 and held["add"] == 6, held


def test_a_consumer_of_neighbouring_chunks_keeps_its_tasks(client, enabled, persisted):
    a, x = persisted
    z = x.rechunk((48, 4, 6)).map_overlap(lambda b: b * 1.0, depth={1: 1}, boundary="reflect")
    np.testing.assert_allclose(z.compute(), a)


def test_generated_in_the_graph_is_staged_in_shares(client, enabled):
    x = da.random.default_rng(5).standard_normal((64, 16), chunks=(2, 16))
    y = x.rechunk((64, 2)) + 1
    np.testing.assert_allclose(y.compute(), x.compute() + 1)
    threads = sum(client.nthreads().values())
    assert tasks_of(client, y)["redist-stage"] <= threads


@pytest.mark.parametrize("generate", ["default_rng", "RandomState", "from_array", "memmap"])
def test_generated_then_a_step_is_one_task_a_chunk_as_dask_runs_it(client, enabled, generate, tmp_path):
    # Dask fuses the generating task (or the chunk from_array holds) into its one dependent
    # ((2 * g + 1) ** 2: one task a chunk); the stage tasks ran the step only, the generated
    # chunks one task each before them
    if generate == "default_rng":
        g = da.random.default_rng(7).standard_normal((64, 16), chunks=(4, 16))
    elif generate == "RandomState":
        g = da.random.RandomState(7).random_sample((64, 16), chunks=(4, 16))
    elif generate == "from_array":  # (a NumPy array's chunks, held by the graph)
        g = da.from_array(np.random.default_rng(7).standard_normal((64, 16)), chunks=(4, 16))
    else:  # (each chunk read from one object, as from a zarr or HDF5 array)
        np.save(tmp_path / "g.npy", np.random.default_rng(7).standard_normal((64, 16)))
        g = da.from_array(np.load(tmp_path / "g.npy", mmap_mode="r"), chunks=(4, 16))
    expected = (2 * g.compute() + 1) ** 2
    y = (2 * g + 1).rechunk((64, 2)) ** 2
    np.testing.assert_allclose(y.compute(), expected)
    held = tasks_of(client, y)
    threads = sum(client.nthreads().values())
    assert held.pop(y.name[: y.name.rindex("-")]) == 8, held
    assert held.pop("redist-stage") <= threads and held.pop("redist-barrier") == 1, held
    held.pop("original-array", None)  # (memmap: the one object every chunk is read from)
    assert held == {}, held
    (entry,) = dask_redist.explain(y).entries
    assert entry.fused.startswith("stage tasks compute "), entry.fused
    assert generate == "memmap" or entry.fused.startswith(f"stage tasks compute {g.name}, "), entry.fused


STEPS_BEFORE = {
    "2x+1": lambda v: 2 * v + 1,
    "sin": lambda v: np.sin(v) if isinstance(v, np.ndarray) else da.sin(v),
    "square": lambda v: v**2,
    "map_blocks": lambda v: v.map_blocks(lambda b: b[::-1] * 1.0) if isinstance(v, da.Array) else None,
}
STEPS_AFTER = {
    "+3": lambda v: v + 3,
    "abs": lambda v: abs(v),
    "sum0": lambda v: v.sum(axis=0),
    "mean1": lambda v: v.mean(axis=1),
    "cumsum0": lambda v: v.cumsum(axis=0),
}


def _numpy_map_blocks(a, chunks0):
    """NumPy's value of the ``map_blocks`` step: each row block reversed along axis 0."""
    out, start = np.empty_like(a), 0
    for c in chunks0:
        out[start : start + c] = a[start : start + c][::-1]
        start += c
    return out


def random_pipeline(seed: int) -> dict:
    """A random pipeline: chunks in and out, steps before and after the rechunk, persisted or not.
    (Drawn with NumPy, not Hypothesis: the cluster's threads use the random module meanwhile,
    which Hypothesis reports as a strategy's doing.)"""
    rng = np.random.default_rng(seed)
    return dict(
        rows=[int(r) for r in rng.integers(1, 10, rng.integers(1, 7))],
        cols=int(rng.integers(1, 13)),
        new=(int(rng.integers(1, 31)), int(rng.integers(1, 13))),
        before=[str(s) for s in rng.choice(sorted(STEPS_BEFORE), rng.integers(0, 4))],
        after=[str(s) for s in rng.choice(sorted(STEPS_AFTER), rng.integers(0, 3))],
        persist_input=bool(rng.integers(2)),
    )


@pytest.mark.parametrize("seed", range(25))
def test_pipelines_of_random_steps_around_a_rechunk_equal_numpy(client, enabled, seed):
    p = random_pipeline(seed)
    rows, cols = p["rows"], p["cols"]
    a = np.random.default_rng(seed).standard_normal((sum(rows), 2 * cols))
    x = da.from_array(a, chunks=(tuple(rows), cols))
    if p["persist_input"]:
        x = x.persist()
    v, expected = x, a
    for step in p["before"]:
        if step == "map_blocks":
            v, expected = STEPS_BEFORE[step](v), _numpy_map_blocks(expected, rows)
        else:
            v, expected = STEPS_BEFORE[step](v), STEPS_BEFORE[step](expected)
    v = v.rechunk(p["new"])
    for step in p["after"]:
        v, expected = STEPS_AFTER[step](v), STEPS_AFTER[step](expected)
    np.testing.assert_allclose(v.compute(), expected, rtol=1e-10, atol=1e-10, err_msg=str(p))


def test_a_worker_killed_mid_run_recomputes_what_the_fused_consumers_need(own_cluster):  # noqa: F811
    cluster, client = own_cluster
    a = np.random.default_rng(2).standard_normal((60, 40, 8))
    x = da.from_array(a, chunks=(5, 40, 8)).persist()
    wait(x)
    with dask_redist.enable(engine="engines:SlowEngine", min_bytes=0):
        y = ((x * 2).rechunk((60, 4, 8)) + 1).sum(axis=0)
        future = client.compute(y)
        _, killer = kill_one_worker(client, _in_phase(client, "exchange"))
        got = future.result(timeout=120)
    killer.join(5)
    np.testing.assert_allclose(got, (a * 2 + 1).sum(axis=0))
    outcomes = [h["outcome"] for h in scheduler_history(client)]
    assert "restarted" in outcomes and outcomes[-1] == "done", outcomes


def test_explain_says_what_is_fused(client, enabled, persisted):
    a, x = persisted
    producer = 2 * x + 1
    y = producer.rechunk((48, 4, 6)) ** 2
    (entry,) = dask_redist.explain(y).entries
    assert entry.fused == f"stage tasks compute {producer.name}; unpack tasks compute {y.name}", entry
    (alone,) = dask_redist.explain(x.rechunk((48, 4, 6))).entries
    assert alone.fused == "" and "fused" not in str(dask_redist.explain(x.rechunk((48, 4, 6))))
    with dask.config.set({"redist.fuse": False}):
        assert dask_redist.explain(y).entries[0].fused == ""


def test_a_step_between_two_rechunks_is_computed_once(client, enabled, persisted):
    a, x = persisted
    y = (x.rechunk((48, 4, 6)) + 1).rechunk((4, 24, 6)) * 2
    np.testing.assert_allclose(y.compute(), (a + 1) * 2)
    held = tasks_of(client, y)
    assert held["redist-barrier"] == 2, held


def test_the_explicit_form_is_fused_with_its_neighbours_too(client, enabled, persisted):
    a, x = persisted
    y = dask_redist.rechunk(2 * x + 1, (48, 4, 6)) ** 2
    np.testing.assert_allclose(y.compute(), (2 * a + 1) ** 2)
    held = tasks_of(client, y)
    assert held.pop("pow") == 6 and held.pop("redist-barrier") == 1, held
    assert held.pop("redist-stage") <= sum(client.nthreads().values()) and set(held) == {"array"}, held


def test_a_fused_pipeline_cancelled_at_any_moment_leaves_nothing_behind(client, enabled, persisted):
    from distributed.client import FuturesCancelledError
    from test_cluster import _log_problems

    a, x = persisted
    before = len(_log_problems(client))
    for i in range(10):
        y = (((x + i).rechunk((48, 4, 6))) * 2).persist()
        time.sleep(0.003 * i)
        client.cancel(y)
        for _ in range(50):
            y = (((x + i).rechunk((48, 4, 6))) * 2).persist()
            try:
                wait(y, timeout=60)
                break
            except FuturesCancelledError:
                time.sleep(0.05)
        np.testing.assert_allclose(y.compute(), (a + i) * 2)
        del y
    assert _log_problems(client)[before:] == []
    assert worker_leftovers(client) == {}


def test_a_step_after_two_rechunks_is_fused_with_one_of_them(client, enabled, persisted):
    a, x = persisted
    y = x.rechunk((48, 4, 6)) * 2 + (x + 1).rechunk((48, 4, 6))  # one blockwise layer needs both
    np.testing.assert_allclose(y.compute(), a * 2 + a + 1)
    held = tasks_of(client, y)
    assert held["redist-barrier"] == 2 and held["rechunk"] == 6, held  # the other's unpack tasks stay


def test_the_gpu_fft_s_neighbours_are_fused_into_its_collective(client):
    """The GPU path's transform (built here without GPUs: only built, as the client builds it) is
    fused with its producer and consumer by the rewrite on the scheduler, as a rechunk is."""
    from dask_redist.config import Settings
    from dask_redist.core.spec import BarrierTask
    from dask_redist.fft import gpu
    from dask_redist.fft.plan import normalize
    from dask_redist.graph.optimize import rewrite

    x = da.from_array(np.random.default_rng(4).standard_normal((8, 6, 4)) + 0j, chunks=(2, 6, 4))
    producer = 2 * x
    y = gpu.build(producer, normalize(producer.shape, "c2c", False, None, (1, 2), None), None) * 3
    new, decisions = rewrite(y.__dask_graph__(), [y.__dask_keys__()], Settings())
    (fft,) = [d for d in decisions if d.collective and d.spec.fft is not None]
    # (x's chunks, data in the graph, are carried by the stage tasks: `graph.stages._feeders`)
    assert fft.spec.consumer == y.name and set(new.layers) == {y.name}, (fft.spec, set(new.layers))
    layer = new.layers[y.name]
    (barrier,) = [t for t in layer.values() if isinstance(t, BarrierTask)]
    assert barrier.spec.consumer == y.name and barrier.spec.fft is fft.spec.fft
    stages = [t for k, t in layer.items() if isinstance(k, tuple) and k[0] == fft.spec.stage_name]
    assert sorted(i for t in stages for i in t.args[2]) == list(range(x.npartitions))  # (producer inlined)
    assert all(producer.name not in str(d) for t in stages for d in t.dependencies)


def test_explain_says_what_the_rewrite_fuses_where_two_rechunks_meet(client, enabled, persisted):
    """One layer needs both rechunks' outputs: the rewrite fuses it with one of them, and so
    does explain (it said so for both)."""
    a, x = persisted
    y = x.rechunk((48, 4, 6)) * 2 + (x + 1).rechunk((48, 4, 6))
    fused = [e.fused for e in dask_redist.explain(y).entries]
    assert len(fused) == 2 and sum(f"unpack tasks compute {y.name}" in f for f in fused) == 1, fused


def test_a_reduction_over_the_axis_of_one_chunk_runs_inside_the_unpack_tasks(client, enabled, persisted):
    """``x.rechunk(c).mean(axis=0)`` where ``c`` has one chunk along axis 0: the partial means and
    their aggregation (keyed without axis 0) are one task per output chunk, the unpack task."""
    a, x = persisted
    y = x.rechunk((48, 4, 6)).mean(axis=0)
    np.testing.assert_allclose(y.compute(), a.mean(axis=0))
    (entry,) = dask_redist.explain(y).entries
    assert entry.fused.startswith("unpack tasks compute mean_chunk-") and y.name in entry.fused, entry
    held = tasks_of(client, y)
    assert held.pop(key_split(y.name)) == 6 and held.pop("redist-barrier") == 1, held
    assert held.pop("redist-stage") <= sum(client.nthreads().values()) and set(held) == {"array"}, held
    z = (x.rechunk((48, 4, 3)).std(axis=(0, 2)) + 1) * 2  # (one chunk along axis 0, two along axis 2)
    np.testing.assert_allclose(z.compute(), (a.std(axis=(0, 2)) + 1) * 2)
    w = x.rechunk((48, 4, 6)).sum(axis=(0, 2))  # (both dropped axes of one chunk)
    np.testing.assert_allclose(w.compute(), a.sum(axis=(0, 2)))
    assert tasks_of(client, w).get(key_split(w.name)) == 6


def test_a_chain_of_consumers_stops_at_a_layer_asked_for_or_used_twice(client, enabled, persisted):
    a, x = persisted
    doubled = x.rechunk((48, 4, 6)) * 2
    total = doubled.sum(axis=0)
    got_doubled, got_total = dask.compute(doubled, total)
    np.testing.assert_allclose(got_doubled, a * 2)
    np.testing.assert_allclose(got_total, (a * 2).sum(axis=0))
    held_doubled, held_total = dask.persist(doubled, total)
    wait([held_doubled, held_total])
    held = client.run_on_scheduler(_prefixes)
    assert held["mul"] == 6 and held["sum-aggregate"] == 6 and held["redist-barrier"] == 1, held
    del held_doubled, held_total
    twice = doubled.sum(axis=0) + doubled.max()  # (the doubled chunks feed two layers)
    np.testing.assert_allclose(twice.compute(), (a * 2).sum(axis=0) + (a * 2).max())
    assert tasks_of(client, twice)["mul"] == 6


REDUCTIONS = ("max", "mean", "min", "prod", "std", "sum", "var")


def _random_chunks(rng, n: int, at_least_two: bool) -> tuple[int, ...]:
    cuts = sorted(set(rng.integers(1, n, int(rng.integers(1 if at_least_two else 0, n))).tolist()))
    return tuple(int(b - a) for a, b in zip([0, *cuts], [*cuts, n]))


@pytest.mark.parametrize("seed", range(12))
def test_reductions_over_axes_of_one_chunk_after_a_rechunk_equal_numpy_in_one_task_a_chunk(
    client, enabled, seed
):
    """A random reduction over axes the rechunk leaves in one chunk (keepdims or not, a step after
    or not): NumPy's values, and one task per output chunk, the unpack task running the chain."""
    rng = np.random.default_rng(100 + seed)
    shape = tuple(int(n) for n in rng.integers(2, 9, 3))
    whole = sorted(int(a) for a in rng.choice(3, int(rng.integers(1, 3)), replace=False))
    old = tuple(_random_chunks(rng, n, at_least_two=a == whole[0]) for a, n in enumerate(shape))
    new = tuple(n if a in whole else int(rng.integers(1, n + 1)) for a, n in enumerate(shape))
    axes = tuple(
        sorted(int(a) for a in rng.choice(whole, int(rng.integers(1, len(whole) + 1)), replace=False))
    )
    name, keepdims, after = str(rng.choice(REDUCTIONS)), bool(rng.integers(2)), bool(rng.integers(2))
    a = 1 + 0.1 * rng.standard_normal(shape)  # (near 1: prod neither overflows nor vanishes)
    y = getattr(da.from_array(a, chunks=old).rechunk(new), name)(axis=axes, keepdims=keepdims)
    expected = getattr(np, name)(a, axis=axes, keepdims=keepdims)
    if after:
        y, expected = y * 2 + 1, expected * 2 + 1
    case = dict(shape=shape, old=old, new=new, reduction=name, axes=axes, keepdims=keepdims, after=after)
    np.testing.assert_allclose(y.compute(), expected, rtol=1e-10, atol=1e-12, err_msg=str(case))
    held = tasks_of(client, y)
    assert held.pop(key_split(y.name)) == y.npartitions and held.pop("redist-barrier") == 1, (held, case)
    assert set(held) == {"redist-stage"}, (held, case)  # (the chunk step too is inside the unpack tasks)


def test_an_anomaly_runs_inside_the_unpack_tasks_and_a_total_keeps_its_tasks(client, enabled, persisted):
    """``z - z.mean(axis=0)`` over an axis of one chunk: the output feeds two layers, and both,
    with the mean's aggregation, are one task per output chunk. ``z - z.sum()`` needs every chunk
    before any of its own: nothing of it runs inside the unpack tasks."""
    a, x = persisted
    z = x.rechunk((48, 4, 6))
    anomaly = z - z.mean(axis=0)
    np.testing.assert_allclose(anomaly.compute(), a - a.mean(axis=0))
    assert dask_redist.explain(anomaly).entries[0].fused.endswith(anomaly.name)
    held = tasks_of(client, anomaly)
    assert held.pop("sub") == 6 and held.pop("redist-barrier") == 1, held
    assert held.pop("redist-stage") <= sum(client.nthreads().values()) and set(held) == {"array"}, held
    spread = (z - z.mean(axis=0)).std(axis=0)
    np.testing.assert_allclose(spread.compute(), (a - a.mean(axis=0)).std(axis=0))
    assert tasks_of(client, spread)["sqrt"] == 6
    total = z - z.sum()
    np.testing.assert_allclose(total.compute(), a - a.sum())
    assert dask_redist.explain(total).entries[0].fused == ""
    assert tasks_of(client, total)["rechunk"] == 6


def _asks_its_worker(block):
    """A consumer that uses distributed's task helpers: its worker, a client, and a task of its own
    submitted from a seceded thread."""
    from distributed import get_client, get_worker, worker_client

    assert get_worker().address in get_client().nthreads()
    with worker_client() as c:  # (secedes: the thread's task key and start time must be set)
        two = c.submit(sum, [1, 1], pure=False).result()
    return block * two


def test_a_fused_consumer_runs_as_its_own_task_would(client, enabled, persisted):
    """`get_worker`, `get_client` and `worker_client` work in a consumer fused into the unpack
    tasks as in a task of its own (2026-12-06: "No worker found")."""
    a, x = persisted
    y = x.rechunk((48, 4, 6)).map_blocks(_asks_its_worker, meta=a[:0, :0, :0])
    assert dask_redist.explain(y).entries[0].fused == f"unpack tasks compute {y.name}"
    np.testing.assert_allclose(y.compute(), 2 * a)
    assert not worker_leftovers(client)


def _fails_once(block, mark=None, block_info=None):
    """``block + 1``, failing the first time it meets chunk (0, 3) (``mark``: a file, once failed)."""
    import os

    if block_info[0]["chunk-location"] == (0, 3) and not os.path.exists(mark):
        open(mark, "w").close()
        raise RuntimeError("a failure that a retry gets past")
    return block + 1


def test_a_fused_consumer_that_fails_once_is_retried(client, enabled, tmp_path):
    """A step fused into the unpack tasks fails once, under ``retries``: the retry takes its chunk
    again (2026-12-06: "output chunk 3 is not here ... or already taken")."""
    a = np.arange(1200.0).reshape(40, 30)
    mark = str(tmp_path / "failed")
    y = da.from_array(a, chunks=(10, 30)).rechunk((40, 5)).map_blocks(_fails_once, mark=mark, dtype=float)
    assert dask_redist.explain(y).entries[0].fused.endswith(f"unpack tasks compute {y.name}")
    np.testing.assert_array_equal(client.compute(y, retries=2).result(timeout=60), a + 1)
    assert (tmp_path / "failed").exists()
    assert not worker_leftovers(client)
    (tmp_path / "failed").unlink()
    with pytest.raises(RuntimeError, match="a failure that a retry gets past"):
        client.compute(y).result(timeout=60)  # (no retries: the user's error, as Dask's)


def _fails_in_one_chunk(block, block_info=None):
    """``block + 1``, raising the user's own error in output chunk (0, 0), a moment in the others."""
    if block_info[0]["chunk-location"] == (0, 0):
        raise ZeroDivisionError("the user's bug in chunk (0, 0)")
    time.sleep(0.05)
    return block + 1


def test_a_fused_consumer_failing_in_one_chunk_leaves_the_others(client, enabled):
    """A step fused into the unpack tasks raises in one chunk after the exchange: that chunk's
    future gets the user's error, the others their values, as with Dask's own tasks, and status()
    says what failed (2026-12-07: the scheduler aborted the run on that error and every output not
    yet handed over failed with "RedistError: output task ... failed"; status said "failed"
    with the engine's reason)."""
    a = np.arange(4800.0).reshape(40, 120)  # (24 output chunks: more than the workers' threads)
    before = len(scheduler_history(client))
    y = da.from_array(a, chunks=(10, 120)).rechunk((40, 5)).map_blocks(_fails_in_one_chunk, dtype=float)
    assert dask_redist.explain(y).entries[0].fused.endswith(f"unpack tasks compute {y.name}")
    held = y.persist()
    futures = {f.key: f for f in client.futures_of(held)}
    wait(list(futures.values()), timeout=60)
    for key, future in futures.items():
        if key[1:] == (0, 0):
            with pytest.raises(ZeroDivisionError, match="the user's bug"):
                future.result()
        else:
            column = slice(5 * key[2], 5 * key[2] + 5)
            np.testing.assert_array_equal(future.result(), a[:, column] + 1)
    del held, futures
    (run,) = scheduler_history(client)[before:]
    assert run["outcome"] == "outputs failed", run
    assert "failed after the exchange" in run["why"] and "the user's bug" in run["why"], run
    assert client.submit(lambda: 1).result(timeout=30) == 1  # (the cluster is fine)


def _fails_once_per_chunk(block, marks, block_info=None):
    """``block + 1``, failing the first time it meets each chunk (``marks``: a folder, a file a
    chunk once failed)."""
    import os

    mark = os.path.join(marks, "-".join(map(str, block_info[0]["chunk-location"])))
    if not os.path.exists(mark):
        open(mark, "w").close()
        raise OSError("a failure that a retry gets past")
    return block + 1


def test_a_producer_under_retries_keeps_its_own_tasks(client, enabled, persisted, tmp_path):
    """``compute(retries=2)``: Dask retries each chunk's task twice; a producer inlined into a
    stage task of a dozen chunks had one budget for them all (2026-12-07: the user's OSError).
    Under global retries the producer keeps its tasks; without, it runs inside the stage tasks."""
    a, x = persisted
    producer = x.map_blocks(_fails_once_per_chunk, str(tmp_path), dtype=float)
    y = producer.rechunk((48, 4, 6)) * 2
    np.testing.assert_allclose(client.compute(y, retries=2).result(timeout=60), (a + 1) * 2)
    assert len(list(tmp_path.iterdir())) == x.npartitions  # (every chunk failed once)
    assert not worker_leftovers(client)
    with dask.annotate(retries=2):  # (global annotations at submission: the same)
        y = x.map_blocks(_fails_once_per_chunk, str(tmp_path / "again"), dtype=float).rechunk((48, 4, 6))
        (tmp_path / "again").mkdir()
        held = client.persist(y)
        np.testing.assert_allclose(held.compute(), a + 1)
        del held
    assert len(list((tmp_path / "again").iterdir())) == x.npartitions
    y = x.map_blocks(_fails_once_per_chunk, str(tmp_path), dtype=float, name="inlined").rechunk((48, 4, 6))
    assert dask_redist.explain(y).entries[0].fused == "stage tasks compute inlined"
    assert "inlined" not in tasks_of(client, y)  # (no retries: the producer inside the stage tasks)
    np.testing.assert_allclose(y.compute(), a + 1)


def test_the_update_graph_handler_is_wrapped_once_and_shows_its_annotations():
    import asyncio
    import types

    from dask_redist.runtime import submitted

    seen = []

    async def update_graph(client=None, annotations=None, **kwargs):
        seen.append((submitted.annotations(), submitted.retried()))

    scheduler = types.SimpleNamespace(stream_handlers={"update-graph": update_graph})
    assert submitted.install(scheduler) and submitted.install(scheduler)
    wrapped = scheduler.stream_handlers["update-graph"]
    assert wrapped.redist_wrapped is update_graph  # (once)
    asyncio.run(wrapped(client="c", annotations={"retries": 2}))
    asyncio.run(wrapped(client="c"))
    assert seen == [({"retries": 2}, True), ({}, False)]
    assert submitted.annotations() is None and not submitted.retried()  # (outside a call)
    assert not submitted.install(types.SimpleNamespace()) and not submitted.install(
        types.SimpleNamespace(stream_handlers={})
    )


def _fails(block):
    raise ValueError("the step's own error")


def test_a_fused_step_s_error_shows_the_step_s_frames_not_the_hand_off_s(client, enabled, persisted):
    """A step fused into the unpack tasks raises: its traceback goes from the unpack task to the
    step's own code, without the thread pool's hand-off between them (2026-12-07: five frames of
    distributed's and ours, `_as_a_task` among them, before the user's)."""
    a, x = persisted
    y = x.rechunk((48, 4, 6)).map_blocks(_fails, dtype=float)
    assert dask_redist.explain(y).entries[0].fused == f"unpack tasks compute {y.name}"
    with pytest.raises(ValueError, match="the step's own error") as failed:
        y.compute()
    frames = [(f.filename, f.name) for f in traceback.extract_tb(failed.value.__traceback__)]
    remote = frames[[name for _, name in frames].index("unpack_into") :]
    assert [name for _, name in remote] == ["unpack_into", "_fails"], frames
    assert not worker_leftovers(client)
