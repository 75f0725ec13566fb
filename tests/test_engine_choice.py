"""The rule ``redist.engine: auto`` follows (`dask_redist.engines.choice`), without a cluster.

The same rule runs on the scheduler (`EngineSelector`), in ``explain`` and in ``doctor``; it asks
the registry's descriptions of the engines. What it decides on a cluster is checked in
tests/test_cluster.py (CPU workers), tests/test_third_engine.py (an engine added by
configuration) and tests/test_gpu.py (GPU workers).
"""

from __future__ import annotations

import dask
import numpy as np
import pytest

import dask_redist
from dask_redist.config import ConfigError, Settings
from dask_redist.core.spec import CollectiveSpec
from dask_redist.engines import Request, WorldRecord, description, descriptions
from dask_redist.engines.choice import EngineSelector, choose_engine
from dask_redist.planning import RechunkSpec

ABLE = {"cufftmp": {"ok": True, "gpus": 1, "reason": "loads"}}
NO_CUPY = {"cufftmp": {"ok": False, "reason": "CuPy unusable: ModuleNotFoundError: No module named 'cupy'"}}
NO_GPU = {"cufftmp": {"ok": False, "gpus": 0, "reason": "no GPU visible"}}
NO_NVMATH = {
    "cufftmp": {"ok": False, "gpus": 1, "reason": "nvmath-python / cuFFTMp / NVSHMEM unusable: ImportError"}
}
MiB = 2**20


def spec(nbytes: int, dtype="float64", **settings) -> CollectiveSpec:
    itemsize = np.dtype(dtype).itemsize
    n = nbytes // itemsize // 4
    rechunk = RechunkSpec(((n, n, n, n),), ((2 * n, 2 * n),), itemsize)
    return CollectiveSpec("t", "x", "y", rechunk, np.dtype(dtype), Settings(**settings))


def request(nbytes=None, chunk_type="numpy", dtype="float64", **settings) -> Request:
    return Request(chunk_type, Settings(**settings), nbytes, np.dtype(dtype))


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
    return dask.config.get("redist")


def test_engine_names_are_checked_against_the_registry():
    """redist.engine: auto, a name of redist.engines (the built-in ones and any added), or a path."""
    assert [n for n, _ in Settings.from_config().engines] == ["dask", "cufftmp", "hybrid"]  # from redist.yaml
    with pytest.raises(
        ConfigError,
        match=r"redist.engine must be auto, an engine of redist.engines \(dask, cufftmp, hybrid\)",
    ):
        Settings.from_config({**_config(), "engine": "nccl"})
    added = Settings.from_config(
        {**_config(), "engine": "nccl", "engines": {"nccl": "mypackage.nccl:NcclEngine"}}
    )
    assert added.engine == "nccl" and added.engine_path("nccl") == "mypackage.nccl:NcclEngine"
    assert added.engine_path("dask") == "dask_redist.engines.dask:DaskEngine"  # the built-in ones stay
    for bad, key in [
        ({"nccl": "no-colon"}, "redist.engines.nccl"),
        ({"auto": "a:B"}, "'auto' is not"),
        ({"two words": "a:B"}, "a word"),
    ]:
        with pytest.raises(ConfigError, match=key):
            Settings.from_config({**_config(), "engines": bad})
    with dask_redist.enable(
        engines={"nccl": "mypackage.nccl:NcclEngine"}, engine="nccl"
    ):  # (a key under engines)
        assert Settings.from_config().engine == "nccl"


def test_the_registry_orders_engines_by_their_auto_preference():
    assert [d.name for d in descriptions()] == ["cufftmp", "hybrid", "dask"]
    assert description("cufftmp").world and not description("dask").world


@pytest.mark.parametrize(
    "nbytes, dtype, limit, declined",
    [
        (64 * MiB, "float64", 256 * MiB, "below redist.numpy-via-gpus"),
        (256 * MiB, "float64", 256 * MiB, None),
        (256 * MiB, "complex64", 0, None),
        (256 * MiB, "float64", None, "redist.numpy-via-gpus is false"),
        (256 * MiB, "datetime64[ns]", 0, "which cufftmp does not move"),
    ],
)
def test_cufftmp_declines_numpy_chunks_below_the_size_or_of_dtypes_cupy_lacks(nbytes, dtype, limit, declined):
    why = description("cufftmp").declines(request(nbytes, dtype=dtype, numpy_via_gpus=limit))
    assert (why is None) if declined is None else (declined in why), why


def test_auto_takes_numpy_chunks_through_the_gpus_only_where_every_worker_can():
    workers = ["a", "b"]
    big, small = request(512 * MiB), request(16 * MiB)
    assert choose_engine(big, {w: ABLE for w in workers}, workers)[0] == "cufftmp"
    engine, why = choose_engine(big, {"a": ABLE, "b": NO_NVMATH}, workers)
    assert engine == "dask" and "cufftmp cannot run on b: nvmath-python" in why and "doctor" in why
    assert choose_engine(small, {w: ABLE for w in workers}, workers) == (
        "dask",
        "NumPy chunks, 16.00 MiB is below redist.numpy-via-gpus (256.00 MiB)",
    )
    assert choose_engine(request(), {w: ABLE for w in workers}, workers)[0] == "cufftmp"  # (doctor: any size)
    assert choose_engine(request(engine="cufftmp"), {}, workers) == (
        "cufftmp",
        "set by redist.engine",
    )  # asked for
    assert (
        choose_engine(request(chunk_type="cupy", engine="dask"), {w: ABLE for w in workers}, workers)[0]
        == "dask"
    )


@pytest.mark.parametrize("chunk_type", ["numpy", "cupy"])
def test_reasons_on_cpu_workers_say_so_and_name_no_gpu_threshold(chunk_type):
    """Issue 26 item 4: on workers without GPUs the reason is written for the reader, not a
    ModuleNotFoundError, and the GPU-only threshold (redist.numpy-via-gpus) is not named."""
    workers = ["a", "b"]
    for cpu in (NO_CUPY, NO_GPU):
        for nbytes in (16 * MiB, 512 * MiB):
            engine, why = choose_engine(request(nbytes, chunk_type), {w: cpu for w in workers}, workers)
            assert (engine, why) == (
                "dask",
                f"{'CuPy' if chunk_type == 'cupy' else 'NumPy'} chunks on CPU workers",
            )
    engine, why = choose_engine(request(512 * MiB, chunk_type), {"a": ABLE, "b": NO_GPU}, workers)
    assert engine == "dask" and "b has no GPU (cufftmp needs one on every worker)" in why, why


def test_without_a_client_auto_assumes_the_workers_can():
    assert choose_engine(request(chunk_type="cupy"), None, []) == (
        "cufftmp",
        "if every worker can run it; no Client to ask",
    )
    assert choose_engine(request(16 * MiB), None, [])[0] == "dask"  # declined without asking anyone


def test_a_world_that_broke_or_changed_is_passed_over_until_bootstrap():
    workers = ["a", "b"]
    able = {w: ABLE for w in workers}
    broken = {"cufftmp": WorldRecord(("a", "b"), broken="run 1 failed on a")}
    engine, why = choose_engine(request(chunk_type="cupy"), able, workers, broken)
    assert (
        engine == "dask"
        and why == "NVSHMEM needs a new bootstrap (run 1 failed on a); see dask_redist.bootstrap"
    )
    engine, why = choose_engine(request(chunk_type="cupy"), able, ["a"], {"cufftmp": WorldRecord(("a", "b"))})
    assert engine == "dask" and "worker set changed since NVSHMEM was bootstrapped" in why


def test_the_scheduler_asks_workers_only_when_the_answer_matters():
    selector = EngineSelector()
    small, big = Request.of(spec(16 * MiB)), Request.of(spec(512 * MiB))
    assert selector.needs_probe(small, ["a", "b"]) == []  # declined whatever they answer
    assert selector.needs_probe(big, ["a", "b"]) == ["a", "b"]
    assert selector.needs_probe(Request.of(spec(16 * MiB), "cupy"), ["a", "b"]) == ["a", "b"]
    assert selector.needs_probe(Request.of(spec(512 * MiB, engine="dask")), ["a"]) == []
    selector.learn({"a": ABLE, "b": "an error"})  # b did not answer: asked again next time
    assert selector.needs_probe(big, ["a", "b"]) == ["b"]
    selector.learn({"b": ABLE})
    assert selector.choose(big, ["a", "b"])[0] == "cufftmp"
    assert selector.choose(small, ["a", "b"])[0] == "dask"
    assert selector.choose(Request.of(spec(512 * MiB, numpy_via_gpus=None)), ["a", "b"])[0] == "dask"
    selector.run_started("cufftmp", Settings(), ["a", "b"])
    engine, why = selector.choose(big, ["a"])  # not the world NVSHMEM was bootstrapped over
    assert engine == "dask" and "worker set changed" in why


def test_only_the_engine_that_could_not_start_is_passed_over():
    """A run whose engine could not start marks that engine, not another's world; a failed run of
    an engine without a world marks nothing (it was: any engine's failure broke NVSHMEM's world)."""
    selector = EngineSelector()
    selector.learn({"a": ABLE})
    selector.run_failed("dask", Settings(), "error", "run 1 failed on a")
    assert selector.records.get("dask", WorldRecord()).broken is None
    selector.run_failed("dask", Settings(), "unavailable", "dask cannot start")
    assert selector.records["dask"].broken == "dask cannot start" and "cufftmp" not in selector.records
    assert selector.choose(Request("cupy", Settings()), ["a"])[0] == "cufftmp"
    selector.forget()
    assert selector.records["dask"].broken is None


def test_a_run_refused_alike_on_every_rank_leaves_the_world_usable():
    """A cufftmp run refused on every rank before anything moved (an FFT cuFFTMp could not set
    up: `dask_redist.engines.cufftmp.fft.agree`) leaves the world chosen; any other failure of a
    run of an engine with a world marks it (auto passes it over until a new bootstrap)."""
    selector = EngineSelector()
    selector.learn({"a": ABLE, "b": ABLE})
    selector.run_started("cufftmp", Settings(), ["a", "b"])
    selector.run_failed("cufftmp", Settings(), "refused", "fft (c2r) run 1 failed on a")
    assert selector.records["cufftmp"].broken is None
    assert selector.choose(Request("cupy", Settings()), ["a", "b"])[0] == "cufftmp"
    selector.run_failed("cufftmp", Settings(), "error", "fft (c2r) run 2 failed on a")
    engine, why = selector.choose(Request("cupy", Settings()), ["a", "b"])
    assert engine != "cufftmp" and "run 2 failed on a" in why


def test_stranded_workers_refuse_a_forced_cufftmp_run_but_a_restart_finishes_on_dask():
    """After a PE died: a new rechunk forced onto cufftmp over its stranded survivors is refused with
    the remedy; a rechunk under way when the worker died (restarted, or submitted before and not
    yet at its barrier) finishes on the dask engine instead."""
    selector = EngineSelector()
    workers = ["tcp://a:1", "tcp://b:1"]
    selector.learn({w: ABLE for w in workers + ["tcp://c:1"]})
    selector.record("cufftmp").members = ("tcp://a:1", "tcp://c:1")
    selector.worker_left("tcp://c:1", under_way={"t-old"})  # a's peer died: a is stranded
    forced = Request("cupy", Settings(engine="cufftmp"), 64 * MiB, np.dtype("float64"))
    assert selector.choose(forced, workers, token="t-new") == ("cufftmp", "set by redist.engine")
    refused = selector.refusal("cufftmp", forced, workers)
    assert "['tcp://a:1']" in refused and "restart_broken=True" in refused
    for recovery in (
        {"restarting": True, "token": "t-new"},
        {"token": "t-old"},
    ):  # restarted; submitted before
        engine, why = selector.choose(forced, workers, **recovery)
        assert engine == "dask" and "lost a worker while this rechunk was under way" in why, recovery
        assert "tcp://a:1" in why
    assert selector.refusal("dask", forced, workers) is None
    # workers outside the dead world are not stranded
    assert selector.refusal("cufftmp", forced, ["tcp://b:1", "tcp://d:1"]) is None


def _on(host: str, **facts) -> dict:
    """A GPU worker's answers on ``host`` (as the registry adds it), no InfiniBand, no remote transport set."""
    return {
        "cufftmp": {**ABLE["cufftmp"], "network devices": [], "remote transport": None, "host": host, **facts}
    }


PSEUDO = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3", "tcp://127.0.0.1:4"]


def test_auto_never_takes_cufftmp_across_hosts_without_a_remote_transport():
    """Issue 44: workers on 2 hosts (pseudo-hosts of one machine: 127.0.0.1 each) with no InfiniBand
    and NVSHMEM_REMOTE_TRANSPORT unset: NVSHMEM's world could not form, so auto takes dask and says
    why and what to do; with a remote transport on every worker, or on one host, cufftmp."""
    cupy_request = request(chunk_type="cupy")
    two_hosts = {w: _on("hostA" if i < 2 else "hostB") for i, w in enumerate(PSEUDO)}
    engine, why = choose_engine(cupy_request, two_hosts, PSEUDO)
    assert engine == "dask", why
    assert why.startswith("workers on 2 hosts (hostA, hostB), but tcp://127.0.0.1:1 (and 3 more workers)")
    assert "NVSHMEM_REMOTE_TRANSPORT unset" in why and "keep cufftmp to one node" in why
    assert choose_engine(request(512 * MiB), two_hosts, PSEUDO)[0] == "dask"  # (NumPy through the GPUs too)
    one_host = {w: _on("hostA") for w in PSEUDO}
    assert choose_engine(cupy_request, one_host, PSEUDO)[0] == "cufftmp"
    ucx = {w: _on("hostA" if i < 2 else "hostB", **{"remote transport": "ucx"}) for i, w in enumerate(PSEUDO)}
    assert choose_engine(cupy_request, ucx, PSEUDO)[0] == "cufftmp"
    ib = {w: _on(f"node{i}", **{"network devices": ["mlx5_0"]}) for i, w in enumerate(PSEUDO)}
    assert choose_engine(cupy_request, ib, PSEUDO)[0] == "cufftmp"


def test_a_named_cufftmp_across_hosts_without_a_remote_transport_is_refused_up_front():
    selector = EngineSelector()
    forced = Request("cupy", Settings(engine="cufftmp"), 64 * MiB, np.dtype("float64"))
    assert selector.needs_probe(forced, PSEUDO) == PSEUDO  # (named: asked whether it can run over them)
    selector.learn({w: _on("hostA" if i < 2 else "hostB") for i, w in enumerate(PSEUDO)})
    assert selector.needs_probe(forced, PSEUDO) == []
    assert selector.choose(forced, PSEUDO) == ("cufftmp", "set by redist.engine")
    refused = selector.refusal("cufftmp", forced, PSEUDO)
    assert refused.startswith(
        "redist.engine is cufftmp, but cufftmp cannot run over these workers: workers on 2"
    )
    assert "set NVSHMEM_REMOTE_TRANSPORT (ucx, libfabric)" in refused and "redist.engine: auto" in refused
    assert selector.refusal("dask", Request("cupy", Settings(engine="dask")), PSEUDO) is None
    assert selector.refusal("cufftmp", forced, PSEUDO[:2]) is None  # one host of them
    assert selector.choose(Request("cupy", Settings()), PSEUDO)[0] == "dask"  # auto
