"""The collective rechunk end to end on a LocalCluster of worker processes (NumPy)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import local_cluster, scheduler_history, worker_leftovers
from distributed import futures_of, wait
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_redist
from dask_redist.graph.optimize import CollectiveOptimizer
from dask_redist.runtime.worker_plugin import RedistWorkerPlugin


@pytest.fixture
def enabled():
    with dask_redist.enable(engine="dask"):
        yield


def chunking(n: int, draw) -> tuple[int, ...]:
    """A random chunking of an axis of length n (uneven, possibly one chunk)."""
    if n == 0:
        return (0,)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 5)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


@st.composite
def rechunks(draw):
    ndim = draw(st.integers(1, 5))
    budget = 6 if ndim > 3 else 20
    shape = tuple(draw(st.integers(1, budget)) for _ in range(ndim))
    old = tuple(chunking(n, draw) for n in shape)
    new = tuple(chunking(n, draw) for n in shape)
    return shape, old, new


def data_for(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if np.dtype(dtype) == bool:
        return rng.random(n).reshape(shape) > 0.5
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).reshape(shape).astype(dtype)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-100, 100, n).reshape(shape).astype(dtype)
    return rng.standard_normal(n).reshape(shape).astype(dtype)


def runs_done(client) -> int:
    return sum(h["outcome"] == "done" for h in scheduler_history(client))


@settings(
    max_examples=int(os.environ.get("REDIST_TEST_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(case=rechunks(), dtype=st.sampled_from(["float64", "int8", "complex128"]))
def test_generated_chunkings_equal_numpy(client, enabled, case, dtype):
    shape, old, new = case
    a = data_for(shape, dtype)
    x = da.from_array(a, chunks=old)
    y = x.rechunk(new)
    before = runs_done(client)
    np.testing.assert_array_equal(y.compute(), a)
    if y.chunks != x.chunks:
        assert runs_done(client) == before + 1, "the rechunk did not run through the collective"
        assert y.compute().dtype == a.dtype


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "float16", "float32", "float64", "complex128", "U3", "i4,f8"]
)
def test_dtypes(client, enabled, dtype):
    shape = (24, 10, 6)
    if dtype == "U3":
        a = np.array([f"{i % 997:03d}" for i in range(np.prod(shape))]).reshape(shape)
    elif dtype == "i4,f8":
        a = np.zeros(shape, dtype=dtype)
        a["f0"] = np.arange(a.size).reshape(shape)
        a["f1"] = -np.arange(a.size).reshape(shape) / 3
    else:
        a = data_for(shape, dtype, seed=1)
    x = da.from_array(a, chunks=(5, 10, 6))
    np.testing.assert_array_equal(x.rechunk((24, 3, 2)).compute(), a)


def test_rechunk_then_more_operations(client, enabled):
    a = data_for((40, 30, 20), "float64")
    x = da.from_array(a, chunks=(5, 30, 20))
    y = (x.rechunk((40, 6, 20)) * 2 + 1).sum(axis=0)
    np.testing.assert_allclose(y.compute(), (a * 2 + 1).sum(axis=0))


def test_several_rechunks_in_one_graph(client, enabled):
    a = data_for((30, 24), "float32")
    x = da.from_array(a, chunks=(6, 24))
    y = x.rechunk((30, 4))
    z = x.rechunk((10, 8))
    w = (y.rechunk((7, 24)) + z.rechunk((7, 24))).T.rechunk((5, 5))
    before = runs_done(client)
    got = dask.compute(y, z, w)
    for g, e in zip(got, (a, a, (a + a).T)):
        np.testing.assert_array_equal(g, e)
    assert runs_done(client) - before >= 4


def test_persist_then_compute(client, enabled):
    a = data_for((64, 64), "float64")
    x = da.from_array(a, chunks=(8, 64)).persist()
    wait(x)
    y = x.rechunk((64, 8)).persist()
    wait(y)
    np.testing.assert_array_equal(y.compute(), a)
    np.testing.assert_array_equal((y + 1).rechunk((16, 16)).compute(), a + 1)
    assert worker_leftovers(client) == {}


def test_a_persisted_rechunk_rechunked_again_is_a_collective(client, enabled):
    """``x.rechunk(a).persist().rechunk(b)`` (xarray: ``ds.chunk(a).persist().chunk(b)``)."""
    a = data_for((48, 40), "float64")
    y = da.from_array(a, chunks=(8, 40)).rechunk((48, 8)).persist()
    wait(y)
    before = runs_done(client)
    for method in ("tasks", "p2p"):  # (method= for the graph's shape, not to keep dask's rechunk)
        with dask.config.set({"redist.respect-method": False}):
            z = y.rechunk((12, 40), method=method)
        assert dask_redist.explain(z)[0].runs == "collective", dask_redist.explain(z)
        np.testing.assert_array_equal(z.compute(), a)
    assert runs_done(client) - before == 2


def test_one_output_rechunked_from_another_input_gets_keys_of_its_own():
    """``w = x.rechunk(a).rechunk(b)`` persisted runs one collective from ``x``; ``w`` asked for
    again beside ``y = x.rechunk(a)`` is a collective from ``y``. Their stage and barrier keys
    were the same (a token of the output alone): the scheduler failed the graph ("invalid entry
    in coordinates array": the earlier grouping of ``x``'s chunks reused for ``y``'s) and the
    computation was cancelled ("lost dependencies"). (Distributed still warns of ``w``'s own
    keys, held in memory with the first collective's task behind them: a cluster of its own.)"""
    from distributed import Client

    a = data_for((96, 20, 16), "float64")
    with local_cluster(2, processes=False) as cluster, Client(cluster) as c:
        before = _warned_of_keys(c, "('redist-stage-", "'redist-barrier-")
        with dask_redist.enable(engine="dask", min_bytes=0):
            y = da.from_array(a, chunks=(8, 20, 16)).rechunk((48, 20, 4))
            w = y.rechunk((96, 5, 4))
            first = c.persist(w)
            wait(first)
            plus, again = dask.compute(w + 1, y)
            np.testing.assert_array_equal(first.compute(), a)
        np.testing.assert_array_equal(plus, a + 1)
        np.testing.assert_array_equal(again, a)
        assert _warned_of_keys(c, "('redist-stage-", "'redist-barrier-") == before


def _warned_of_keys(client, *starts) -> int:
    """How many of the scheduler logs' lines (the process's: every in-process scheduler's) warn
    of a key given two tasks, a key starting with one of ``starts`` (all keys without)."""
    lines = [m for _, m in client.get_scheduler_logs(n=10_000) if "Detected different `run_spec`" in m]
    return sum(not starts or any(f"for key {s}" in m for s in starts) for m in lines)


def test_sizes_from_compute_chunk_sizes(client, enabled):
    """The fix dask (and explain) suggests for unknown chunk sizes makes the rechunk a collective."""
    a = data_for((400, 6), "float64")
    x = da.from_array(a, chunks=(40, 6))
    x = x[x[:, 0] > 0].compute_chunk_sizes()
    expected = a[a[:, 0] > 0]
    before = runs_done(client)
    np.testing.assert_array_equal(x.rechunk((x.shape[0], 2)).compute(), expected)
    np.testing.assert_array_equal(dask_redist.rechunk(x, (x.shape[0], 3)).compute(), expected)
    assert runs_done(client) - before == 2


def test_an_explicit_rechunk_on_a_local_scheduler_beside_a_client_says_so(client):
    """``dask_redist.rechunk(x, c).compute(scheduler="sync")`` (as dask's ``assert_eq`` computes)
    with a Client present was told to create a distributed.Client, which it had: the error now
    says the graph went to a local scheduler and to compute it through the Client."""
    a = np.arange(64.0).reshape(8, 8)
    y = dask_redist.rechunk(da.from_array(a, chunks=(1, 8)), (8, 1), min_bytes=0)
    with pytest.raises(
        dask_redist.RedistError, match="computed on a local scheduler although a distributed Client"
    ):
        y.compute(scheduler="sync")
    np.testing.assert_array_equal(y.compute(), a)


def test_chunks_set_after_the_layer_was_built(client, enabled):
    """da.topk sets its chunks after building its layer: its rechunk is a collective too."""
    a = data_for((400, 6), "float64")
    top = da.topk(da.from_array(a, chunks=(40, 6)), 5, axis=0)
    before = runs_done(client)
    np.testing.assert_array_equal(top.rechunk((5, 2)).compute(), -np.sort(-a, axis=0)[:5])
    assert runs_done(client) - before == 1


def test_inputs_computed_inside_the_stage_tasks(client, enabled):
    """Input chunks nothing else needs are computed by the stage tasks; where something else needs
    them too (here a reduction of the same array), they are computed once and staged."""
    x = da.random.default_rng(3).random((60, 40), chunks=(4, 40))
    expected = x.compute()
    np.testing.assert_array_equal(x.rechunk((60, 4)).compute(), expected)
    got, total = dask.compute(x.rechunk((60, 5)), x.sum())
    np.testing.assert_array_equal(got, expected)
    assert total == pytest.approx(expected.sum())
    assert worker_leftovers(client) == {}


def test_a_resubmission_while_the_first_runs_keeps_its_tasks(client, enabled):
    """The same rechunk submitted again while the first submission is in flight, now with its
    input wanted too (so not inlined if it were new): its keys get the same tasks as before."""
    expected = data_for((48, 40), "float64", seed=5)
    warned = _warned_of_keys(client)  # (the process's schedulers log to one place: count anew)
    x = da.from_array(expected, chunks=(4, 40)).map_blocks(lambda b: time.sleep(0.1) or b)
    first = x.rechunk((48, 4)).persist()
    got, again = dask.compute(x, x.rechunk((48, 4)))
    wait(first)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(again, expected)
    np.testing.assert_array_equal(first.compute(), expected)
    assert _warned_of_keys(client) == warned


def test_only_needed_outputs_are_moved(client, enabled):
    a = data_for((64, 64), "float64")
    x = da.from_array(a, chunks=(8, 64))
    y = x.rechunk((64, 8))[:, :8]
    np.testing.assert_array_equal(y.compute(), a[:, :8])
    assert scheduler_history(client)[-1]["bytes"] == a[:, :8].nbytes


def test_two_threads_at_once(client, enabled):
    a = data_for((60, 40), "float64")
    results, errors = {}, []

    def work(i):
        try:
            x = da.from_array(a + i, chunks=(6 + i, 40))
            results[i] = x.rechunk((60, 4 + i)).sum(axis=1).compute()
        except Exception as e:  # pragma: no cover - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    for i in range(4):
        np.testing.assert_allclose(results[i], (a + i).sum(axis=1))
    assert worker_leftovers(client) == {}


def test_same_rechunk_from_two_threads_shares_one_run(client, enabled):
    a = data_for((32, 32), "int8")
    x = da.from_array(a, chunks=(4, 32))
    y = x.rechunk((32, 4))
    out = [None, None]

    def work(i):
        out[i] = y.compute()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    np.testing.assert_array_equal(out[0], a)
    np.testing.assert_array_equal(out[1], a)


def test_zero_size_arrays(client, enabled):
    a = np.zeros((0, 6))
    x = da.from_array(a, chunks=(1, 3))
    np.testing.assert_array_equal(x.rechunk((1, 2)).compute(), a)
    b = data_for((5, 0, 4), "float64")
    y = da.from_array(b, chunks=(2, 1, 2)).rechunk((5, 1, 1))
    assert y.compute().shape == (5, 0, 4)


def test_object_dtype_keeps_dask_rechunk(client, enabled):
    a = np.array([{"i": i} for i in range(12)], dtype=object)
    x = da.from_array(a, chunks=3)
    before = len(scheduler_history(client))
    assert list(x.rechunk(4).compute()) == list(a)
    assert len(scheduler_history(client)) == before


def test_chunks_that_do_not_sum_raise_dask_error(client, enabled):
    x = da.ones((10, 10), chunks=5)
    with pytest.raises(ValueError, match="[Cc]hunks"):
        x.rechunk(((3, 3), (10,)))


def test_chunks_that_lie_about_their_shape_fail_clearly(client, enabled):
    x = da.ones((8, 8), chunks=4).map_blocks(lambda b: b[:2], dtype=float)  # chunks metadata wrong
    with pytest.raises(ValueError, match="input chunk .* has shape"):
        x.rechunk((8, 2)).compute()


def test_chunks_of_another_dtype_than_the_array_says_keep_their_values(client, enabled):
    """Chunks whose dtype is not the array's (a ``map_blocks`` or ``from_delayed`` given another
    ``dtype=``) are converted to the array's: pieces that crossed to another worker were the
    chunks' bytes read as the array's dtype (int64 bits as float64: 5e-324, ...), no error."""
    a = np.arange(8 * 6).reshape(8, 6)
    x = da.from_array(a.astype(float), chunks=(2, 6)).map_blocks(lambda b: b.astype("i8"), dtype="f8")
    out = x.rechunk((8, 2)).compute()
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, a)
    smaller = da.from_array(a.astype(float), chunks=(2, 6)).map_blocks(lambda b: b.astype("f4"), dtype="f8")
    np.testing.assert_array_equal(smaller.rechunk((8, 2)).compute(), a)  # (was: cannot reshape array)


async def _add_resource(amount, dask_worker=None):
    await dask_worker.set_resources(SCRATCH=amount)


def test_outputs_restricted_to_some_workers_land_there(client, enabled):
    """``persist(workers=[w])`` and ``compute(resources=...)`` that only some workers meet: every
    output chunk is owned by a worker allowed to run its task (its unpack task was pinned to the
    plan's owner and waited in ``no-worker`` for good)."""
    a = np.arange(40 * 30.0).reshape(40, 30)
    x = da.from_array(a, chunks=(5, 30))
    w0, *others = sorted(client.scheduler_info()["workers"])
    before = len(scheduler_history(client))
    y = client.persist(x.rechunk((40, 3)), workers=[w0])
    wait(y, timeout=60)
    assert {w for where in client.who_has(y).values() for w in where} == {w0}
    np.testing.assert_array_equal(y.compute(), a)
    client.run(_add_resource, 1, workers=[others[0]])
    try:
        z = client.compute(x.rechunk((40, 5)) * 2, resources={"SCRATCH": 1})
        np.testing.assert_array_equal(z.result(timeout=60), 2 * a)
    finally:
        client.run(_add_resource, 0, workers=[others[0]])
    runs = scheduler_history(client)[before:]
    assert len(runs) == 2 and all(r["outcome"] == "done" for r in runs), runs
    del y, z
    assert not worker_leftovers(client)


def test_chunks_of_another_type_fail_clearly(client, enabled):
    x = da.ones((8, 8), chunks=4)
    # metadata says NumPy, but the chunks are masked arrays
    odd = x.map_blocks(lambda b: np.ma.masked_array(b), dtype=float, meta=np.empty((0, 0)))
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        odd.rechunk((8, 2)).compute()


def test_chunks_mapped_from_files_are_numpy_chunks(client, enabled, tmp_path):
    """``da.from_npy_stack`` (``np.load(mmap_mode="r")``) gives ``numpy.memmap`` chunks under NumPy
    metadata: NumPy arrays on a file, rechunked as Dask does (they failed the chunk-type check)."""
    a = np.arange(16 * 12.0).reshape(16, 12)
    da.to_npy_stack(str(tmp_path), da.from_array(a, chunks=(4, 12)), axis=0)
    x = da.from_npy_stack(str(tmp_path))
    np.testing.assert_array_equal(x.rechunk((16, 3)).compute(), a)
    np.testing.assert_array_equal((x.rechunk((16, 3)) + 1).sum(axis=0).compute(), (a + 1).sum(axis=0))


def test_cufftmp_asked_for_where_it_cannot_run_says_why(client):
    """redist.engine=cufftmp on workers without GPUs: refused at submission, in words about the
    cluster, not a bare import error (tests/test_unrunnable_engine.py); NumPy chunks of a dtype
    CuPy does not hold too."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the workers may well run cufftmp")
    x = da.from_array(data_for((32, 32), "float64"), chunks=(4, 32))
    with (
        dask_redist.enable(engine="cufftmp"),
        pytest.raises(
            dask_redist.RedistError, match="'cufftmp', which cannot run this rechunk: NumPy chunks on CPU"
        ),
    ):
        x.rechunk((32, 4)).compute()
    words = da.from_array(np.array(["ab"] * 1024).reshape(32, 32), chunks=(4, 32))
    with dask_redist.enable(engine="cufftmp"), pytest.raises(dask_redist.RedistError, match="on CPU workers"):
        words.rechunk((32, 4)).compute()
    with dask_redist.enable():  # auto is still fine after
        np.testing.assert_array_equal(x.rechunk((32, 4)).compute(), x.compute())


def test_the_client_decides_the_rechunks_only_where_the_named_engine_is_asked_of_the_workers(
    client, monkeypatch
):
    """A submission under ``dask`` or ``auto`` asks nothing of the workers, and so makes none of
    the rechunks' decisions on the client (the cost model runs Dask's planner: most of a small
    pipeline's persist() call); under an engine that must be asked (``cufftmp``), it does."""
    from dask_redist import api

    decided = []
    real = api._collective_specs
    monkeypatch.setattr(api, "_collective_specs", lambda c, s: decided.append(s.engine) or real(c, s))
    a = data_for((32, 32), "float64")
    x = da.from_array(a, chunks=(4, 32))
    for engine in ("dask", "auto"):
        with dask_redist.enable(engine=engine):
            np.testing.assert_array_equal((x.rechunk((32, 4)) + 1).compute(), a + 1)
    assert decided == []
    with dask_redist.enable(engine="cufftmp"), contextlib.suppress(dask_redist.RedistError):
        x.rechunk((32, 4)).compute()  # (refused where the workers have no GPU: decided either way)
    assert decided and set(decided) == {"cufftmp"}


def test_auto_asks_the_workers_before_taking_numpy_chunks_through_gpus(client):
    """NumPy rechunks from redist.numpy-via-gpus bytes on would go through the GPUs under auto:
    on workers without them, the scheduler asks, keeps the dask engine and says why, for the
    person reading it: CPU workers, not a ModuleNotFoundError; once they answered, the GPU-only
    threshold is not named either (it was: "below redist.numpy-via-gpus"). explain() says the same."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the workers may well run cufftmp")
    a = data_for((256, 256), "float64")  # 512 KiB
    x = da.from_array(a, chunks=(32, 256))
    before = len(scheduler_history(client))
    with dask_redist.enable(engine="auto", numpy_via_gpus="256KiB", min_bytes=0):
        np.testing.assert_array_equal(x.rechunk((256, 32)).compute(), a)
        said = dask_redist.explain(x.rechunk((256, 16)))[0]
    with dask_redist.enable(engine="auto", numpy_via_gpus="1MiB", min_bytes=0):
        np.testing.assert_array_equal(x.rechunk((256, 64)).compute(), a)
        said_small = dask_redist.explain(x.rechunk((256, 16)))[0]
    big, small = scheduler_history(client)[before:]
    for entry in (big, small):
        assert (entry["engine"], entry["why"]) == ("dask", "NumPy chunks on CPU workers"), entry
    for entry in (said, said_small):
        assert (entry.engine, entry.engine_reason) == ("dask", "NumPy chunks on CPU workers"), entry
        assert "dask (NumPy chunks on CPU workers)" in str(entry.as_dict()["engine"])


def test_explain_asks_the_workers_before_any_run():
    """On a new cluster explain() names the engine the first run would use, not 'not checked'."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the workers may well run cufftmp")
    from distributed import Client

    x = da.from_array(data_for((256, 256), "float64"), chunks=(32, 256))
    with local_cluster(2, processes=False) as cluster, Client(cluster) as c:
        c.wait_for_workers(2)
        with dask_redist.enable(engine="auto", numpy_via_gpus="256KiB", min_bytes=0):
            entry = dask_redist.explain(x.rechunk((256, 32)))[0]
        assert (entry.engine, entry.engine_reason) == ("dask", "NumPy chunks on CPU workers"), entry
        assert "message(s) per peer" in entry.mapping and entry.rounds == 1, entry
        assert scheduler_history(c) == []  # (nothing ran: explain only asked)


def test_a_run_before_the_workers_were_asked_names_no_gpu_threshold():
    """A small NumPy rechunk does not make the scheduler ask the workers what they can run: its
    history's why said "NumPy chunks, 512.00 kiB is below redist.numpy-via-gpus (1.00 MiB)" on a
    CPU cluster (a user-style session, 2026-12-07). Now "NumPy chunks" until the workers
    answered (explain() asks them), then "NumPy chunks on CPU workers"."""
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here: the workers may well run cufftmp")
    from distributed import Client

    a = data_for((256, 256), "float64")  # 512 KiB
    x = da.from_array(a, chunks=(32, 256))
    with local_cluster(2, processes=False) as cluster, Client(cluster) as c:
        c.wait_for_workers(2)
        with dask_redist.enable(engine="auto", numpy_via_gpus="1MiB", min_bytes=0):
            np.testing.assert_array_equal(x.rechunk((256, 32)).compute(), a)
            assert dask_redist.explain(x.rechunk((256, 16)))[0].engine_reason == "NumPy chunks on CPU workers"
            np.testing.assert_array_equal(x.rechunk((256, 64)).compute(), a)
        first, later = scheduler_history(c)
    assert (first["engine"], first["why"]) == ("dask", "NumPy chunks"), first
    assert (later["engine"], later["why"]) == ("dask", "NumPy chunks on CPU workers"), later


def test_a_rechunk_beyond_the_workers_memory_keeps_dasks_and_explain_says_so():
    from distributed import Client

    x = da.from_array(data_for((512, 512), "float64"), chunks=(32, 512))  # 2 MiB
    with local_cluster(2, processes=False, memory_limit="1.5MiB") as cluster, Client(cluster) as c:
        c.wait_for_workers(2)
        with dask_redist.enable(engine="dask", min_bytes=0):
            entry = dask_redist.explain(x.rechunk((512, 32)))[0]
        assert entry.runs == "dask-rechunk" and "cannot spill" in entry.reason, entry


def test_output_type(client):
    """redist.output-type: numpy on NumPy chunks changes nothing; cupy where the workers have
    no CuPy fails naming the key; a bad value is refused naming it. (Conversions between
    NumPy and CuPy chunks, and mixed inputs converted: tests/test_gpu.py.)"""
    a = data_for((32, 32), "float64")
    x = da.from_array(a, chunks=(4, 32))
    with dask_redist.enable(engine="dask", output_type="numpy"):
        assert dask_redist.explain(x.rechunk((32, 4)))[0].reason == "eligible"
        got = x.rechunk((32, 4)).compute()
    np.testing.assert_array_equal(got, a)
    y = dask_redist.rechunk(x, (32, 4), engine="dask", output_type="numpy")
    assert type(y._meta) is np.ndarray
    np.testing.assert_array_equal(y.compute(), a)
    with pytest.raises(dask_redist.ConfigError, match="redist.output-type"):
        dask_redist.enable(output_type="torch")
    if importlib.util.find_spec("cupy") is not None:
        return
    with dask_redist.enable(engine="dask", output_type="cupy"):
        assert "converted to cupy" in dask_redist.explain(x.rechunk((32, 4)))[0].reason
        with pytest.raises(
            dask_redist.RedistError, match="redist.output-type is cupy but CuPy cannot be imported"
        ):
            x.rechunk((32, 4)).compute()


def test_an_engine_the_workers_cannot_load_fails_the_rechunk_not_the_workers(client):
    """redist.engine naming a module the workers cannot import: the rechunk is refused at submission
    naming the engine and the import error, and the next rechunk runs."""
    a = data_for((32, 32), "float64")
    x = da.from_array(a, chunks=(4, 32))
    timeouts = {"collective": "20s", "barrier": "20s"}
    with dask_redist.enable(engine="no_such_module:Engine", timeouts=timeouts):
        with pytest.raises(
            dask_redist.RedistError, match="No module named 'no_such_module'. Set redist.engine"
        ):
            x.rechunk((32, 4)).compute()
    with dask_redist.enable(
        engine="dask", timeouts=timeouts
    ):  # (other keys: the erred ones may linger a moment)
        np.testing.assert_array_equal(x.rechunk((32, 8)).compute(), a)


def test_no_state_left_behind(client, enabled):
    a = data_for((16, 16), "float64")
    da.from_array(a, chunks=(2, 16)).rechunk((16, 2)).compute()
    assert worker_leftovers(client) == {}


def test_doctor_reports_every_worker_and_the_engine(client):
    diagnosis = dask_redist.doctor(client)
    assert set(diagnosis.workers) == set(client.scheduler_info()["workers"])
    try:
        import cupy  # noqa: F401

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        has_gpu = False
    if not has_gpu:  # a CPU cluster: said for the reader, and nothing to fix for the engines it runs
        assert (diagnosis.engine, diagnosis.reason) == ("dask", "CuPy chunks on CPU workers")
        assert dict(diagnosis.lines)["cufftmp"].startswith("no GPU on any worker") and diagnosis.fixes == ()
        assert all(row["GPU"] == "none" and "CuPy" not in row for row in diagnosis.rows())
    text, page = str(diagnosis), diagnosis._repr_html_()
    assert "auto" in text and "<table>" in page


def test_explain_says_what_runs_when_not_enabled(client):
    """Before enable() (or after disable()) explain shows what enable() would do, and says that
    dask's rechunk runs: its entries said 'collective', 'eligible'."""
    a = data_for((64, 64), "float64")
    x = da.from_array(a, chunks=(8, 64))
    before = runs_done(client)
    for ctx in (contextlib.nullcontext, lambda: dask_redist.enable(engine="dask")):
        with ctx():
            entry = dask_redist.explain(x.rechunk((64, 8)))[0]
            np.testing.assert_array_equal(x.rechunk((64, 8)).compute(), a)
        ran = runs_done(client) - before
        if ran:
            assert entry.runs == "collective" and entry.reason == "eligible", entry
        else:
            assert (
                entry.runs == "dask-rechunk"
                and "not enabled" in entry.reason
                and entry.engine.startswith("dask")
            ), entry
    assert ran == 1


def test_explain_renders_text_and_html(client, enabled):
    x = da.from_array(data_for((64, 64), "float64"), chunks=(8, 64))
    e = dask_redist.explain(x.rechunk((64, 8)))
    assert len(e) == 1 and e[0].runs == "collective" and e[0].engine.startswith("dask")
    assert "moved between workers" in str(e) and "rounds" in str(e)
    assert "<table>" in e._repr_html_()
    objects = da.from_array(np.array([object()] * 8, dtype=object), chunks=4).rechunk(2)
    assert "Python objects" in str(dask_redist.explain(objects))


def test_distributed_progress_follows_the_collective(client, enabled, capsys):
    """`distributed.progress` (a bar in terminals, a widget in Jupyter) sees the collective's tasks."""
    from distributed import progress

    x = da.from_array(data_for((96, 64), "float64"), chunks=(8, 64)).persist()
    y = x.rechunk((96, 8)).persist()
    progress(y, notebook=False)
    assert "100% Completed" in capsys.readouterr().out
    np.testing.assert_array_equal(y.compute(), x.compute())
    prefixes = set(client.run_on_scheduler(_task_prefixes))
    assert {"redist-stage", "redist-barrier"} <= prefixes  # readable names in the dashboard


def _task_prefixes(dask_scheduler):
    from dask.utils import key_split

    return sorted({key_split(k) for k in dask_scheduler.tasks})


def _log_problems(client) -> list[str]:
    """Error lines in the scheduler's and the workers' logs (what a user's session would see)."""
    lines = [m for _, m in client.get_scheduler_logs(n=10_000)]
    for logs in client.get_worker_logs(n=10_000).values():
        lines += [m for _, m in logs]
    return [m for m in lines if any(s in m for s in ("Traceback", "Exception", "Compute Failed", "KeyError"))]


def test_cancel_then_persist_again_leaves_no_error_behind(client, enabled):
    """Cancelling a persisted rechunk at once, then persisting the same rechunk again (same keys):
    the barrier handler tolerates outputs released under it, no error reaches any log, and every
    rechunk that completes is right. (Right after a cancel, Dask itself may cancel the resubmitted
    keys too: FuturesCancelledError, as for its own rechunk; then it is persisted once more.)"""
    from distributed.client import FuturesCancelledError

    x = da.from_array(data_for((512, 512), "float64", seed=5), chunks=(16, 512)).persist()
    wait(x)
    expected = x.compute()
    before = len(_log_problems(client))
    for i in range(20):
        y = x.rechunk((512, 16)).persist()
        time.sleep(0.002 * (i % 10))
        client.cancel(y)
        for _ in range(50):
            y = x.rechunk((512, 16)).persist()
            try:
                wait(y, timeout=60)
                break
            except FuturesCancelledError:
                time.sleep(0.05)
        np.testing.assert_array_equal(y.compute(), expected)
        del y
    assert _log_problems(client)[before:] == []
    assert worker_leftovers(client) == {}


def test_outputs_released_while_the_run_is_planned(client, enabled, monkeypatch, caplog):
    """A cancel lands while the scheduler plans the run (planning slowed down here): the barrier
    handler neither raises nor starts a run for outputs nobody wants; the next rechunk is right."""
    import asyncio

    from dask_redist.runtime import scheduler

    real = scheduler.offload

    async def slow_offload(*args, **kwargs):
        await asyncio.sleep(1.0)
        return await real(*args, **kwargs)

    monkeypatch.setattr(scheduler, "offload", slow_offload)  # the scheduler runs in this process
    if (plugin := client.cluster.scheduler.plugins.get("redist")) is not None:
        plugin._plans.clear()  # (planned afresh, so slowly)
    x = da.from_array(data_for((64, 64), "float64", seed=6), chunks=(4, 64)).persist()
    wait(x)
    before = len(_log_problems(client))
    start = time.time()
    y = x.rechunk((64, 4)).persist()
    deadline = time.monotonic() + 30
    while dask_redist.status(client)["timeline"].get("run asked", 0) < start:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    client.cancel(y)
    del y
    time.sleep(2)
    monkeypatch.setattr(scheduler, "offload", real)
    # the scheduler runs in this process: its handler's errors are log records here
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert _log_problems(client)[before:] == []
    np.testing.assert_array_equal(x.rechunk((64, 4)).compute(), x.compute())
    assert worker_leftovers(client) == {}


def _holds(keys, dask_worker=None) -> bool:
    return any(k in dask_worker.state.tasks for k in keys)


def test_a_stale_barrier_result_restarts_the_rechunk_without_a_warning(client, caplog):
    """Output tasks run again while their barrier's result is still in memory (here the client holds
    it, as another graph built on it would) find their run ended: the scheduler restarts the rechunk
    (`RedistSchedulerPlugin.stale`). That recovery is expected, nothing for the user to act on: it is
    logged at INFO, no warning reaches the user's session, and the values are NumPy's."""
    from distributed.diagnostics.plugin import SchedulerPlugin

    scheduler = client.cluster.scheduler  # (in this process: its log records are caplog's)

    class HoldTheBarrier(SchedulerPlugin):
        name, held = "hold-the-barrier", []

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "processing" and str(key).startswith("redist-barrier-") and not self.held:
                self.held.append(key)  # (wanted before its result comes: it stays in memory)
                scheduler.client_desires_keys([key], client.id)

    a = data_for((64, 64), "float64", seed=9)
    x = da.from_array(a, chunks=(8, 64)).persist()
    wait(x)
    hold = HoldTheBarrier()
    scheduler.add_plugin(hold)
    try:
        with dask_redist.enable(engine="dask", min_bytes=0):
            y = x.rechunk((64, 8))
            z = y.persist()
            wait(z)
            assert [scheduler.tasks[k].state for k in hold.held] == ["memory"]
            runs = len(scheduler_history(client))
            keys = [f.key for f in futures_of(z)]
            del z  # its outputs are forgotten (on the workers too), the barrier's result is kept
            deadline = time.monotonic() + 30
            while any(k in scheduler.tasks for k in keys) or any(client.run(_holds, keys).values()):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with caplog.at_level(logging.INFO, logger="dask_redist"):
                got = y.persist().compute()
    finally:
        scheduler.remove_plugin(name=hold.name)
        scheduler.client_releases_keys(hold.held, client.id)
    np.testing.assert_array_equal(got, a)
    said = [r for r in caplog.records if r.name.startswith("dask_redist")]
    assert [r.levelname for r in said if "stale barrier result" in r.getMessage()] == ["INFO"], said
    assert [r.getMessage() for r in said if r.levelno >= logging.WARNING] == []
    assert [(h["run"], h["outcome"]) for h in scheduler_history(client)[runs:]] == [(2, "done")]  # run again


def test_the_collective_on_a_tls_cluster():
    """Workers and scheduler speaking TLS (distributed's Security): the collective's messages and
    pieces travel over the same secured comms; the result is right and the run recorded."""
    pytest.importorskip("cryptography")
    from distributed import Client
    from distributed.security import Security

    security = Security.temporary()
    with (
        local_cluster(2, protocol="tls", security=security) as cluster,
        Client(cluster, security=security) as c,
    ):
        assert cluster.scheduler_address.startswith("tls://")
        a = data_for((64, 64), "float64", seed=7)
        with dask_redist.enable(engine="dask"):
            got = da.from_array(a, chunks=(8, 64)).rechunk((64, 8)).compute()
        np.testing.assert_array_equal(got, a)
        last = dask_redist.status(c)["history"][-1]
        assert last["engine"] == "dask" and last["outcome"] == "done" and last["bytes moved"] > 0


def test_an_operator_turns_it_on_for_every_session_from_configuration(cluster):
    """distributed.client.preload lists dask_redist.preload: a plain x.rechunk of a session that
    never calls enable() runs as a collective, and stops doing so when its Client closes;
    redist.enabled: false opts a session out."""
    from distributed import Client

    a = data_for((48, 48), "float64", seed=8)
    with dask.config.set({"distributed.client.preload": ["dask_redist.preload"]}):
        with Client(cluster) as c:
            before = len(dask_redist.status(c)["history"])
            np.testing.assert_array_equal(da.from_array(a, chunks=(6, 48)).rechunk((48, 6)).compute(), a)
            runs = dask_redist.status(c)["history"][before:]
            assert len(runs) == 1 and runs[0]["outcome"] == "done", runs
        assert not isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)  # off again
        with dask.config.set({"redist.enabled": False}), Client(cluster) as c:
            before = len(dask_redist.status(c)["history"])
            np.testing.assert_array_equal(da.from_array(a, chunks=(6, 48)).rechunk((48, 6)).compute(), a)
            assert len(dask_redist.status(c)["history"]) == before  # dask's own rechunk


def test_a_session_preloaded_client_closing_leaves_the_others_on(cluster):
    """Clients close in any order: the first one closing neither turns the collective off for a
    later one nor undoes the user's own enable()."""
    from distributed import Client

    with dask.config.set({"distributed.client.preload": ["dask_redist.preload"]}):
        first = Client(cluster, set_as_default=False)
        second = Client(cluster, set_as_default=False)
        first.close()
        assert isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)
        third = Client(cluster, set_as_default=False)
        mine = dask_redist.enable(engine="dask")
        third.close()
        assert dask.config.get("redist.engine") == "dask"
        second.close()
        assert isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)  # (mine)
        dask_redist.disable(mine)
    assert not isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)


def _has_plugin(dask_scheduler):
    return "redist" in dask_scheduler.plugins and "redist_status" in dask_scheduler.handlers


def test_a_scheduler_preload_registers_the_plugins_at_start():
    from distributed import Client

    with (
        local_cluster(1, scheduler_kwargs={"preload": ["dask_redist.preload"]}) as cluster,
        Client(cluster) as c,
    ):
        assert c.run_on_scheduler(_has_plugin)  # before any rechunk ran
        a = data_for((16, 16), "float64", seed=9)
        with dask_redist.enable():
            np.testing.assert_array_equal(da.from_array(a, chunks=(4, 16)).rechunk((16, 4)).compute(), a)
        assert dask_redist.status(c)["history"][-1]["outcome"] == "done"


def test_the_timeline_is_of_the_latest_run(client, enabled):
    """Every mark ``status()`` shows belongs to the latest run: a second rechunk's stage marks are
    its own, after the first run's end, not the first run's left over."""
    x = da.from_array(data_for((64, 64), "float64", seed=8), chunks=(4, 64)).persist()
    wait(x)
    np.testing.assert_array_equal(x.rechunk((64, 4)).compute(), x.compute())
    first_done = dask_redist.status(client)["timeline"]["outputs in memory"]
    y = da.from_array(data_for((64, 64), "float64", seed=9), chunks=(8, 64)).persist()
    wait(y)
    np.testing.assert_array_equal(y.rechunk((64, 8)).compute(), y.compute())
    marks = {w: s["timeline"] for w, s in dask_redist.status(client)["workers"].items()}
    staged = [m["first stage"] for m in marks.values() if "first stage" in m]
    assert staged, marks
    assert min(staged) > first_done, (first_done, marks)
    for m in marks.values():
        assert all(t > first_done for t in m.values()), (first_done, m)


def test_a_run_starts_once_its_stage_tasks_are_done(client, enabled):
    """The scheduler starts the run when the barrier task becomes ready, from what the stage
    tasks said they staged; the barrier task's call then finds it started (runtime.eager)."""
    from dask_redist.core import messages as m
    from dask_redist.core.spec import BARRIER_PREFIX

    data = data_for((60, 40), "float64", seed=11)
    x = da.from_array(data, chunks=(6, 40)).persist()
    wait(x)
    np.testing.assert_array_equal(x.rechunk((60, 8)).compute(), data)  # (the plugins are there now)
    scheduler = client.cluster.scheduler
    plugin, real = scheduler.plugins["redist"], scheduler.handlers[m.Barrier.op]
    found = []

    async def barrier(token, **kwargs):
        found.append(plugin.eager.started(token, scheduler.tasks.get(BARRIER_PREFIX + token)) is not None)
        return await real(token=token, **kwargs)

    scheduler.handlers[m.Barrier.op] = barrier
    try:
        done = runs_done(client)
        np.testing.assert_array_equal(x.rechunk((60, 5)).compute(), data)
    finally:
        scheduler.handlers[m.Barrier.op] = real
    assert found == [True] and runs_done(client) == done + 1


def test_a_repeated_rechunk_reuses_its_plan(client, enabled, monkeypatch):
    """The scheduler plans a rechunk of the same geometry, placement and outputs wanted once;
    other outputs wanted get a plan of their own; every result is right."""
    from dask_redist.runtime import scheduler

    planned, real = [], scheduler.offload

    async def counting(f, *args, **kwargs):
        planned.append(getattr(f, "__name__", ""))
        return await real(f, *args, **kwargs)

    monkeypatch.setattr(scheduler, "offload", counting)
    data = data_for((61, 43), "float64", seed=12)
    x = da.from_array(data, chunks=(7, 43)).persist()
    wait(x)
    for _ in range(3):
        np.testing.assert_array_equal(x.rechunk((61, 6)).compute(), data)
    assert planned.count("plan_run") == 1
    np.testing.assert_array_equal(x.rechunk((61, 6))[:, :12].compute(), data[:, :12])
    assert planned.count("plan_run") == 2


class _SlowToSetUp(RedistWorkerPlugin):
    """The worker plugin, its setup a moment late: its stream handlers come after that."""

    async def setup(self, worker):
        import asyncio

        await asyncio.sleep(1.5)
        super().setup(worker)


def _forget_on_every_worker(dask_scheduler=None):
    from dask_redist.core import messages as m

    plugin = dask_scheduler.plugins["redist"]
    plugin.rechunks.send(list(dask_scheduler.workers), m.Forget("no-such-rechunk"))


def test_a_message_sent_while_the_worker_plugin_is_added_waits_for_it():
    """Registered by the first stage task of a session, the scheduler plugin adds the worker plugin
    to every worker over a comm of its own, while what it sends them goes on their streams: a
    rechunk cancelled at once sent `Forget` first, and a worker whose stream gets an op it has no
    handler for closes its connection and dies (KeyError: 'redist-forget' in its log)."""
    from distributed import Client

    from dask_redist.runtime.scheduler import RedistSchedulerPlugin

    with local_cluster(2, threads_per_worker=1) as cluster, Client(cluster) as c:
        before = {w: i["id"] for w, i in c.scheduler_info()["workers"].items()}
        registering = threading.Thread(
            target=c.register_plugin, args=(RedistSchedulerPlugin(worker_plugin=_SlowToSetUp()),)
        )
        registering.start()
        deadline = time.monotonic() + 10
        while not c.run_on_scheduler(_has_plugin):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        c.run_on_scheduler(_forget_on_every_worker)  # (while the workers' setup sleeps)
        registering.join(30)
        time.sleep(0.5)
        assert {w: i["id"] for w, i in c.scheduler_info()["workers"].items()} == before
        a = data_for((16, 16), "float64", seed=13)
        with dask_redist.enable(engine="dask", min_bytes=0):
            np.testing.assert_array_equal(da.from_array(a, chunks=(4, 16)).rechunk((16, 4)).compute(), a)
        assert dask_redist.status(c)["history"][-1]["outcome"] == "done"
