"""The collective's output keys are never Dask's keys with another task behind them."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from distributed import wait

import dask_redist
from conftest import scheduler_history
from dask_redist.graph.decide import HELD_BY_DASK
from dask_redist.graph.names import is_own

NEW = (64, 4)


def _run_spec_warnings(client) -> int:
    """How many of the scheduler's log lines (its latest 10000) warn of a key with two tasks."""
    return sum("different `run_spec`" in msg for _, msg in client.get_scheduler_logs(n=10_000))


@pytest.mark.parametrize("dask_first", [True, False])
@pytest.mark.parametrize("method", ["p2p", "tasks"])
def test_dasks_rechunk_and_the_collective_of_one_array_share_no_key(client, method, dask_first):
    """Held side by side (as the demo compares them), both run: no run_spec warning, and the
    collective's run is in the history."""
    a = np.arange(64 * 64.0).reshape(64, 64)
    x = da.from_array(a, chunks=(4, 64)).persist()
    wait(x)
    warned, runs = _run_spec_warnings(client), len(scheduler_history(client))
    held = []
    for dasks in (dask_first, not dask_first):
        if dasks:
            held.append(x.rechunk(NEW, method=method).persist())
        else:
            with dask_redist.enable(engine="dask"):
                held.append(x.rechunk(NEW).persist())
        wait(held[-1])
    assert _run_spec_warnings(client) == warned
    assert len(scheduler_history(client)) == runs + 1  # (the collective ran, not the result held reused)
    plain, collective = held if dask_first else held[::-1]
    assert is_own(collective.name) and not is_own(plain.name)
    for y in held:
        np.testing.assert_array_equal(y.compute(), a)


def test_the_explicit_form_is_not_dasks_tasks_rechunk(client):
    a = np.arange(64 * 64.0).reshape(64, 64)
    x = da.from_array(a, chunks=(4, 64)).persist()
    plain = x.rechunk(NEW, method="tasks").persist()
    wait(plain)
    warned, runs = _run_spec_warnings(client), len(scheduler_history(client))
    y = dask_redist.rechunk(x, NEW, engine="dask").persist()
    wait(y)
    assert y.name != plain.name and len(scheduler_history(client)) == runs + 1
    assert _run_spec_warnings(client) == warned
    np.testing.assert_array_equal(y.compute(), a)


def test_names_follow_the_settings_and_downstream_finds_them(client):
    x = da.ones((64, 64), chunks=(4, 64))
    with dask_redist.enable(engine="dask"):
        y, again = x.rechunk(NEW), x.rechunk(NEW)
        z = (y + 1).sum()
    with dask_redist.enable(engine="dask", memory_budget="1MiB"):
        other = x.rechunk(NEW)
    assert y.name == again.name != other.name and is_own(other.name)
    assert y.name in z.dask.dependencies[next(n for n in z.dask.layers if n.startswith("add-"))]
    with dask_redist.enable(engine="dask"):
        assert z.compute() == 2 * 64 * 64


def test_a_rechunk_built_before_enable_and_held_by_dask_stays_dasks(client):
    """Built before enable(), a rechunk has Dask's names: where the scheduler holds them with Dask's
    tasks, the rewrite keeps Dask's rechunk (the same tasks, reused), with no run_spec warning."""
    a = np.arange(64 * 64.0).reshape(64, 64)
    x = da.from_array(a, chunks=(4, 64)).persist()
    y = x.rechunk(NEW)
    with dask_redist.enable(engine="dask", min_bytes=0):
        assert dask_redist.explain(y)[0].runs == "collective"  # (nothing holds its keys yet)
    held = y.persist()
    wait(held)
    warned, runs = _run_spec_warnings(client), len(scheduler_history(client))
    with dask_redist.enable(engine="dask", min_bytes=0):
        (entry,) = dask_redist.explain(y)  # says so, as the rewrite on the scheduler decides
        assert (entry.runs, entry.reason) == ("dask-rechunk", HELD_BY_DASK), entry
        assert HELD_BY_DASK in str(dask_redist.explain(y))
        again = y.persist()
        wait(again)
        z = (y + 1).persist()  # (a new graph around the held keys)
        wait(z)
    assert _run_spec_warnings(client) == warned
    assert len(scheduler_history(client)) == runs
    np.testing.assert_array_equal(z.compute(), a + 1)
    del held, again, z
