"""What travels between processes pickles on every Python the project supports (issue 41, item 1):
the scheduler plugin is pickled from a stage task (`runtime.tasks.register`), and Python 3.14
cannot pickle ``itertools`` objects (3.12 and 3.13 warn)."""

from __future__ import annotations

import io
import pickle
import warnings

import dask.array as da
import numpy as np
from distributed import Client

import dask_redist
from dask_redist.runtime.scheduler import RedistSchedulerPlugin
from dask_redist.runtime.tasks import plugins
from conftest import local_cluster

# modules whose objects cannot travel (or, for itertools, not from Python 3.14 on)
NOT_TRAVELLING = ("itertools", "_thread", "threading", "asyncio", "concurrent", "queue", "socket")


class _Walker(pickle.Pickler):
    """A pickler that notes the module of every object it pickles."""

    def __init__(self):
        super().__init__(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: set[str] = set()

    def persistent_id(self, obj):
        self.modules.add(type(obj).__module__)
        return None


def modules_pickled(obj) -> set[str]:
    walker = _Walker()
    walker.dump(obj)
    return walker.modules


def test_the_plugins_travel_without_their_state_and_without_itertools():
    with local_cluster(2, processes=False) as cluster, Client(cluster) as client:
        a = np.arange(32 * 32.0).reshape(32, 32)
        with warnings.catch_warnings(), dask_redist.enable(engine="dask"):
            warnings.simplefilter("error", DeprecationWarning)  # (what 3.12 and 3.13 say of itertools)
            np.testing.assert_array_equal(da.from_array(a, chunks=(4, 32)).rechunk((32, 4)).compute(), a)
        assert dask_redist.status(client)["history"][-1]["outcome"] == "done"
        used = cluster.scheduler.plugins[RedistSchedulerPlugin.name]  # a plugin that ran a rechunk
        assert used.rechunks.history
        for plugin in (plugins(), used):
            modules = modules_pickled(plugin)
            assert not [m for m in modules if m.split(".")[0] in NOT_TRAVELLING], modules
            copy = pickle.loads(pickle.dumps(plugin))
            assert type(copy.worker_plugin).__name__ == "RedistWorkerPlugin"
            assert (
                not copy.rechunks.history and copy.scheduler is None
            )  # a fresh plugin, not a copy of the state


def test_run_sequence_numbers_count_on_from_one():
    rechunks = RedistSchedulerPlugin().rechunks
    assert [rechunks._next_seq() for _ in range(3)] == [1, 2, 3]
