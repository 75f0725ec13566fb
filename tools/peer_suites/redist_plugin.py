"""pytest plugin for tools/peer-suites.sh: runs a peer project's suite as is, or with dask-redist on.

Environment:

* ``PEER_REDIST``: ``on`` calls ``dask_redist.enable()`` for the whole session; ``off`` does not.
* ``PEER_MIN_BYTES``: ``redist.min-bytes`` while on (default ``0``: every eligible rechunk runs as
  the collective, however small; ``auto`` leaves the small ones to Dask, as by default).
* ``PEER_CLIENT``: ``inproc`` or ``processes`` starts a session ``distributed.Client`` on a
  ``LocalCluster`` of 2 workers (threads in this process, or worker processes) and makes it the
  default; ``none`` (the default) starts none (the suite's own clusters, e.g. ``gen_cluster``).
* ``PEER_PATHS``: ``package=directory`` pairs (``:``-separated) added to a package's
  ``__path__``: test subpackages that the installed wheel leaves out (distributed's
  ``shuffle/tests``), taken from a source checkout of the same release.
* ``PEER_REPORT``: a JSON file written at the end: collective runs started (every scheduler in
  this process: ``gen_cluster``'s and ``LocalCluster``'s) and the tests during which they started.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings

import pytest

_runs: dict[str, int] = {}
_current = {"test": "(outside tests)"}
_session: list = []


def _extend_paths() -> None:
    for pair in filter(None, os.environ.get("PEER_PATHS", "").split(":")):
        package, directory = pair.split("=", 1)
        module = importlib.import_module(package)
        if directory not in module.__path__:
            module.__path__.append(directory)


def _count_runs() -> None:
    from dask_redist.runtime.lifecycle import Rechunks

    start = Rechunks.start

    def counted(self, *args, **kwargs):
        _runs[_current["test"]] = _runs.get(_current["test"], 0) + 1
        return start(self, *args, **kwargs)

    Rechunks.start = counted


def _start_client(kind: str) -> None:
    from distributed import Client, LocalCluster

    with (
        warnings.catch_warnings()
    ):  # (the session's cluster is not under test: its warnings are not the suite's)
        warnings.simplefilter("ignore")
        cluster = LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=kind == "processes",
            dashboard_address=":0",
            worker_dashboard_address=":0",
        )
        client = Client(cluster, set_as_default=True)
    _session.extend([client, cluster])


def _enable() -> None:
    if os.environ.get("PEER_REDIST", "off") == "on":
        import dask_redist

        dask_redist.enable(min_bytes=os.environ.get("PEER_MIN_BYTES", "0"))


# On import (``-p redist_plugin`` comes before the suite's conftest): distributed's test harness
# resets dask's config before every cluster test to the config it found when
# ``distributed.utils_test`` was imported, so ``enable()`` must come before that, as a user's
# would at the top of a program.
# (the modules dask's conftest has pytest rewrite the asserts of, registered before this plugin
# imports them: registered after that, pytest warns, and the suites turn warnings into errors)
pytest.register_assert_rewrite("dask.array.utils", "dask.dataframe.utils", "dask.bag.utils")
_extend_paths()
_count_runs()
_enable()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if not config.pluginmanager.hasplugin("asyncio"):  # (xarray's suite marks tests for pytest-asyncio)
        config.addinivalue_line("markers", "asyncio: pytest-asyncio's marker (not installed)")
    kind = os.environ.get("PEER_CLIENT", "none")
    if kind not in ("none", "inproc", "processes"):
        raise pytest.UsageError(f"PEER_CLIENT must be none, inproc or processes, got {kind!r}")
    if kind != "none":
        _start_client(kind)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["test"] = item.nodeid
    try:
        return (yield)
    finally:
        _current["test"] = "(outside tests)"


def pytest_unconfigure(config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for thing in _session:
            thing.close()
    report = os.environ.get("PEER_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({"runs": sum(_runs.values()), "tests": _runs}, f, indent=1, sort_keys=True)
