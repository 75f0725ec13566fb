"""The ``redist.*`` settings as a user meets them: checked on the client whichever way they were
set, with a short error naming the key, and there even where dask's config lost them."""

from __future__ import annotations

import copy
import subprocess
import sys

import dask
import pytest

import dask_redist
from dask_redist.config import Settings
from dask_redist.graph.optimize import CollectiveOptimizer


def test_settings_fall_back_to_the_packaged_defaults_where_dask_lost_them():
    """distributed's test utilities restore a config copied before dask_redist was imported (issue
    26, item 9): enable() raised KeyError: 'redist'."""
    code = (
        "import distributed.utils_test as ut, dask, dask_redist\n"
        "ut.reset_config()\n"
        "assert dask.config.get('redist', None) is None\n"
        "dask_redist.enable()\n"
        "print(dask_redist.Settings.from_config() == dask_redist.Settings(), dask.config.get('redist.engine'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "auto"]


def test_keys_dask_lost_one_by_one_are_read_from_the_packaged_defaults():
    saved = copy.deepcopy(dask.config.config)
    try:
        del dask.config.config["redist"]["timeouts"]["barrier"]
        del dask.config.config["redist"]["engine"]
        with dask.config.set({"redist.min-bytes": 0}):
            settings = Settings.from_config()
        assert settings.barrier_timeout == 60.0 and settings.engine == "auto" and settings.min_bytes == 0
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_a_preload_that_cannot_enable_says_so(cluster):
    from distributed import Client

    with dask.config.set({"distributed.client.preload": ["dask_redist.preload"], "redist.engine": "mpi"}):
        with pytest.warns(RuntimeWarning, match="could not turn the collective on: ConfigError: redist.engine"):
            with Client(cluster, set_as_default=False):
                pass
    assert not isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)
    assert dask_redist.api._enabled == []
