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
