"""An engine named in ``redist.engine`` that the workers cannot run is refused at submission,
once, with the reason and the remedy; ``explain()`` says so beforehand; no task fails for it."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import dask_redist
from conftest import scheduler_history
from dask_redist.errors import EngineUnavailableError

NEW = (64, 4)


def _erred(dask_scheduler=None) -> int:
    return sum(ts.state == "erred" for ts in dask_scheduler.tasks.values())


@pytest.mark.parametrize(
    "engine, why",
    [("cufftmp", "NumPy chunks on CPU workers"), ("os:system", "os:system does not load here")],
)
def test_an_engine_the_workers_cannot_run_is_refused_at_submission(client, engine, why):
    x = da.from_array(np.arange(64 * 64.0).reshape(64, 64), chunks=(4, 64))
    runs = len(scheduler_history(client))
    with dask_redist.enable(engine=engine):
        y = x.rechunk(NEW)
        (entry,) = dask_redist.explain(y)
        assert entry.runs.startswith("refused at submission"), entry
        assert f"redist.engine is {engine!r}" in entry.reason and why in entry.reason, entry.reason
        assert "redist.engine to auto" in entry.reason and "dask-redist doctor" in entry.reason
        with pytest.raises(EngineUnavailableError) as e:
            y.sum().compute()
        assert str(e.value) == entry.reason
        with pytest.raises(EngineUnavailableError, match="redist.engine to auto"):
            dask_redist.rechunk(x, NEW)
    assert len(scheduler_history(client)) == runs and client.run_on_scheduler(_erred) == 0
    with dask_redist.enable(engine="auto"):  # the remedy works
        np.testing.assert_array_equal(x.rechunk(NEW).compute(), x.compute())


def test_an_engine_the_workers_run_is_not_asked_about_twice_in_explain(client):
    x = da.ones((64, 64), chunks=(4, 64))
    with dask_redist.enable(engine="dask"):
        (entry,) = dask_redist.explain(x.rechunk(NEW))
        assert entry.runs == "collective" and entry.engine == "dask", entry
        assert x.rechunk(NEW).sum().compute() == 64 * 64


def test_an_engine_that_does_not_load_on_the_client_is_said_so_once(client, caplog):
    """Each submission, ``explain`` and ``doctor`` asks the engine's description; its class not
    loading on the client is told once per reason, not with every question."""
    x = da.from_array(np.arange(64 * 64.0).reshape(64, 64), chunks=(4, 64))
    with caplog.at_level("WARNING", logger="dask_redist"), dask_redist.enable(engine="os:getcwd"):
        for _ in range(3):
            with pytest.raises(EngineUnavailableError, match="os:getcwd does not load here"):
                x.rechunk(NEW).sum().compute()
    told = [r for r in caplog.records if "does not load here" in r.getMessage()]
    assert len(told) == 1 and "os:getcwd" in told[0].getMessage(), [r.getMessage() for r in told]
