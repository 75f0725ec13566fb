"""When ``redist.engine: auto`` takes the hybrid engine (issue 44): CuPy chunks on GPU workers of
several hosts (pseudo-hosts too) where one NVSHMEM world over them cannot form. On one host nothing
changes; NumPy chunks it refuses, and ``auto`` never picks it for them; a worker that cannot run it
(no CuPy, no GPU) keeps the engine that runs wherever Dask does. Decided from the workers'
answers, as the scheduler, ``explain`` and ``doctor`` decide (`engines.choice`)."""

from __future__ import annotations

import numpy as np
import pytest

from dask_redist.config import Settings
from dask_redist.engines.choice import EngineSelector, choose_engine, needs_probe
from dask_redist.engines.description import Request

WORKERS = ("tcp://10.0.0.1:1", "tcp://10.0.0.1:2", "tcp://10.0.0.2:1", "tcp://10.0.0.2:2")
NO_TRANSPORT = {"network devices": [], "remote transport": None}
UCX = {"network devices": [], "remote transport": "ucx"}


def answers(hosts, cufftmp=True, hybrid=True, transport=NO_TRANSPORT):
    """Every worker's answers for the three built-in engines, on ``hosts`` (one per worker)."""
    out = {}
    for w, h in zip(WORKERS, hosts):
        gpu = {"ok": cufftmp, "reason": "pretended", "gpus": 1, **transport, "host": h}
        able = {"ok": hybrid, "reason": "CuPy and CUDA IPC load" if hybrid else "no GPU visible", "host": h}
        out[w] = {"dask": {"ok": True, "host": h}, "cufftmp": gpu, "hybrid": able}
    return out


def request(chunk_type="cupy", **settings):
    return Request(chunk_type, Settings(**settings), 2**30, np.dtype(np.float64))


TWO_HOSTS = ("hostA", "hostA", "hostB", "hostB")
ONE_HOST = ("hostA",) * 4


def test_two_hosts_without_a_remote_transport_take_the_hybrid_engine_and_say_why():
    engine, why = choose_engine(request(), answers(TWO_HOSTS), WORKERS)
    assert engine == "hybrid"
    assert why.startswith("workers on 2 hosts (hostA, hostB)") and "NVSHMEM_REMOTE_TRANSPORT" in why, why
    assert why.endswith("CUDA IPC within a host, Dask's comms between hosts"), why


def test_one_host_changes_nothing():
    assert choose_engine(request(), answers(ONE_HOST), WORKERS)[0] == "cufftmp"
    # (where cufftmp cannot run on one host: the dask engine, as before; hybrid says why not)
    engine, why = choose_engine(request(), answers(ONE_HOST, cufftmp=False), WORKERS)
    assert engine == "dask", why


def test_two_hosts_whose_world_can_form_keep_cufftmp():
    assert choose_engine(request(), answers(TWO_HOSTS, transport=UCX), WORKERS)[0] == "cufftmp"


def test_two_hosts_without_cufftmp_take_the_hybrid_engine():
    assert choose_engine(request(), answers(TWO_HOSTS, cufftmp=False), WORKERS)[0] == "hybrid"


def test_numpy_chunks_never_take_it_and_it_is_not_even_asked():
    engine, why = choose_engine(request("numpy"), answers(TWO_HOSTS, cufftmp=False), WORKERS)
    assert engine == "dask", why
    # no worker is probed for it on NumPy chunks (nor for cufftmp under numpy-via-gpus: false)
    assert needs_probe(request("numpy", numpy_via_gpus=None), {}, WORKERS) == []


def test_a_worker_that_cannot_run_it_keeps_the_dask_engine():
    engine, why = choose_engine(request(), answers(TWO_HOSTS, hybrid=False), WORKERS)
    assert engine == "dask" and "workers on 2 hosts" in why, why


def test_named_it_refuses_numpy_chunks_clearly():
    selector = EngineSelector()
    selector.learn(answers(TWO_HOSTS))
    why = selector.refusal("hybrid", request("numpy", engine="hybrid"), WORKERS)
    assert why.startswith("NumPy chunks: the hybrid engine copies CuPy chunks only"), why


@pytest.mark.parametrize("hosts", [TWO_HOSTS, ONE_HOST])
def test_named_it_runs_over_any_hosts_with_cupy_chunks(hosts):
    selector = EngineSelector()
    selector.learn(answers(hosts))
    assert selector.refusal("hybrid", request(engine="hybrid"), WORKERS) is None
    assert selector.choose(request(engine="hybrid"), WORKERS) == ("hybrid", "set by redist.engine")
