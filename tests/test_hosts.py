"""Hosts as every part of dask-redist sees them (issue 44): a worker's ``redist.host`` (its own
config, ``DASK_REDIST__HOST`` where it is started), else its address's host
(`dask_redist.config.host`). Pseudo-hosts, workers of one machine given two names, take the
branches of several hosts: here on CPU worker processes (doctor, status, explain, the dask
engine's values), and in the pure functions of the NVSHMEM world with fake members; on one GPU
with tools/gpu/pseudo-hosts.sh."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from conftest import pseudo_hosts_cluster
from test_peers import Group

import dask_redist
from dask_redist.bench.gpu_cluster import pseudo_host
from dask_redist.config import host
from dask_redist.engines.cufftmp import hostfiles
from dask_redist.engines.cufftmp.world import Member, across_hosts, shares_gpu


def test_the_host_is_the_processes_own_setting_else_the_addresss():
    with dask.config.set({"redist.host": None}):
        assert host("tcp://10.1.2.3:4001") == "10.1.2.3"
        assert host("tcp://[::1]:4001") == "::1"
        assert host(None)  # (outside a worker: the machine's name)
    with dask.config.set({"redist.host": " hostA "}):
        assert host("tcp://10.1.2.3:4001") == "hostA"
    with dask.config.set({"redist.host": ""}):  # (empty: not set)
        assert host("tcp://10.1.2.3:4001") == "10.1.2.3"


def test_the_environment_variable_counts_where_the_config_says_null(monkeypatch):
    """A nanny hands its worker the nanny's config (``redist.host: null`` where the nanny's process
    imported dask_redist) over the worker's ``env``: the variable is read then."""
    monkeypatch.setenv("DASK_REDIST__HOST", "hostB")
    with dask.config.set({"redist.host": None}):
        assert host("tcp://10.1.2.3:4001") == "hostB"
    with dask.config.set({"redist.host": "hostA"}):
        assert host("tcp://10.1.2.3:4001") == "hostA"


def test_pseudo_hosts_split_the_workers_in_order():
    assert [pseudo_host(i, 4, 2) for i in range(4)] == ["hostA", "hostA", "hostB", "hostB"]
    assert [pseudo_host(i, 6, 3) for i in range(6)] == ["hostA", "hostA", "hostB", "hostB", "hostC", "hostC"]
    assert pseudo_host(0, 4, 1) is None  # one host: each worker's own
    with pytest.raises(ValueError, match="hosts"):
        pseudo_host(0, 2, 3)


GPU = ("boot-1", "0000:19:00.0")
NO_TRANSPORT = {"network devices": [], "remote transport": None}


def test_pes_of_two_pseudo_hosts_on_one_gpu_do_not_copy_chunk_to_chunk():
    """The peers' path through CUDA IPC is for one host: PEs of two pseudo-hosts on the same GPU
    take the symmetric heap's rounds, as PEs of two hosts would."""
    assert shares_gpu([Member("hostA", GPU, NO_TRANSPORT)] * 2)
    assert not shares_gpu([Member("hostA", GPU, NO_TRANSPORT), Member("hostB", GPU, NO_TRANSPORT)])
    assert not shares_gpu(
        [Member("hostA", GPU, NO_TRANSPORT), Member("hostA", ("boot-1", "other"), NO_TRANSPORT)]
    )


def test_every_rank_refuses_a_world_across_hosts_without_a_remote_transport():
    """What every rank decides alike from the members' all-gather, before NVSHMEM starts."""
    workers = ["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"]
    two = [Member("hostA", GPU, NO_TRANSPORT), Member("hostB", GPU, NO_TRANSPORT)]
    why = across_hosts(workers, two)
    assert why.startswith("workers on 2 hosts (hostA, hostB)") and "NVSHMEM_REMOTE_TRANSPORT" in why
    ucx = {"network devices": [], "remote transport": "ucx"}
    assert across_hosts(workers, [Member("hostA", GPU, ucx), Member("hostB", GPU, ucx)]) is None
    assert across_hosts(workers, [Member("hostA", GPU, NO_TRANSPORT)] * 2) is None


def test_ranks_of_several_hosts_share_no_files(tmp_path):
    """hostfiles: same host only, without a step of the world's group (alike on every rank)."""
    group = Group(2)
    for rank in range(2):
        assert hostfiles.agree(group.for_rank(rank), 30, hosts=["hostA", "hostB"]) is None
    assert group.calls == [0, 0]


# -- 2 pseudo-hosts x 2 CPU worker processes ----------------------------------------------------

HOSTS = ("hostA", "hostA", "hostB", "hostB")


@pytest.fixture(scope="module")
def pseudo_client():
    from distributed import Client

    with pseudo_hosts_cluster(HOSTS) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(HOSTS))
        yield client


def _hosts_by_worker(client) -> dict[str, str]:
    return client.run(lambda dask_worker: host(dask_worker.address))


def test_each_worker_reads_its_own_redist_host_not_the_clients(pseudo_client):
    with dask.config.set({"redist.host": "the-client"}):
        by_worker = _hosts_by_worker(pseudo_client)
    assert sorted(by_worker.values()) == sorted(HOSTS)


def test_doctor_and_status_show_the_pseudo_hosts(pseudo_client):
    from dask_redist.doctor import doctor

    by_worker = _hosts_by_worker(pseudo_client)
    d = doctor(pseudo_client)
    assert [h for h, _ in d.hosts] == ["hostA", "hostB"] and all(len(ws) == 2 for _, ws in d.hosts)
    assert "hosts: 2 (hostA: 2 workers, hostB: 2 workers)" in str(d)
    assert {r["worker"]: r["host"] for r in d.rows()} == by_worker
    assert d.engine == "dask"  # CPU workers
    status = dask_redist.status(pseudo_client)
    assert {w: s["host"] for w, s in status["workers"].items()} == by_worker
    assert "hostB" in str(status)


def test_the_dask_engine_gives_numpys_values_across_pseudo_hosts(pseudo_client):
    import dask.array as da

    x = da.random.default_rng(44).random((400, 300), chunks=(25, 300))
    expected = x.compute()
    with dask_redist.enable(engine="auto"):
        y = x.rechunk((400, 20))
        explained = dask_redist.explain(y)
        got = y.compute()
    np.testing.assert_array_equal(got, expected)
    assert explained[0].engine == "dask"
    assert explained[0].engine_reason.endswith("; workers on 2 hosts (hostA, hostB)"), explained[
        0
    ].engine_reason
    last = dask_redist.status(pseudo_client)["history"][-1]
    assert last["engine"] == "dask" and last["outcome"] == "done", last


def test_the_hybrid_engine_refuses_numpy_chunks_across_pseudo_hosts_and_auto_never_takes_it(pseudo_client):
    """Named, the hybrid engine refuses NumPy chunks before anything runs, saying why; under auto
    the workers of 2 pseudo-hosts run them on the dask engine."""
    import dask.array as da

    x = da.random.default_rng(45).random((64, 48), chunks=(8, 48))
    with dask_redist.enable(engine="hybrid"):
        with pytest.raises(
            dask_redist.RedistError, match="NumPy chunks: the hybrid engine copies CuPy chunks only"
        ):
            x.rechunk((64, 6)).compute()
    with dask_redist.enable(engine="auto"):
        np.testing.assert_array_equal(x.rechunk((64, 6)).compute(), x.compute())
    last = dask_redist.status(pseudo_client)["history"][-1]
    assert last["engine"] == "dask" and last["outcome"] == "done", last


def test_every_engines_answer_carries_the_workers_host():
    """The registry adds it (one function for every engine, the folder engine of tests/engines.py too)."""
    from dask_redist.engines.registry import capabilities

    engines = {"dask": "dask_redist.engines.dask:DaskEngine", "folder": "engines:FolderEngine"}
    with dask.config.set({"redist.host": None}):
        answers = capabilities(engines, "tcp://10.0.0.5:4001")
    assert {a["host"] for a in answers.values()} == {"10.0.0.5"}, answers
    with dask.config.set({"redist.host": "hostB"}):
        assert capabilities(engines, "tcp://10.0.0.5:4001")["folder"]["host"] == "hostB"


# -- World.join on threads, with CuPy and nvmath faked: what each rank decides from the others ----


class _Exchange:
    """The scheduler's all-gather among threads: ``factory(rank, n)(tag, payload)``."""

    def __init__(self, nranks: int):
        import threading

        self._barrier, self._slots = threading.Barrier(nranks, timeout=30), {}

    def factory(self, rank: int, nranks: int):
        def exchange(tag: str, payload: bytes) -> list:
            self._slots.setdefault(tag, {})[rank] = payload
            self._barrier.wait()
            values = [self._slots[tag][r] for r in range(nranks)]
            self._barrier.wait()
            return values

        return exchange


@pytest.fixture
def faked_gpu(monkeypatch):
    """CuPy and nvmath.distributed as World.join uses them; the calls to NVSHMEM's start, counted."""
    import sys
    import types

    from dask_redist.engines.cufftmp import remote, world

    started = []
    cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        Device=lambda i: types.SimpleNamespace(pci_bus_id="0000:19:00.0"),
    )
    distributed = types.ModuleType("nvmath.distributed")
    distributed.initialize = lambda device, group, backends: started.append(group.rank)
    nvmath = types.ModuleType("nvmath")
    nvmath.distributed = distributed
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setitem(sys.modules, "nvmath", nvmath)
    monkeypatch.setitem(sys.modules, "nvmath.distributed", distributed)
    monkeypatch.setattr(world.World, "_rejoin_problem", lambda self: None)
    monkeypatch.setattr(world.World, "_heap_problem", staticmethod(lambda: None))
    monkeypatch.setattr(remote, "ib_devices", lambda path=remote.IB_DEVICES: [])
    monkeypatch.setenv("NVSHMEM_SYMMETRIC_SIZE", "1G")
    monkeypatch.setenv(remote.VARIABLE, "")
    monkeypatch.delenv(remote.VARIABLE)
    monkeypatch.setattr(remote, "_ours", [False])
    return started


def _join(monkeypatch, hosts: list[str]) -> list:
    """Every rank's World after joining a world over workers on ``hosts`` (or what it raised)."""
    import types

    from dask_redist.config import Settings
    from dask_redist.engines.cufftmp import world
    from test_hostfiles import on_threads

    workers = tuple(f"tcp://127.0.0.1:{4001 + i}" for i in range(len(hosts)))
    monkeypatch.setattr(world, "host", dict(zip(workers, hosts)).get)  # (each rank's own redist.host)
    exchange = _Exchange(len(hosts))

    def body(rank):
        spec = types.SimpleNamespace(
            workers=workers,
            token="t",
            engine="cufftmp",
            collective=types.SimpleNamespace(settings=Settings(bootstrap_timeout=30)),
        )
        run = types.SimpleNamespace(spec=spec, rank=rank, run_id=1, name=lambda: "rechunk t run 1")
        w = world.World()
        w.join(run, exchange.factory, release=lambda: None)
        return w

    return on_threads(len(hosts), body)


def test_a_world_across_pseudo_hosts_without_a_transport_is_refused_by_every_rank(faked_gpu, monkeypatch):
    from dask_redist.errors import EngineUnavailableError

    results = _join(monkeypatch, ["hostA", "hostA", "hostB", "hostB"])
    assert all(isinstance(r, EngineUnavailableError) for r in results), results
    assert "workers on 2 hosts (hostA, hostB)" in str(results[0]) and "keep cufftmp to one node" in str(
        results[0]
    )
    assert faked_gpu == []  # NVSHMEM never started: no rank is left inside its bootstrap


def test_a_world_across_pseudo_hosts_with_ucx_takes_the_branches_of_several_hosts(faked_gpu, monkeypatch):
    import os

    from dask_redist.engines.cufftmp import remote

    monkeypatch.setenv(remote.VARIABLE, "ucx")
    worlds = _join(monkeypatch, ["hostA", "hostA", "hostB", "hostB"])
    assert sorted(faked_gpu) == [0, 1, 2, 3], worlds
    assert os.environ[remote.VARIABLE] == "ucx"  # (the operator's, kept)
    for w in worlds:  # one GPU, two hosts: no chunk-to-chunk path, no files, the scheduler's group
        assert not w.shared_gpu and w._files is None and w.peers_group is w.group


def test_a_world_on_one_host_shares_its_gpu_and_files(faked_gpu, monkeypatch):
    import os

    from dask_redist.engines.cufftmp import remote

    worlds = _join(monkeypatch, ["hostA", "hostA"])
    assert sorted(faked_gpu) == [0, 1] and os.environ[remote.VARIABLE] == "none"
    try:
        assert all(w.shared_gpu and w._files is not None and w.peers_group is not w.group for w in worlds)
    finally:
        for w in worlds:
            w._files.close()


def test_doctors_cufftmp_lines_for_gpu_workers_on_two_pseudo_hosts():
    """What doctor prints of cufftmp for 2 x 2 GPU workers (fake reports, as the workers give them)."""
    from dask_redist.engines import description

    def report(h: str) -> dict:
        able = {
            "ok": True,
            "gpus": 1,
            "gpu": "H200",
            "host": h,
            "network devices": [],
            "remote transport": None,
        }
        return {"host": h, "network devices": [], "NVSHMEM environment": {}, "capabilities": able}

    reports = {w: report(h) for w, h in zip(PSEUDO_WORKERS, HOSTS)}
    d = description("cufftmp")
    line = d.doctor_line(reports)
    assert "NVSHMEM remote transport ibrc (NVSHMEM's default; workers on 2 hosts)" in line, line
    warnings, _ = d.doctor_notes(reports)
    assert len([w for w in warnings if "no remote transport NVSHMEM can use" in w]) == 4, warnings
    assert any("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME" in w for w in warnings), warnings


PSEUDO_WORKERS = [f"tcp://127.0.0.1:{4001 + i}" for i in range(4)]
