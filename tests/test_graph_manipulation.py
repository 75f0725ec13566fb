"""``dask.graph_manipulation`` (``clone``, ``bind``, ``checkpoint``, ``wait_on``) on rechunks built
while enabled (issue 41, item 3): a clone's tasks are the original's under new keys, never the
original's keys (dask's generic ``Layer.clone`` leaves ``Task`` objects pointing there, and the
rewrite of the original's rechunk removes them: "lost dependencies")."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import runs_since, scheduler_history
from dask.graph_manipulation import bind, checkpoint, clone, wait_on

import dask_redist
from dask_redist.graph.p2p import OwnP2PRechunkLayer

N, CHUNKS, NEW = 4096, 64, 128


def rechunked():
    a = np.arange(N, dtype=float)
    return a, da.from_array(a, chunks=CHUNKS).rechunk(NEW)


def own_keys(x) -> set:
    return set(x.__dask_graph__().keys())


def test_a_clone_computes_alone_and_beside_its_original_through_the_collective(client):
    with dask_redist.enable(engine="dask"):
        a, x = rechunked()
        y = clone(x)
        assert y.name != x.name and not own_keys(x) & own_keys(y)  # nothing shared: a real clone
        before = scheduler_history(client)
        np.testing.assert_array_equal(y.compute(), a)
        xs, ys = dask.compute(x, y)
        np.testing.assert_array_equal(xs, a)
        np.testing.assert_array_equal(ys, a)
        assert len(runs_since(client, before)) == 3  # the clone's rechunk is a collective too
        np.testing.assert_array_equal(clone(x).compute(scheduler="sync"), a)  # Dask's tasks, cloned


def test_a_clone_that_omits_its_input_rechunks_the_same_input(client):
    with dask_redist.enable(engine="dask"):
        a = np.arange(N, dtype=float)
        source = da.from_array(a, chunks=CHUNKS)
        x = source.rechunk(NEW).rechunk(N // 2)  # two steps of Dask's rechunk, one collective
        y = clone(x, omit=source)
        assert source.name in y.dask.layers and not {
            k for k in own_keys(y) if k[0] != source.name
        } & own_keys(x)
        before = scheduler_history(client)
        xs, ys = dask.compute(x, y)
        np.testing.assert_array_equal(xs, a)
        np.testing.assert_array_equal(ys, a)
        assert len(runs_since(client, before)) == 2


def test_bind_checkpoint_and_wait_on_wait_for_their_blocker(client, tmp_path):
    mark = tmp_path / "blocker-ran"

    @dask.delayed(pure=False)
    def blocker():
        mark.write_text("ran")  # (the workers share this machine's file system)

    with dask_redist.enable(engine="dask"):
        a, x = rechunked()
        bound = bind(x, blocker())
        np.testing.assert_array_equal(bound.compute(), a)
        assert mark.read_text() == "ran"
        mark.unlink()
        waited = wait_on(x.rechunk(N // 4))  # (one collection: returned as it is)
        np.testing.assert_array_equal(waited.compute(), a)
        assert checkpoint(x, blocker()).compute() is None and mark.read_text() == "ran"
        bound_to_input = bind(x, blocker(), omit=x.dask.layers.keys() - {x.name})  # leaves: the rechunk's
        np.testing.assert_array_equal(bound_to_input.compute(), a)


def test_xarrays_graph_manipulation_at_4096_elements_in_64_chunks(client):
    """xarray's ``tests/test_dask.py::test_graph_manipulation``, at the size where the collective
    takes the rechunk."""
    xr = pytest.importorskip("xarray")
    from xarray.testing import assert_equal

    with dask_redist.enable(engine="dask"):
        v = xr.Variable(["x"], np.arange(N)).chunk(-1).chunk(N // CHUNKS) * 2
        array = xr.DataArray(v)
        ds = xr.Dataset({"d1": v[0], "d2": v[1], "d3": ("x", np.arange(N))})
        before = scheduler_history(client)
        v2, array2, ds2 = clone(v, array, ds)
        assert_equal(v2, v)
        assert_equal(array2, array)
        assert_equal(ds2, ds)
        assert_equal(ds2.d1 + ds2.d2, ds.d1 + ds.d2)
        assert runs_since(client, before)  # the collective ran


def test_a_clone_of_dask_redist_rechunk_is_a_collective_of_its_own(client):
    a = np.arange(N, dtype=float)
    x = dask_redist.rechunk(da.from_array(a, chunks=CHUNKS), NEW, engine="dask", min_bytes=0)
    y, z = clone(x, seed=1), bind(x, dask.delayed(len)([1]))
    assert not own_keys(x) & own_keys(y) and not own_keys(x) & own_keys(z)
    before = scheduler_history(client)
    for result in dask.compute(x, y, z):
        np.testing.assert_array_equal(result, a)
    tokens = {run["token"] for run in runs_since(client, before)}
    assert len(tokens) == 3  # three rechunks, none waiting on another's run


def p2p_rechunked(seed: int):
    """A 3-d rechunk for which Dask picks its p2p method on a distributed cluster (while enabled,
    named by `graph.names` and a `graph.p2p.OwnP2PRechunkLayer`), and its NumPy input."""
    a = np.random.default_rng(seed).random((32, 24, 16))
    y = (da.from_array(a, chunks=(2, 24, 16)) + 1).rechunk((32, 3, 4))
    assert isinstance(y.dask.layers[y.name], OwnP2PRechunkLayer)
    return a, y


def test_clones_and_binds_of_a_p2p_rechunk_compute_its_values(client):
    """distributed's p2p rechunk layer does not clone (its tasks keep the original's keys: dask
    alone fails with "lost dependencies" or "Cannot fuse tasks with multiple outputs"); while
    enabled, its clone is Dask's tasks rechunk under the cloned keys, which the collective takes."""

    @dask.delayed(pure=False)
    def blocker():
        return 1

    with dask_redist.enable(engine="dask", min_bytes=0):
        a, y = p2p_rechunked(1)
        cloned = clone(y)
        assert not own_keys(y) & own_keys(cloned)
        consumed = clone(y - 1)  # (a consumer fused with the cloned rechunk)
        bound = bind(y * 3, blocker())
        before = scheduler_history(client)
        ys, cs, ds, bs = dask.compute(y, cloned, consumed, bound)
        assert len({run["token"] for run in runs_since(client, before)}) == 4
    for got, want in [(ys, a + 1), (cs, a + 1), (ds, a), (bs, (a + 1) * 3)]:
        np.testing.assert_allclose(got, want)


def test_a_culled_p2p_rechunk_keeps_its_clone(client):
    with dask_redist.enable(engine="dask", min_bytes=0):
        a, y = p2p_rechunked(2)
        layer = y.dask.layers[y.name]
        culled, _ = layer.cull({(y.name, 0, 0, 0)}, layer.get_output_keys())
        assert isinstance(culled, OwnP2PRechunkLayer) and culled.keepmap.sum() == 1
        np.testing.assert_allclose(clone(y)[:, :3, :4].compute(), a[:, :3, :4] + 1)
