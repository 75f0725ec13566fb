"""The rule ``redist.engine: auto`` follows (`dask_redist.engines.choice`), without a cluster.

The same rule runs on the scheduler (`EngineSelector`) and in ``explain``; what it decides on a
cluster is checked in tests/test_cluster.py (CPU workers) and tests/test_gpu.py (GPU workers).
"""

from __future__ import annotations

import numpy as np
import pytest

import dask_redist
from dask_redist.config import ConfigError, Settings
from dask_redist.core.spec import CollectiveSpec
from dask_redist.engines.choice import EngineSelector, choose_engine, numpy_stays_on_host
from dask_redist.planning import RechunkSpec

ABLE = {"cufftmp": {"ok": True, "reason": "loads"}}
UNABLE = {"cufftmp": {"ok": False, "reason": "no GPU visible"}}
MiB = 2**20


def spec(nbytes: int, dtype="float64", **settings) -> CollectiveSpec:
    itemsize = np.dtype(dtype).itemsize
    n = nbytes // itemsize // 4
    rechunk = RechunkSpec(((n, n, n, n),), ((2 * n, 2 * n),), itemsize)
    return CollectiveSpec("t", "x", "y", rechunk, np.dtype(dtype), Settings(**settings))


def test_numpy_via_gpus_is_read_as_a_size_or_false():
    assert Settings.from_config({**_config(), "numpy-via-gpus": "1GiB"}).numpy_via_gpus == 2**30
    assert Settings.from_config({**_config(), "numpy-via-gpus": False}).numpy_via_gpus is None
    assert Settings.from_config({**_config(), "numpy-via-gpus": 0}).numpy_via_gpus == 0
    assert Settings.from_config().numpy_via_gpus == 256 * MiB  # the default in redist.yaml
    with pytest.raises(ConfigError, match="redist.numpy-via-gpus"):
        dask_redist.enable(numpy_via_gpus="lots")
    with pytest.raises(ConfigError, match="redist.numpy-via-gpus"):
        dask_redist.enable(numpy_via_gpus=True)


def _config() -> dict:
    import dask

    return dask.config.get("redist")


@pytest.mark.parametrize(
    "nbytes, dtype, limit, stays",
    [
        (64 * MiB, "float64", 256 * MiB, "below redist.numpy-via-gpus"),
        (256 * MiB, "float64", 256 * MiB, None),
        (256 * MiB, "complex64", 0, None),
        (256 * MiB, "float64", None, "redist.numpy-via-gpus is false"),
        (256 * MiB, "datetime64[ns]", 0, "only the dask engine moves"),
    ],
)
def test_numpy_stays_on_host_below_the_size_or_for_dtypes_cupy_lacks(nbytes, dtype, limit, stays):
    why = numpy_stays_on_host(Settings(numpy_via_gpus=limit), nbytes, dtype)
    assert (why is None) if stays is None else (stays in why), why


def test_auto_takes_numpy_chunks_through_the_gpus_only_where_every_worker_can():
    workers = ["a", "b"]
    assert choose_engine("auto", "numpy", {w: ABLE for w in workers}, workers, numpy_reason=None)[0] == "cufftmp"
    engine, why = choose_engine("auto", "numpy", {"a": ABLE, "b": UNABLE}, workers, numpy_reason=None)
    assert engine == "dask" and "cufftmp unusable on b: no GPU visible" in why
    engine, why = choose_engine("auto", "numpy", {w: ABLE for w in workers}, workers, numpy_reason="too small")
    assert (engine, why) == ("dask", "too small")
    engine, why = choose_engine("auto", "numpy", {w: ABLE for w in workers}, workers)  # nobody asked the size
    assert engine == "dask" and "NumPy chunks" in why
    assert choose_engine("cufftmp", "numpy", {}, workers, numpy_reason="too small")[0] == "cufftmp"  # asked for
    assert choose_engine("dask", "cupy", {w: ABLE for w in workers}, workers)[0] == "dask"


def test_the_scheduler_asks_workers_only_when_the_answer_matters():
    selector = EngineSelector()
    small, big = spec(16 * MiB), spec(512 * MiB)
    assert selector.needs_probe(small, "numpy", ["a", "b"]) == []  # stays on host whatever they answer
    assert selector.needs_probe(big, "numpy", ["a", "b"]) == ["a", "b"]
    assert selector.needs_probe(small, "cupy", ["a", "b"]) == ["a", "b"]
    assert selector.needs_probe(spec(512 * MiB, engine="dask"), "numpy", ["a"]) == []
    selector.learn({"a": ABLE, "b": "an error"})  # b did not answer: asked again next time
    assert selector.needs_probe(big, "numpy", ["a", "b"]) == ["b"]
    selector.learn({"b": ABLE})
    assert selector.choose(big, "numpy", ["a", "b"])[0] == "cufftmp"
    assert selector.choose(small, "numpy", ["a", "b"])[0] == "dask"
    assert selector.choose(spec(512 * MiB, numpy_via_gpus=None), "numpy", ["a", "b"])[0] == "dask"
    selector.run_started("cufftmp", ["a", "b"])
    engine, why = selector.choose(big, "numpy", ["a"])  # not the world NVSHMEM was bootstrapped over
    assert engine == "dask" and "worker set changed" in why


def test_stranded_workers_refuse_a_forced_cufftmp_run_but_a_restart_finishes_on_dask():
    """After a PE died: a new rechunk forced onto cufftmp over its stranded survivors is refused with
    the remedy; the restart of a rechunk that lost the worker finishes on the dask engine instead."""
    selector = EngineSelector()
    workers = ["tcp://a:1", "tcp://b:1"]
    selector.learn({w: ABLE for w in workers + ["tcp://c:1"]})
    selector.world.members = ("tcp://a:1", "tcp://c:1")
    selector.worker_left("tcp://c:1")  # a's peer died: a is stranded
    forced = spec(64 * MiB, engine="cufftmp")
    assert selector.choose(forced, "cupy", workers) == ("cufftmp", "set by redist.engine")
    refused = selector.refusal("cufftmp", workers, "cupy", np.dtype("float64"))
    assert "['tcp://a:1']" in refused and "restart_broken=True" in refused
    engine, why = selector.choose(forced, "cupy", workers, restarting=True)
    assert engine == "dask" and "restarted after a worker left" in why and "tcp://a:1" in why
    assert selector.refusal("dask", workers, "cupy", np.dtype("float64")) is None
    # workers outside the dead world are not stranded
    assert selector.refusal("cufftmp", ["tcp://b:1", "tcp://d:1"], "cupy", np.dtype("float64")) is None
