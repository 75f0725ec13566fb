"""Producers of a rechunk's input more than one layer deep, run by the collective's stage tasks
(`dask_redist.graph.stages.inlined_inputs`): a generator reshaped, sliced or transposed before a
step, a step over a persisted array reshaped. NumPy's values, the tasks the scheduler really
ran (those of the same pipeline without the rechunk: one per chunk, as Dask fuses it), what
``explain`` says, and an input layer with tasks besides its chunks."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from dask._task_spec import Task, TaskRef
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.utils import key_split
from distributed import wait
from test_fuse import enabled, tasks_of  # noqa: F401 (a fixture)

import dask_redist
from dask_redist.config import Settings
from dask_redist.graph.optimize import rewrite

pytestmark = pytest.mark.filterwarnings("ignore:Sending large graph:UserWarning")

N, M = 64, 16
#: producers: (the dask array, NumPy's value), each more than one layer before the rechunk
PRODUCERS = {
    "arange-reshape-step": lambda: (
        2 * da.arange(N * M, chunks=4 * M).reshape(N, M) + 1,
        2 * np.arange(N * M).reshape(N, M) + 1,
    ),
    "random-sliced-step": lambda: (
        da.random.default_rng(3).random((2 * N, M), chunks=(8, M))[::2] * 2,
        None,  # (dask's own random numbers: `_expected`)
    ),
    "numpy-transposed-reshaped": lambda: (
        da.from_array(np.arange(N * M * 1.0).reshape(M, N), chunks=(M, 4)).T.reshape(N, 4, 4)[:, :, ::-1] + 1,
        np.arange(N * M * 1.0).reshape(M, N).T.reshape(N, 4, 4)[:, :, ::-1] + 1,
    ),
    # (Dask's aliases and tuple tasks: the chunks of the arrays joined, a cumsum's first chunk)
    "concatenated": lambda: (
        da.concatenate(
            [da.ones((N // 2, M), chunks=(4, M)), da.arange(N // 2 * M, chunks=4 * M).reshape(-1, M)]
        ),
        np.concatenate([np.ones((N // 2, M)), np.arange(N // 2 * M).reshape(-1, M)]),
    ),
    "stacked": lambda: (
        da.stack([da.ones((N // 2, M), chunks=(4, M)), da.zeros((N // 2, M), chunks=(4, M))]),
        np.stack([np.ones((N // 2, M)), np.zeros((N // 2, M))]),
    ),
    "cumsum-within-chunks": lambda: (
        da.from_array(np.arange(N * M * 1.0).reshape(N, M), chunks=(4, M)).cumsum(axis=1),
        np.arange(N * M * 1.0).reshape(N, M).cumsum(axis=1),
    ),
}


def _expected(name, x, a):
    return x.compute() if name == "random-sliced-step" else a  # (dask's random numbers: its own)


@pytest.mark.parametrize("name", sorted(PRODUCERS))
def test_a_producer_more_than_one_layer_deep_runs_inside_the_stage_tasks(client, enabled, name):  # noqa: F811
    with dask.config.set({"redist.enabled": False}):
        x, a = PRODUCERS[name]()
        a = _expected(name, x, a)
    new = x.shape[:-1] + (2,)
    y = x.rechunk(new) ** 2
    np.testing.assert_allclose(y.compute(), a**2)
    threads = sum(client.nthreads().values())
    alone = sum(tasks_of(client, x**2).values())  # (Dask fuses the pipeline: a task per chunk, its alias)
    held = tasks_of(client, y)  # with the rechunk: what the rechunk alone has
    assert sum(held.values()) <= alone, (held, alone)
    assert held.pop(key_split(y.name)) == y.npartitions and held.pop("redist-barrier") == 1, held
    assert held.pop("redist-stage") <= threads and held == {}, held
    (entry,) = dask_redist.explain(y).entries
    assert entry.fused.startswith("stage tasks compute ") and entry.fused.count(", ") >= 2, entry.fused
    assert entry.fused.split("; ")[0].endswith(x.name), entry.fused  # (the input last, deepest first)


def test_a_step_over_a_persisted_array_reshaped_runs_inside_the_stage_tasks(client, enabled):  # noqa: F811
    a = np.arange(N * M * 1.0).reshape(N, M)
    p = da.from_array(a, chunks=(4, M)).persist()
    wait(p)
    for x, expected in [((p + 1).reshape(N * M), a.ravel() + 1), (p.reshape(N * M) + 1, a.ravel() + 1)]:
        y = x.rechunk(32) ** 2
        np.testing.assert_allclose(y.compute(), expected**2)
        held = tasks_of(client, y)
        assert held.pop("pow") == y.npartitions and held.pop("redist-barrier") == 1, held
        assert held.pop("redist-stage") <= len(client.nthreads()) * 2 and set(held) == {"array"}, held
        fused = dask_redist.explain(y).entries[0].fused
        assert fused.startswith("stage tasks compute ") and fused.count(", ") == 1, fused
    del p


def _names(dask_scheduler) -> set:
    return {k[0] if isinstance(k, tuple) else k for k in dask_scheduler.tasks}


def names_of(client, y) -> set:
    """The names of the tasks the scheduler holds for ``y`` persisted (nothing else held)."""
    return tasks_of(client, y, _names)


def _with_rest(rest_needs_generator: bool, n: int = 8):
    """An input layer whose chunks need a generator layer's tasks and one task besides them, in the
    same layer: ``rest``, which needs a generator's task or none (as ``da.take``'s and
    ``cumsum``'s layers hold tasks besides their chunks). Its value in NumPy."""
    gen, src = "gen-" + "a" * 32, "src-" + "b" * 32
    extra = (src, "extra")
    generated = {(gen, i, 0): Task((gen, i, 0), np.full, (4, M), float(i)) for i in range(n)}
    tasks = {(src, i, 0): Task((src, i, 0), np.add, TaskRef((gen, i, 0)), TaskRef(extra)) for i in range(n)}
    tasks[extra] = (
        Task(extra, np.sum, TaskRef((gen, 1, 0))) if rest_needs_generator else Task(extra, float, 5)
    )
    layers = {gen: MaterializedLayer(generated), src: MaterializedLayer(tasks)}
    x = da.Array(HighLevelGraph(layers, {gen: set(), src: {gen}}), src, ((4,) * n, (M,)), dtype=float)
    values = np.repeat(np.arange(n * 1.0), 4)[:, None] + np.zeros(M)
    return x, values + (4 * M if rest_needs_generator else 5)


@pytest.mark.parametrize("rest_needs_generator", [True, False])
def test_an_input_layer_with_tasks_besides_its_chunks_keeps_what_they_need(
    client,
    enabled,  # noqa: F811
    rest_needs_generator,
):
    """The tasks besides the chunks stay in the input layer. A generator's layer one of them needs
    keeps its tasks, each computed once (a generator's task run in a stage task and again for the
    other had been computed twice); one nobody else needs goes into the stage tasks, its layer out
    of the graph, and the graph's layers depend on exactly what their tasks need (HighLevelGraph's
    own check: a layer gone left dependencies on it behind)."""
    x, a = _with_rest(rest_needs_generator)
    y = x.rechunk((32, 2)) ** 2
    new, (d,) = rewrite(y.__dask_graph__(), [y.__dask_keys__()], Settings(min_bytes=0, engine="dask"))
    new.validate()
    gen = next(n for n in x.__dask_graph__().layers if n.startswith("gen-"))
    assert (gen in new.layers) == rest_needs_generator, set(new.layers)
    np.testing.assert_allclose(y.compute(), a**2)
    held = tasks_of(client, y)
    fused = dask_redist.explain(y).entries[0].fused
    assert (gen in fused) != rest_needs_generator, fused
    ran = sum(v for k, v in held.items() if k.startswith("gen-"))
    assert ran == (8 if rest_needs_generator else 0), held  # (each generated chunk once)
    np.testing.assert_allclose(dask.optimize(y)[0].compute(), a**2)  # (Dask's optimizations first)


def test_a_step_between_rechunks_is_run_by_one_collective_only(client, enabled):  # noqa: F811
    """A step after one rechunk and before another, a reshape between (with a rechunk of its own):
    each layer is fused into one collective's tasks at most, and ``explain`` names it once."""
    a = np.random.default_rng(0).standard_normal((32, 8, 6))
    x = da.from_array(a, chunks=(4, 8, 6))
    y = (((x[::2] * 2).rechunk((16, 8, 2)) + 1).reshape(16, 48) * 3).rechunk((2, 48)) - 1
    np.testing.assert_allclose(y.compute(), ((a[::2] * 2 + 1).reshape(16, 48) * 3) - 1)
    new, _ = rewrite(y.__dask_graph__(), [y.__dask_keys__()], Settings(min_bytes=0, engine="dask"))
    new.validate()
    parts = [p for e in dask_redist.explain(y).entries for p in e.fused.split("; ") if p]
    named = [n for p in parts for n in p.split(" compute ")[1].split(", ")]
    assert len(named) == len(set(named)) and x.name in named, named


#: steps before the rechunk, as dask and NumPy run them
STEPS = {
    "reshape": lambda v: v.reshape(v.shape[0], 2, v.shape[1] // 2).reshape(v.shape[0], v.shape[1]),
    "transpose-twice": lambda v: v.T.T,
    "reverse": lambda v: v[:, ::-1],
    "astype": lambda v: v.astype(np.float32).astype(np.float64),
    "step": lambda v: 2 * v + 1,
    "sin": lambda v: np.sin(v),
}


def _generated(kind: str, seed: int, shape, chunks):
    """A generated dask array and its value."""
    a = np.arange(shape[0] * shape[1] * 1.0).reshape(shape)
    with dask.config.set({"redist.enabled": False}):
        if kind == "arange":
            return da.arange(a.size * 1.0, chunks=chunks[0] * chunks[1]).reshape(shape), a
        if kind == "ones":
            return da.ones(shape, chunks=chunks), np.ones(shape)
        if kind == "numpy":
            return da.from_array(a, chunks=chunks), a
        x = da.random.default_rng(seed).random(shape, chunks=chunks)
        return x, x.compute()


@pytest.mark.parametrize("seed", range(10))
def test_random_producers_before_a_rechunk_equal_numpy_and_explain_what_ran(client, enabled, seed):  # noqa: F811
    """A generator (``arange``, ``ones``, a NumPy array's chunks, random numbers) and random steps
    before a rechunk, a step after: NumPy's values; a valid graph; no task on the scheduler of a
    layer ``explain`` says the stage tasks compute."""
    rng = np.random.default_rng(seed)
    rows, cols, n = int(rng.integers(1, 5)) * 4, 2 * int(rng.integers(1, 5)), int(rng.integers(2, 9))
    kind = str(rng.choice(["arange", "ones", "numpy", "random"]))
    x, a = _generated(kind, seed, (n * rows, cols), (rows, cols))
    steps = [str(s) for s in rng.choice(sorted(STEPS), int(rng.integers(1, 4)))]
    for s in steps:
        x, a = STEPS[s](x), STEPS[s](a)
    y = x.rechunk((a.shape[0], max(1, cols // 2))) + 3
    case = dict(kind=kind, steps=steps, rows=rows, cols=cols, n=n)
    np.testing.assert_allclose(y.compute(), a + 3, err_msg=str(case))
    new, _ = rewrite(y.__dask_graph__(), [y.__dask_keys__()], Settings(min_bytes=0, engine="dask"))
    new.validate()
    (entry,) = dask_redist.explain(y).entries
    stage = entry.fused.split("; ")[0]
    fused = stage.split(" compute ")[1].split(", ") if stage.startswith("stage") else []
    held = names_of(client, y)
    assert not set(fused) & held, (held, entry.fused, case)
