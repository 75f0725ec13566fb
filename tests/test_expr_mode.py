"""The cluster tests again, under dask's expression mode (``array.query-planning: True``).

dask.array picks its implementation at import, so the tests run in a fresh
interpreter with the mode switched on through the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)


def test_expression_mode_really_switches():
    code = "import dask.array as da; print(type(da.ones(2)).__module__)"
    env = {**os.environ, "DASK_ARRAY__QUERY_PLANNING": "True"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "_array_expr" in out.stdout


@pytest.mark.slow
def test_cluster_suite_in_expression_mode():
    env = {
        **os.environ,
        "DASK_ARRAY__QUERY_PLANNING": "True",
        "REDIST_TEST_WORKERS": "2",
        "REDIST_TEST_EXAMPLES": "10",
    }
    selection = (
        "generated or dtypes or operations or several or persist or needed or threads or zero_size or object"
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        os.path.join(HERE, "test_cluster.py"),
        "-q",
        "-x",
        "-p",
        "no:cacheprovider",
        "-k",
        selection,
    ]
    result = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=600, cwd=os.path.dirname(HERE)
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "failed" not in result.stdout


#: Run in expression mode: dask_redist.rechunk refuses with what to do instead; dask_redist.fft
#: equals NumPy, under enable() on a cluster (its rechunks the collective) and without one.
EXPLICIT_FORMS = """
import dask
dask.config.set({"redist.min-bytes": 0})
import numpy as np, dask.array as da, pytest
import dask_redist, dask_redist.fft as F
from distributed import Client, LocalCluster

X = np.arange(40 * 30.0).reshape(40, 30)
x = da.from_array(X, chunks=(5, 30))
assert "_array_expr" in type(x).__module__
with pytest.raises(dask_redist.NotEligibleError, match=r"array.query-planning: True.*x.rechunk\\(...\\) under dask_redist.enable"):
    dask_redist.rechunk(x, (40, 3))
np.testing.assert_allclose(F.fftn(x, axes=(1,)).compute(scheduler="sync"), np.fft.fftn(X, axes=(1,)))
with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, Client(c) as client:
    with pytest.raises(dask_redist.NotEligibleError, match="query-planning"):
        dask_redist.rechunk(x, (40, 3))
    with dask_redist.enable():
        np.testing.assert_allclose(F.fftn(x).compute(), np.fft.fftn(X), atol=1e-9)
        np.testing.assert_allclose(F.irfft2(F.rfft2(x)).compute(), X, atol=1e-9)
    runs = dask_redist.status(client)["history"]
    assert len(runs) >= 2 and all(r["outcome"] == "done" for r in runs), runs
print("ok")
"""


def test_explicit_forms_in_expression_mode():
    """dask_redist.rechunk raised AttributeError ('dict' object has no attribute 'dependents') and
    dask_redist.fft.fftn another ('Array' object has no attribute 'npartitions') in expression mode."""
    env = {**os.environ, "DASK_ARRAY__QUERY_PLANNING": "True"}
    result = subprocess.run(
        [sys.executable, "-c", EXPLICIT_FORMS], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
