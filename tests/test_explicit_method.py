"""A ``method=`` passed to ``rechunk`` is the caller's choice: Dask's own method runs
(``redist.respect-method``), and ``explain`` says so (issue 26, item 3); so is a method set in
dask's config, ``array.rechunk.method`` (issue 41, item 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import runs_since, scheduler_history

import dask_redist
from dask_redist.config import Settings
from dask_redist.graph.decide import decide, find_rechunks

NEW = (64, 8)


def decision(y):
    graph = y.__dask_graph__()
    (chain,) = [c for c in find_rechunks(graph, {y.name}) if c.output == y.name]
    return decide(graph, chain, Settings(min_bytes=0))


def array():
    return da.from_array(np.arange(64 * 64.0).reshape(64, 64), chunks=(8, 64))


@pytest.mark.parametrize("method", ["tasks", "p2p"])
@pytest.mark.parametrize("how", ["x.rechunk", "da.rechunk"])
def test_an_explicit_method_keeps_dasks_rechunk_while_enabled(method, how):
    x = array()
    with dask_redist.enable():
        y = x.rechunk(NEW, method=method) if how == "x.rechunk" else da.rechunk(x, NEW, method=method)
        plain = x.rechunk(NEW)
    d = decision(y)
    assert not d.collective and d.reason.startswith(f"method={method!r} was passed to rechunk"), d.reason
    assert "redist.respect-method" in d.reason
    if (
        method == "p2p"
    ):  # (dask's p2p rechunk calls rechunk(method="tasks") for its pre-chunking: not the caller)
        annotations = [layer.collection_annotations or {} for layer in y.dask.layers.values()]
        assert sum("redist-method" in a for a in annotations) == 1
    assert decision(plain).collective
    with dask_redist.enable(respect_method=False):  # the user asks otherwise
        z = x.rechunk(NEW, method=method) if how == "x.rechunk" else da.rechunk(x, NEW, method=method)
    assert decision(z).collective
    with dask_redist.enable():  # the explicit form: the collective
        assert dask_redist.rechunk(x, NEW, min_bytes=0).name == plain.name


def test_respect_method_is_checked_like_every_setting():
    with pytest.raises(
        dask_redist.ConfigError, match="redist.respect-method must be true or false, got 'no'"
    ):
        dask_redist.enable(respect_method="no")


def test_an_explicit_method_runs_dasks_rechunk_and_explain_says_so(client):
    a = np.arange(64 * 64.0).reshape(64, 64)
    x = da.from_array(a, chunks=(8, 64))
    with dask_redist.enable(engine="dask"):
        before = scheduler_history(client)
        y = x.rechunk(NEW, method="tasks")
        (entry,) = dask_redist.explain(y)
        assert entry.runs == "dask-rechunk" and entry.method.startswith("tasks"), entry
        assert "method='tasks' was passed to rechunk" in str(dask_redist.explain(y))
        np.testing.assert_array_equal(y.compute(), a)
        assert not runs_since(client, before)  # no collective ran
        with dask.config.set({"redist.respect-method": False}):  # the user asks otherwise, for these calls
            z = x.rechunk(NEW, method="tasks")
        assert (
            dask_redist.explain(y)[0].runs == "dask-rechunk"
            and dask_redist.explain(z)[0].runs == "collective"
        )
        np.testing.assert_array_equal(z.compute(), a)
        assert len(runs_since(client, before)) == 1


@pytest.mark.parametrize("config_value", ["tasks", "p2p", None])
@pytest.mark.parametrize("keyword", ["tasks", "p2p", None])
def test_a_configured_method_is_respected_like_method_with_distributeds_semantics(
    client, config_value, keyword
):
    """distributed's ``shuffle/tests/test_rechunk.py::test_rechunk_configuration``, enabled: the
    method the user chose (``method=`` first, then dask's config) is Dask's and runs as such; only
    where neither is set (Dask chooses: p2p here) the collective takes over, under the same keys."""
    a = np.random.default_rng(0).uniform(0, 1, 100).reshape((10, 10))
    x = da.from_array(a, chunks=(10, 1))
    new = ((1,) * 10, (10,))
    config = {"array.rechunk.method": config_value} if config_value is not None else {}
    with dask_redist.enable(engine="dask"):
        before = scheduler_history(client)
        with dask.config.set(config):
            y = da.rechunk(x, chunks=new, method=keyword)
        chosen = keyword if keyword is not None else config_value
        p2p = [key[0][0].startswith("rechunk-p2p") for key in y.__dask_keys__()]
        assert all(p2p) if chosen in ("p2p", None) else not any(p2p)  # (None: dask's heuristic, p2p)
        (entry,) = dask_redist.explain(y)
        assert entry.runs == ("collective" if chosen is None else "dask-rechunk"), entry
        if keyword is None and config_value is not None:
            assert f"dask config sets array.rechunk.method: {config_value!r}" in entry.reason, entry.reason
        assert y.chunks == new
        np.testing.assert_array_equal(y.compute(), a)
        assert len(runs_since(client, before)) == (chosen is None)


@pytest.mark.parametrize(
    "new",
    [((1,) * 100, (100,)), ((50, 50), (2,) * 50), ((25, 25, 25, 25), (4,) * 25), ((10,) * 10, (10,) * 10)],
)
def test_the_collective_takes_over_whatever_dasks_heuristic_chose(client, new):
    """distributed's ``test_rechunk_heuristic``, enabled: where Dask chooses the method (neither
    ``method=`` nor the config), the collective runs instead, tasks or p2p alike; the config is
    read when the rechunk is called, so setting it afterwards changes nothing."""
    a = np.random.default_rng(1).uniform(0, 1, 10000).reshape((100, 100))
    x = da.from_array(a, chunks=(100, 1))
    with dask_redist.enable(engine="dask"):
        before = scheduler_history(client)
        y = da.rechunk(x, chunks=new)
        assert dask_redist.explain(y)[0].runs == "collective"
        with dask.config.set({"array.rechunk.method": "tasks"}):
            np.testing.assert_array_equal(y.compute(), a)
        assert y.chunks == new and len(runs_since(client, before)) == 1


def test_expression_mode_keeps_dasks_rechunk_for_an_explicit_method():
    code = """
import dask, dask.array as da, dask_redist
from dask_redist.graph.expr import CollectiveRechunk
x = da.ones((64, 64), chunks=(8, 64))
with dask_redist.enable(min_bytes=0):
    assert isinstance(x.rechunk((64, 8)).expr, CollectiveRechunk)
    y = x.rechunk((64, 8), method="tasks")
    assert not isinstance(y.expr, CollectiveRechunk) and y.expr.method == "tasks"
    assert not isinstance(da.rechunk(x, (64, 8), method="tasks").expr, CollectiveRechunk)
    (entry,) = dask_redist.explain(y)
    assert entry.runs == "dask-rechunk" and "method='tasks' was passed" in entry.reason, entry
    with dask.config.set({"redist.respect-method": False}):
        assert isinstance(x.rechunk((64, 8), method="tasks").expr, CollectiveRechunk)
    with dask.config.set({"array.rechunk.method": "tasks"}):  # a configured method, the same
        y = x.rechunk((64, 8))
        with dask.config.set({"redist.respect-method": False}):
            assert isinstance(x.rechunk((64, 8)).expr, CollectiveRechunk)
    assert not isinstance(y.expr, CollectiveRechunk) and y.expr.method == "tasks"
    assert dask_redist.explain(y)[0].runs == "dask-rechunk"
print("ok")
"""
    env = {**os.environ, "DASK_ARRAY__QUERY_PLANNING": "True"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("min_bytes", ["auto", "1GiB"])
def test_the_explicit_form_runs_where_min_bytes_would_keep_dasks_and_explain_says_so(client, min_bytes):
    """``dask_redist.rechunk`` refuses only what cannot take part: where the cost model (or a
    ``redist.min-bytes`` size) would keep Dask's rechunk, it runs, and ``explain`` says so."""
    a = np.arange(64 * 64.0).reshape(64, 64)
    x = da.from_array(a, chunks=(32, 64))
    with dask.config.set({"redist.min-bytes": min_bytes}):
        graph = x.rechunk((64, 32), method="tasks").__dask_graph__()
        (chain,) = find_rechunks(graph)
        assert not decide(graph, chain, Settings.from_config()).collective  # (Dask's is preferred)
        runs = len(scheduler_history(client))
        y = dask_redist.rechunk(x, (64, 32))
        (entry,) = dask_redist.explain(y)
    assert entry.runs == "collective", entry
    assert "asked for by dask_redist.rechunk; without it" in entry.reason, entry.reason
    assert (
        "the cost model would have kept" if min_bytes == "auto" else "below redist.min-bytes"
    ) in entry.reason
    np.testing.assert_array_equal(y.compute(), a)
    assert len(scheduler_history(client)) == runs + 1
