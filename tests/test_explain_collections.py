"""``explain()`` of what users hold: xarray objects, Delayed, lists of them; one sentence for
anything else; each rechunk's headline says what runs first (issue 42, items 4 and 5)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import dask_redist
from conftest import runs_since, scheduler_history

xr = pytest.importorskip("xarray")


def _dataset():
    data = {"a": (("x", "y"), np.ones((64, 64))), "b": (("x", "y"), np.zeros((64, 64)))}
    return xr.Dataset(data).chunk({"x": 4}).chunk({"x": 64, "y": 4})


def test_explain_takes_xarray_objects_delayed_and_lists(client):
    with dask_redist.enable(engine="dask"):
        ds = _dataset()
        both = dask_redist.explain(ds)
        assert len(both) == 2 and all(e.runs == "collective" for e in both), both
        assert len(dask_redist.explain(ds["a"])) == 1
        listed = dask_redist.explain([ds["a"].data, {"b": ds["b"]}, 3, ds["a"]])
        assert sorted(e.output for e in listed) == sorted(e.output for e in both)  # (each rechunk once)
        assert float(ds["a"].sum().compute()) == 64 * 64


def test_a_list_is_explained_as_dask_compute_takes_it(client):
    """``dask.compute(a, b)`` rewrites the graphs of a list's arrays as one: a rechunk both need
    runs once, and a consumer is fused into its unpack tasks only where nothing else needs its
    output. ``explain`` of the list says what that graph runs, as it does for a Dataset's
    variables (two rechunks sharing Dask's pre-chunking step: two collectives, as run)."""
    a = np.arange(64 * 48.0).reshape(64, 48)
    b = np.arange(96 * 20 * 16.0).reshape(96, 20, 16)
    with dask_redist.enable(engine="dask", min_bytes=0):
        y = (da.from_array(a, chunks=(8, 48)) * 2).rechunk((64, 6))
        (alone,) = dask_redist.explain((y**2).sum(axis=0))
        assert "unpack tasks compute sum-" in alone.fused, alone
        outs = [y + 1, (y**2).sum(axis=0)]
        (together,) = dask_redist.explain(outs)
        assert "unpack tasks" not in together.fused, together
        x = xr.DataArray(b, dims=("t", "y", "x")).chunk({"t": 8})
        two = [x.chunk({"t": -1, "y": 5, "x": 4}), x.chunk({"t": -1, "y": 1})]
        explained = dask_redist.explain(two)
        before = scheduler_history(client)
        plus, total = dask.compute(*outs)
        assert len(runs_since(client, before)) == 1
        first, second = dask.compute(*two)
    np.testing.assert_array_equal(plus, 2 * a + 1)
    np.testing.assert_array_equal(total, ((2 * a) ** 2).sum(axis=0))
    np.testing.assert_array_equal(first.values, b)
    np.testing.assert_array_equal(second.values, b)
    ran = runs_since(client, before)[1:]
    assert len(explained) == len(ran) and all(e.runs == "collective" for e in explained), (explained, ran)


def test_a_delayed_built_on_a_rechunk_says_dasks_rechunk_runs_and_why(client):
    """dask makes an array's graph tasks when a Delayed is built on it: no rewrite can find the
    rechunk there, and explain says so, with what to do instead."""
    # (tasks: Dask's p2p rechunk inside a Delayed fails in dask 2026.8 itself, "lost dependencies")
    with dask_redist.enable(engine="dask"), dask.config.set({"array.rechunk.method": "tasks"}):
        delayed = dask.delayed(np.sum)(_dataset()["a"].data)
        (entry,) = dask_redist.explain(delayed)
        assert entry.runs == "dask-rechunk" and entry.output.startswith("finalize-"), entry
        assert "Delayed" in entry.reason and "Persist the rechunked array first" in entry.reason
        persisted = _dataset()["a"].data.persist()
        assert dask_redist.explain(dask.delayed(np.sum)(persisted)).entries == ()
        assert delayed.compute() == 64 * 64


def test_a_delayed_holding_the_arrays_rechunk_says_dasks_rechunk_runs(client):
    """``to_delayed(optimize_graph=False)`` keeps the array's rechunk layers in a Delayed's graph,
    which dask.delayed's optimizer computes, never the rewrite: explain says Dask's rechunk runs
    (it said the collective)."""
    a = np.arange(64 * 48.0).reshape(64, 48)
    with dask_redist.enable(engine="dask", min_bytes=0):
        y = da.from_array(a, chunks=(8, 48)).rechunk((64, 6))
        block = y.to_delayed(optimize_graph=False)[0, 0]
        (entry,) = dask_redist.explain(block)
        before = scheduler_history(client)
        np.testing.assert_array_equal(block.compute(), a[:, :6])
        assert dask_redist.explain(y)[0].runs == "collective"
    assert runs_since(client, before) == []
    assert entry.runs == "dask-rechunk" and "Delayed" in entry.reason, entry


def test_an_array_optimized_on_the_client_says_so(client):
    """``dask.optimize(y)`` on the client makes the rechunk Dask's tasks: explain said a Delayed
    had been built on the array."""
    a = np.arange(64 * 48.0).reshape(64, 48)
    with dask_redist.enable(engine="dask", min_bytes=0):
        y = (da.from_array(a, chunks=(8, 48)) + 1).rechunk((64, 6)) * 2
        (optimized,) = dask.optimize(y)
        (entry,) = dask_redist.explain(optimized)
        np.testing.assert_array_equal(optimized.compute(), (a + 1) * 2)
    assert entry.runs == "dask-rechunk" and "dask.optimize" in entry.reason, entry
    assert "Delayed" not in entry.reason, entry


@pytest.mark.parametrize(
    "thing, says",
    [
        (np.ones(3), "a numpy.ndarray holds no dask graph, so nothing is rechunked"),
        ([1, "a"], "explain() found no dask collection in this list"),
        (None, "a NoneType holds no dask graph"),
        (3, "an int holds no dask graph"),
    ],
)
def test_anything_else_gets_one_sentence(thing, says):
    text = str(dask_redist.explain(thing))
    assert says in text and "\n" not in text, text
    assert "explain() takes a dask collection" in text or "found no dask collection" in text


def test_an_in_memory_xarray_object_is_told_how_to_chunk_it():
    text = str(dask_redist.explain(xr.Dataset({"a": ("x", np.ones(3))})))
    assert (
        text
        == "this xarray.Dataset holds no dask arrays, so nothing is rechunked: .chunk(...) makes its data dask arrays"
    )


def test_the_headline_leads_with_what_runs(client):
    x = da.ones((64, 64), chunks=(4, 64))
    with dask_redist.enable(engine="dask"):
        (collective,) = dask_redist.explain(x.rechunk((64, 4)))
        (kept,) = dask_redist.explain(x.rechunk((64, 4), method="p2p"))
    first = str(dask_redist.explain(x.rechunk((64, 4)))).splitlines()
    assert collective.headline().startswith(
        "the collective on dask, in place of Dask's p2p rechunk: rechunk-p2p-redist-"
    )
    assert kept.headline().startswith("Dask's p2p rechunk: rechunk-p2p-")
    assert first[0] == "dask_redist is not enabled: this is what enable() would do"
    assert first[1].startswith("Dask's ") and "dask planned" not in "\n".join(first)


def test_a_datasets_rechunks_name_their_variables(client):
    """A Dataset's rechunks are told apart by the variables they carry, not by dask's names only;
    a coordinate rechunked with them is named too, and a DataArray by its name."""
    ds = _dataset().assign_coords(c=(("x", "y"), da.ones((64, 64), chunks=(4, 64))))
    ds = ds.chunk({"x": 64, "y": 4})
    with dask_redist.enable(engine="dask"):
        by_variable = {e.variables: e for e in dask_redist.explain(ds)}
        of_b = {e.variables: e.output for e in dask_redist.explain(ds["b"] + 1)}
    assert sorted(by_variable) == ["a", "b", "c"], by_variable
    assert of_b == {"b": by_variable["b"].output, "c": by_variable["c"].output}
    text = str(dask_redist.explain(ds[["a"]]))
    assert [line.split() for line in text.splitlines() if "variables" in line] == [
        ["variables", "a"],
        ["variables", "c"],
    ]
    assert "<th>variables</th>" in dask_redist.explain(ds)._repr_html_()


def test_without_a_client_it_says_what_a_client_would_run():
    """Without a Client Dask's rechunk runs; the engine, mapping and placement lines are what the
    collective would do with one, and the reason says so (not a cluster that is there)."""
    x = da.ones((64, 64), chunks=(4, 64))
    with dask_redist.enable(engine="dask"):
        (entry,) = dask_redist.explain(x.rechunk((64, 4)), nworkers=3)
    assert entry.runs == "dask-rechunk" and entry.engine == "dask"
    assert entry.reason.endswith(
        "what the collective would do with a Client of 3 workers that can run every engine"
    )
    assert entry.placement == "assumed: contiguous blocks over 3 workers"


def test_a_rechunk_whose_output_is_in_memory_is_explained_as_running_nothing(client):
    """A notebook's ``p = ds.chunk(c).persist()`` and, later, the same ``ds.chunk(c)`` built
    again for other work: its output keys are ``p``'s, in memory, so computing it runs no
    collective; ``explain`` said ``runs as  collective``, with bytes to move."""
    from distributed import wait

    b = np.arange(48 * 20 * 6.0).reshape(48, 20, 6)
    with dask_redist.enable(engine="dask", min_bytes=0):
        x = xr.DataArray(b, dims=("t", "y", "x"), name="v").chunk({"t": 8})
        p = x.chunk({"t": -1, "y": 5}).persist()
        wait(p)
        again = x.chunk({"t": -1, "y": 5})
        (entry,) = dask_redist.explain([again.mean("t"), again.max("t")])
        assert entry.runs.startswith("nothing") and "in memory" in entry.reason, entry
        assert str(dask_redist.explain(again)).startswith("nothing runs, the output is in memory"), entry
        (other,) = dask_redist.explain(x.chunk({"t": -1, "y": 4}))
        assert other.runs == "collective", other
        before = scheduler_history(client)
        mean, top = dask.compute(again.mean("t"), again.max("t"))
        assert runs_since(client, before) == []
    np.testing.assert_array_equal(mean.values, b.mean(axis=0))
    np.testing.assert_array_equal(top.values, b.max(axis=0))
