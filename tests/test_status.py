"""``dask_redist.status``: readable (tables, durations), a dict as before, and a clear error on a
closed Client (issue 26, item 5)."""

from __future__ import annotations

import re

import dask.array as da
import numpy as np
import pytest

import dask_redist
from dask_redist.report import RUNS_SHOWN, Status


def test_status_prints_tables_with_durations_and_stays_a_dict(client):
    a = np.arange(64 * 64.0).reshape(64, 64)
    with dask_redist.enable(engine="dask"):
        np.testing.assert_array_equal(da.from_array(a, chunks=(8, 64)).rechunk((64, 8)).compute(), a)
    s = dask_redist.status(client)
    assert isinstance(s, dict) and s["history"][-1]["outcome"] == "done"  # (as callers index it)
    assert set(s["workers"]) == set(client.scheduler_info()["workers"]) and "unanswered" in s
    text = str(s)
    assert text.startswith(f"dask-redist: {len(s['workers'])} workers answered;"), text
    assert "runs finished, latest last" in text and "dask" in text and "done" in text
    assert re.search(r"outputs in memory\s+\+[\d.]+ [mu]?s\s+[\d.]+ [mu]?s ago", text), text
    epochs = [
        t
        for marks in [s["timeline"], *(w["timeline"] for w in s["workers"].values())]
        for t in marks.values()
    ]
    assert epochs and not any(str(int(t)) in text for t in epochs), text  # durations, not epoch seconds
    assert repr(s) == text
    page = s._repr_html_()
    assert page.count("<table>") == len(s.sections()) >= 3 and "outputs in memory" in page


def test_status_shows_the_latest_runs_and_says_where_the_rest_are():
    history = [
        {
            "token": f"{i:08x}" * 4,
            "run": 1,
            "engine": "dask",
            "outcome": "done",
            "bytes": 2**20,
            "bytes moved": 2**19,
            "seconds": 0.25,
            "why": "set by redist.engine",
        }
        for i in range(RUNS_SHOWN + 5)
    ]
    s = Status(
        {"history": history, "active": [], "timeline": {}, "engines": {}, "workers": {}, "unanswered": {}}
    )
    text = str(s)
    assert "(5 earlier in status['history'])" in text and "1.00 MiB" in text and "250.00 ms" in text
    assert f"{RUNS_SHOWN + 4:08x} #1" in text and f"{4:08x} #1" not in text and f"{5:08x} #1" in text


def test_status_of_a_closed_client_says_so(cluster):
    from distributed import Client

    c = Client(cluster, set_as_default=False)
    c.close()
    with pytest.raises(ValueError, match="client: the Client is closed; dask_redist needs an open one"):
        dask_redist.status(c)


def test_the_plugins_are_registered_once_per_client_and_scheduler(cluster, monkeypatch):
    """``status`` (and ``explain``, ``doctor``, the FFT's GPU path) ask the scheduler's plugin: a
    Client registers it with its first question, not with every one; one that hears from another
    scheduler (its id changed: restarted, reconnected) registers it again."""
    from distributed import Client

    with Client(cluster, set_as_default=False) as c:
        calls = []
        register = c.register_plugin
        monkeypatch.setattr(c, "register_plugin", lambda *a, **k: (calls.append(1), register(*a, **k))[1])
        for _ in range(3):
            assert dask_redist.status(c)["workers"]
        assert len(calls) == 1
        monkeypatch.setitem(c._scheduler_identity, "id", "Scheduler-another")
        assert dask_redist.status(c)["workers"] and len(calls) == 2


def test_status_explain_doctor_and_bootstrap_are_awaited_with_an_asynchronous_client():
    """With ``Client(asynchronous=True)`` the functions that ask the cluster answer as distributed's
    own methods do there: an awaitable (they raised TypeError on the coroutine client.sync gave)."""
    import asyncio
    import inspect

    from distributed import Client, LocalCluster

    a = np.arange(64 * 48.0).reshape(64, 48)
    x = da.from_array(a, chunks=(8, 48))

    async def main():
        async with (
            LocalCluster(
                n_workers=2, threads_per_worker=1, processes=False, asynchronous=True, dashboard_address=None
            ) as c,
            Client(c, asynchronous=True) as client,
        ):
            with dask_redist.enable(engine="dask"):
                np.testing.assert_array_equal(await client.compute(x.rechunk((64, 6))), a)
                explained = dask_redist.explain(x.rechunk((64, 6)))
                assert inspect.isawaitable(explained)
                explained = await explained
                assert explained[0].runs == "collective" and explained.nworkers == 2, str(explained)
            s = dask_redist.status()
            assert inspect.isawaitable(s)
            s = await s
            assert isinstance(s, Status) and s["history"][-1]["outcome"] == "done" and len(s["workers"]) == 2
            diagnosis = await dask_redist.doctor(client)
            assert len(diagnosis.workers) == 2
            started = dask_redist.bootstrap(client, engine="dask")  # (it has no world: raised when awaited)
            assert inspect.isawaitable(started)
            with pytest.raises(ValueError, match="no world"):
                await started

    asyncio.run(main())


def test_status_of_a_scheduler_that_is_gone_raises_a_timeout_error_naming_it():
    """The scheduler stopped: ``status`` raises `RedistTimeoutError`, as its docstring says, not
    distributed's ``OSError`` (2026-12-07: "Timed out trying to connect to ... after 20 s")."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):
        with LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster:
            with Client(cluster, set_as_default=False) as c:
                assert dask_redist.status(c)["workers"]
                address = cluster.scheduler.address
                c.sync(cluster.scheduler.close)
                with pytest.raises(
                    dask_redist.RedistTimeoutError, match=f"could not reach the scheduler at {address}"
                ):
                    dask_redist.status(c)


def test_status_names_the_runs_workers_hold_as_the_history_does(client):
    """A worker's "runs held" cell named each run by its whole description (layer name, rank,
    the worker's own address): ten wrapped lines per run in a notebook, and "(done)" for a run
    the history called failed. Now the history's name ("c00e268c #1") and "failed"."""
    from distributed import wait

    x = da.from_array(np.arange(900.0).reshape(30, 30), chunks=(3, 30))
    with dask_redist.enable(engine="engines:FailingEngine", timeouts={"collective": "60s"}):
        y = x.rechunk((30, 3)).persist()
        wait(y, timeout=60)
    s = dask_redist.status(client)
    run = s["history"][-1]
    assert run["outcome"] == "failed", run
    name = f"{run['token'][:8]} #{run['run']}"
    held = [cell for w in s["workers"].values() for cell in w["runs held"].items()]
    assert held and all(cell == (name, "failed") for cell in held), held
    (workers,) = [rows for title, rows in s.sections() if title == "workers"]
    assert all(row["runs held"] == f"{name} (failed)" for row in workers), workers
    del y


def test_status_says_why_a_run_failed(client):
    """A failed run's why was the engine's reason ("set by redist.engine", "NumPy chunks on CPU
    workers"): status() did not say what failed. Now the failure, the engine's reason after it."""
    x = da.from_array(np.arange(900.0).reshape(30, 30), chunks=(3, 30))
    with dask_redist.enable(engine="engines:FailingEngine", timeouts={"collective": "60s"}):
        with pytest.raises(dask_redist.RedistError, match="injected failure on rank 0"):
            x.rechunk((30, 3)).compute()
    run = dask_redist.status(client)["history"][-1]
    assert run["outcome"] == "failed" and "injected failure on rank 0" in run["why"], run
    assert run["why"].endswith("(engine: set by redist.engine)"), run


def test_status_shows_a_run_in_flight_as_the_history_does(client):
    """A run in flight was one cell of its whole description ("rechunk c6075e00 (rechunk-p2p-...)
    run 1"); now a row as the history's: its name, engine, bytes, time so far and why."""
    from conftest import wait_for_active_run
    from distributed import wait

    a = np.arange(900.0).reshape(30, 30)
    with dask_redist.enable(engine="engines:SlowEngine", min_bytes=0):
        y = da.from_array(a, chunks=(3, 30)).rechunk((30, 3)).persist()
        wait_for_active_run(client, 30)
        s = dask_redist.status(client)
        wait(y, timeout=60)
    np.testing.assert_array_equal(y.compute(), a)
    ((title, rows),) = [(t, r) for t, r in s.sections() if t == "runs in flight"]
    (row,) = rows
    assert row["run"] == f"{s['in flight'][0]['token'][:8]} #1" and row["outcome"] == "in flight", row
    assert row["engine"] == "engines:SlowEngine" and row["bytes"] == "7.03 kiB", row
    assert row["run"] in str(s) and "rechunk-p2p" not in str(s), str(s)
