"""NVSHMEM's remote transport off for a world on one host without InfiniBand, so that no
"ibrc.cpp ... no IB devices found" line reaches every GPU worker's log (issue 26, item 10).
The GPU check: tests/test_gpu_world.py::test_no_infiniband_error_line_on_one_host."""

from __future__ import annotations

import os

import pytest

from dask_redist.engines.cufftmp import remote

ONE_HOST = ("tcp://10.0.0.1:4001", "tcp://10.0.0.1:4002")
TWO_HOSTS = ("tcp://10.0.0.1:4001", "tcp://10.0.0.2:4001")


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

    reports = {w: {"network devices": [], "NVSHMEM environment": {}} for w in ONE_HOST}
    assert remote_transport_line(reports).startswith(
        "NVSHMEM remote transport none (every worker on one host"
    )
    reports = {w: {"network devices": [], "NVSHMEM environment": {}} for w in TWO_HOSTS}
    assert remote_transport_line(reports).startswith(
        "NVSHMEM remote transport ibrc (NVSHMEM's default; workers on 2"
    )
