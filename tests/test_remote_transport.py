"""NVSHMEM's remote transport off for a world on one host without InfiniBand, so that no
"ibrc.cpp ... no IB devices found" line reaches every GPU worker's log (issue 26, item 10).
The GPU check: tests/test_gpu_world.py::test_no_infiniband_error_line_on_one_host."""

from __future__ import annotations

import os

import pytest

from dask_redist.engines.cufftmp import remote

ONE_HOST = ("10.0.0.1", "10.0.0.1")  # (each world member's host: dask_redist.config.host)
TWO_HOSTS = ("hostA", "hostB")  # (pseudo-hosts are hosts too)


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.setenv(remote.VARIABLE, "")  # (recorded: whatever the test sets is undone after it)
    monkeypatch.delenv(remote.VARIABLE)
    monkeypatch.setattr(remote, "_ours", [False])


def test_one_host_without_infiniband_needs_no_remote_transport(clean):
    assert remote.set_for_world(ONE_HOST, devices=[]) == "none"
    assert os.environ[remote.VARIABLE] == "none" and remote.set_here()


def test_a_later_world_over_several_hosts_gets_nvshmems_default_back(clean):
    remote.set_for_world(ONE_HOST, devices=[])
    assert remote.set_for_world(TWO_HOSTS, devices=[]) == "ibrc"
    assert remote.VARIABLE not in os.environ and not remote.set_here()


def test_a_host_with_infiniband_keeps_the_default(clean):
    assert remote.set_for_world(ONE_HOST, devices=["mlx5_0"]) == "ibrc"
    assert remote.VARIABLE not in os.environ


def test_the_environment_wins(clean, monkeypatch):
    monkeypatch.setenv(remote.VARIABLE, "ucx")
    assert remote.set_for_world(ONE_HOST, devices=[]) == "ucx" and os.environ[remote.VARIABLE] == "ucx"
    assert not remote.set_here()


def test_the_doctor_line_names_the_remote_transport():
    """doctor's cufftmp line (GPU clusters) says which remote transport a world over the workers takes."""
    from dask_redist.engines.cufftmp.checks import remote_transport_line

    def reports(hosts):
        return {
            f"tcp://10.0.0.1:{4001 + i}": {"host": h, "network devices": [], "NVSHMEM environment": {}}
            for i, h in enumerate(hosts)
        }

    assert remote_transport_line(reports(ONE_HOST)).startswith(
        "NVSHMEM remote transport none (every worker on one host"
    )
    # one machine's addresses, two redist.host values: two hosts
    assert remote_transport_line(reports(TWO_HOSTS)).startswith(
        "NVSHMEM remote transport ibrc (NVSHMEM's default; workers on 2"
    )


@pytest.mark.parametrize(
    "devices, environment, problem",
    [
        (
            [],
            None,
            "no InfiniBand/RoCE device for NVSHMEM's remote transport and NVSHMEM_REMOTE_TRANSPORT unset",
        ),
        ([], "ibrc", "NVSHMEM_REMOTE_TRANSPORT is ibrc"),
        ([], "none", "NVSHMEM_REMOTE_TRANSPORT=none"),
        (["mlx5_0"], "none", "NVSHMEM_REMOTE_TRANSPORT=none"),
        (["mlx5_0"], None, None),
        ([], "ucx", None),
        ([], "LibFabric", None),
    ],
)
def test_which_workers_nvshmem_can_reach_from_another_host(devices, environment, problem):
    why = remote.transport_problem(devices, environment)
    assert (why is None) if problem is None else (problem in why), why


def test_a_world_across_hosts_needs_a_remote_transport_on_every_worker():
    def answers(hosts, **facts):
        base = {"network devices": [], "remote transport": None}
        return {f"tcp://127.0.0.1:{4001 + i}": {"host": h, **base, **facts} for i, h in enumerate(hosts)}

    assert remote.across_hosts_problem(answers(["a", "a"])) is None  # one host: P2P, no transport needed
    why = remote.across_hosts_problem(answers(["hostA", "hostA", "hostB", "hostB"]))
    assert why.startswith("workers on 2 hosts (hostA, hostB), but tcp://127.0.0.1:4001 (and 3 more workers)")
    assert "set NVSHMEM_REMOTE_TRANSPORT (ucx, libfabric)" in why and "keep cufftmp to one node" in why
    assert remote.across_hosts_problem(answers(["hostA", "hostB"], **{"remote transport": "ucx"})) is None
    assert remote.across_hosts_problem(answers(["hostA", "hostB"], **{"network devices": ["mlx5_0"]})) is None
    mixed = answers(["hostA", "hostB"], **{"network devices": ["mlx5_0"]})
    mixed["tcp://127.0.0.1:4002"]["remote transport"] = "none"
    assert "tcp://127.0.0.1:4002 has no remote transport" in remote.across_hosts_problem(mixed)
    assert remote.across_hosts_problem({"w": {}, "v": {"host": "b"}}) is None  # (hosts not said: not counted)


def test_the_transport_set_here_is_not_the_workers_environment(clean, monkeypatch):
    """What a worker reports of NVSHMEM_REMOTE_TRANSPORT is the operator's, not the "none" dask-redist
    set for a world on one host (that world's value says nothing of a world across hosts)."""
    remote.set_for_world(ONE_HOST, devices=[])
    assert os.environ[remote.VARIABLE] == "none" and remote.facts()["remote transport"] is None
    monkeypatch.setattr(remote, "_ours", [False])
    monkeypatch.setenv(remote.VARIABLE, "ucx")
    assert remote.facts()["remote transport"] == "ucx"


@pytest.mark.parametrize(
    "devices, environment, mapping, problem",
    [
        ([], "ucx", None, "needs a GPU-CPU mapping for NVSHMEM's atomics"),
        ([], "UCX", None, "GDRCopy (libgdrapi and the gdrdrv module) or CUDA's DMA-BUF backend"),
        ([], "ucx", "GDRCopy", None),
        ([], "ucx", "CUDA DMA-BUF", None),
        ([], "ucx", remote.UNKNOWN, None),  # (a worker that did not say: not counted)
        (["mlx5_0"], "ucx", None, None),  # (the NIC does the atomics)
        ([], "libfabric", None, None),
    ],
)
def test_ucx_over_tcp_needs_a_gpu_cpu_mapping(devices, environment, mapping, problem):
    """On one H200 with NVSHMEM_DISABLE_P2P=1, NVSHMEM's ucx transport over TCP initialized, then
    stopped at its first atomic ("UCX atomic verb 8 is unsupported without a GPU CPU mapping"):
    no GDRCopy, and a CUDA driver (13.0) older than DMA-BUF's 13.3."""
    why = remote.transport_problem(devices, environment, mapping)
    assert (why is None) if problem is None else (problem in why), why


def test_which_gpu_cpu_mapping_a_worker_has(tmp_path, monkeypatch):
    device = tmp_path / "gdrdrv"
    assert remote.gpu_cpu_mapping(str(device), driver=13000) is None
    assert remote.gpu_cpu_mapping(str(device), driver=remote.DMA_BUF_DRIVER) == "CUDA DMA-BUF"
    device.touch()
    monkeypatch.setattr(remote, "GDRCOPY_LIBRARY", "libno-such-gdrapi.so.2")
    assert remote.gpu_cpu_mapping(str(device), driver=13000) is None  # (the device without its library)
    monkeypatch.setattr(remote, "GDRCOPY_LIBRARY", "libc.so.6")  # (a library every Linux loads)
    assert remote.gpu_cpu_mapping(str(device), driver=13000) == "GDRCopy"


def test_the_doctor_warns_of_ucx_over_tcp_without_a_mapping():
    from dask_redist.engines.cufftmp.checks import cluster_warnings

    def report(host, mapping, machine=None, p2p_disabled=False):
        return {
            "host": host,
            "machine": machine or f"{host} boot-1",
            "p2p disabled": p2p_disabled,
            "network devices": [],
            "gpu cpu mapping": mapping,
            "NVSHMEM environment": {remote.VARIABLE: "ucx", "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "eth0"},
        }

    warned = cluster_warnings({"tcp://a:1": report("hostA", None), "tcp://b:1": report("hostB", "GDRCopy")})
    assert len(warned) == 1 and warned[0].startswith("tcp://a:1 (hostA): workers are on 2 hosts"), warned
    assert "needs a GPU-CPU mapping" in warned[0], warned
    assert (
        cluster_warnings({"tcp://a:1": report("hostA", "GDRCopy"), "tcp://b:1": report("hostB", "GDRCopy")})
        == []
    )
    # pseudo-hosts of one machine: P2P, no mapping needed; unless P2P is off
    one = {"tcp://a:1": report("hostA", None, "m boot-1"), "tcp://b:1": report("hostB", None, "m boot-1")}
    assert cluster_warnings(one) == []
    one["tcp://b:1"]["p2p disabled"] = True
    assert len(cluster_warnings(one)) == 2, cluster_warnings(one)


def test_auto_counts_the_mapping_only_where_p2p_cannot_serve():
    """``ucx`` without a network device or a GPU-CPU mapping: a world across machines (or with P2P
    off) would stop at NVSHMEM's first atomic, so `across_hosts_problem` refuses it; pseudo-hosts
    of one machine with P2P on form their world (measured on one H200)."""

    def answers(machines, mapping=None, p2p_disabled=False):
        base = {"network devices": [], "remote transport": "ucx", "gpu cpu mapping": mapping}
        return {
            f"tcp://127.0.0.1:{4001 + i}": {
                "host": f"h{i}",
                "machine": m,
                "p2p disabled": p2p_disabled,
                **base,
            }
            for i, m in enumerate(machines)
        }

    assert remote.across_hosts_problem(answers(["m boot", "m boot"])) is None
    why = remote.across_hosts_problem(answers(["m1 boot", "m2 boot"]))
    assert why is not None and "needs a GPU-CPU mapping" in why and "keep cufftmp to one node" in why, why
    assert remote.across_hosts_problem(answers(["m1 boot", "m2 boot"], mapping="GDRCopy")) is None
    assert "needs a GPU-CPU mapping" in remote.across_hosts_problem(
        answers(["m b", "m b"], p2p_disabled=True)
    )
    older = answers(["m1 boot", "m2 boot"])  # workers of an older dask-redist said neither: not counted
    for a in older.values():
        del a["machine"], a["p2p disabled"], a["gpu cpu mapping"]
    assert remote.across_hosts_problem(older) is None


def test_a_worker_says_its_machine_and_its_mapping_only_with_ucx(clean, monkeypatch, tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("1234-abcd\n")
    assert remote.machine(str(boot)).endswith(" 1234-abcd")
    assert remote.machine(str(tmp_path / "none")).endswith(" ?")
    monkeypatch.setattr(remote, "gpu_cpu_mapping", lambda: "GDRCopy")
    monkeypatch.delenv(remote.VARIABLE, raising=False)
    monkeypatch.setenv(remote.DISABLE_P2P, "Yes")
    facts = remote.facts()
    assert facts["p2p disabled"] is True and "gpu cpu mapping" not in facts and facts["machine"]
    monkeypatch.setenv(remote.VARIABLE, "ucx")
    monkeypatch.setenv(remote.DISABLE_P2P, "0")
    facts = remote.facts()
    assert facts["gpu cpu mapping"] == "GDRCopy" and facts["p2p disabled"] is False
