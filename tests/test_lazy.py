"""Dask's rechunk steps built lazily while enabled (`dask_redist.graph.lazy`): the same graph as
Dask's, read or not, and never built where the collective takes the rechunk."""

from __future__ import annotations

import pickle

import dask
import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dask_redist
from dask_redist.graph.lazy import LazyRechunkStep
from dask_redist.graph.names import is_own


@st.composite
def chunking(draw, n):
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=5)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


def _graph(y, but: str = "") -> dict:
    """Every layer of ``y``'s graph but ``but``: name -> (dependencies, {key: (function, dependencies)})."""
    hlg = y.__dask_graph__()
    return {
        name: (
            hlg.dependencies[name],
            {k: (getattr(t, "func", None), t.dependencies) for k, t in dict(layer).items()},
        )
        for name, layer in hlg.layers.items()
        if name != but
    }


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_the_graph_is_dasks_whether_read_or_not(data):
    """Names, chunks, layers, keys, functions and dependencies: the same as Dask builds without
    dask-redist, for tasks rechunks of one step or several (a small array-chunk-size forces steps)."""
    shape = tuple(data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=3)))
    old = tuple(data.draw(chunking(n)) for n in shape)
    new = tuple(data.draw(chunking(n)) for n in shape)
    limit = data.draw(st.sampled_from(["64B", "1KiB", "128MiB"]))
    with dask.config.set({"array.chunk-size": limit}):
        x = da.ones(shape, chunks=old)
        plain = x.rechunk(new, method="tasks")
        with dask_redist.enable():
            lazy = x.rechunk(new, method="tasks")
    assert lazy.name == plain.name and lazy.chunks == plain.chunks
    steps = [layer for layer in lazy.dask.layers.values() if isinstance(layer, LazyRechunkStep)]
    assert all(not s.is_materialized() for s in steps) and (steps or lazy is x or old == new)
    assert _graph(lazy) == _graph(plain)
    for layer in lazy.dask.layers.values():  # (every task keyed as it says: an alias too)
        assert all(k == t.key for k, t in dict(layer).items())
    np.testing.assert_array_equal(lazy.compute(scheduler="sync"), np.ones(shape))
    np.testing.assert_array_equal((lazy + 1).compute(scheduler="sync"), np.full(shape, 2.0))


def test_a_p2p_rechunks_prechunking_step_is_lazy_and_the_same(client):
    """Under a distributed client Dask picks p2p for large graphs, after a pre-chunking ``tasks`` step."""
    x = da.ones((64, 60), chunks=(1, 60))
    plain = x.rechunk((64, 7), method="p2p")
    with dask_redist.enable():
        lazy = x.rechunk((64, 7), method="p2p")
    assert lazy.name == plain.name and set(lazy.dask.layers) == set(plain.dask.layers)
    assert any(isinstance(layer, LazyRechunkStep) for layer in lazy.dask.layers.values())
    assert _graph(lazy) == _graph(plain)


def test_the_collective_never_builds_dasks_tasks(client, monkeypatch):
    """The rewrite drops the steps unread; pickled, a step carries no tasks."""
    from dask_redist.compat import wrapped as compat

    built = []
    original = compat._original_step
    monkeypatch.setattr(compat, "_original_step", lambda x, c: built.append(c) or original(x, c))
    a = np.arange(60 * 48, dtype=np.float64).reshape(60, 48)
    x = da.from_array(a, chunks=(5, 48)).persist()
    with dask_redist.enable(engine="dask", min_bytes=0):
        y = x.rechunk((60, 4))
        (step,) = [layer for layer in y.dask.layers.values() if isinstance(layer, LazyRechunkStep)]
        assert len(pickle.dumps(step)) < 2000
        np.testing.assert_array_equal(y.compute(), a)
    assert built == []  # (the collective ran: status says so below)
    assert dask_redist.status(client)["history"][-1]["outcome"] == "done"
    with dask_redist.enable(engine="dask", min_bytes=10**9):  # kept by Dask: its tasks, read on the scheduler
        z = x.rechunk((60, 3))
        np.testing.assert_array_equal(z.compute(), a)
    assert built


def test_a_step_after_a_rechunk_left_to_dask_runs(client):
    """A rechunk left to Dask while enabled (below ``min-bytes``, unknown chunk sizes, object
    dtype), an output chunk of it one input chunk as it is (an alias of it), then a step: Dask's
    fusion of the two found the alias still keyed as Dask had named it (2026-12-06: "Cannot
    fuse tasks with multiple outputs")."""
    a = np.arange(240.0).reshape(20, 12)
    with dask_redist.enable(min_bytes="1GiB"):
        x = da.from_array(a, chunks=(5, 12))
        small = x.rechunk((5, 3)) + 1
        unknown = x[x[:, 0] % 2 == 0].rechunk({1: 3}) + 1
        objects = (
            da.from_array(a.astype(object), chunks=(5, 12))
            .rechunk((5, 3))
            .map_blocks(lambda b: b * 2, dtype=object)
        )
        for scheduler in ("sync", None):
            np.testing.assert_array_equal(small.compute(scheduler=scheduler), a + 1)
            np.testing.assert_array_equal(unknown.compute(scheduler=scheduler), a[a[:, 0] % 2 == 0] + 1)
            np.testing.assert_array_equal(objects.compute(scheduler=scheduler).astype(float), a * 2)


def test_a_read_step_is_materialized_and_pickles_without_its_tasks():
    with dask_redist.enable():
        y = da.ones((10, 10), chunks=(1, 10)).rechunk((10, 1), method="tasks")
    step = y.dask.layers[y.name]
    assert (y.name, 0, 0) in step.get_output_keys() and not step.is_materialized()
    assert len(step) > 10 and step.is_materialized()
    assert isinstance(step, LazyRechunkStep) and not pickle.loads(pickle.dumps(step)).is_materialized()


@pytest.mark.parametrize("shape, old, new", [((0, 4), (0, 2), (0, 4)), ((6,), (3,), (2,))])
def test_empty_arrays_and_disable(shape, old, new):
    with dask_redist.enable():
        y = da.ones(shape, chunks=old).rechunk(new, method="tasks")
    np.testing.assert_array_equal(y.compute(scheduler="sync"), np.ones(shape))
    z = da.ones(shape, chunks=old).rechunk(new, method="tasks")  # disabled again: Dask's own layers
    assert not any(isinstance(layer, LazyRechunkStep) for layer in z.dask.layers.values())


def test_dasks_chunk_crossings_are_computed_once_per_rechunk(client, monkeypatch):
    """Dask's choice of method and the p2p pre-chunking both ask ``old_to_new`` for the caller's
    chunks: while enabled it is computed once per ``x.rechunk`` (`compat._old_to_new_once`), and
    the graph is still Dask's. Disabled, Dask's own function is back."""
    import importlib

    from dask_redist.compat import wrapped as compat

    rechunk_module = importlib.import_module("dask.array.rechunk")  # (dask.array.rechunk is the function)
    calls = []
    original = compat._original_old_to_new
    monkeypatch.setattr(compat, "_original_old_to_new", lambda o, n: calls.append((o, n)) or original(o, n))
    x = da.ones((64, 60), chunks=(1, 60))
    plain = x.rechunk((64, 1), method=None)  # (disabled: Dask's own function, not counted)
    assert calls == [] and rechunk_module.old_to_new is original
    with dask_redist.enable():
        lazy = x.rechunk((64, 1), method=None)
        again = x.rechunk((64, 1), method=None)
    assert lazy.name == again.name != plain.name and is_own(lazy.name)  # (graph.names)
    assert _graph(lazy, but=lazy.name) == _graph(plain, but=plain.name)
    mine = (x.chunks, ((64,), (1,) * 60))
    assert calls.count(mine) == 2  # (once for each of the two calls; Dask's steps ask of other chunks)
    assert rechunk_module.old_to_new is compat._original_old_to_new  # (disabled: Dask's, here counted)
