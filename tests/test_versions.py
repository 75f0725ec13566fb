"""The GPU stack's versions: which NVSHMEM cuFFTMp 12.1.3 takes, and what doctor warns about."""

import re
from pathlib import Path

import pytest

from dask_redist.engines.cufftmp.checks import version_warnings
from dask_redist.engines.cufftmp.nvshmem import NVSHMEM_EXCLUDED, NVSHMEM_SUPPORTED, nvshmem_problem

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "version, ibgda, problem",
    [
        ((3, 3, 24), False, None),
        ((3, 4, 5), False, None),
        ((3, 8, 0), False, None),
        ((3, 5, 21), False, None),
        ((3, 3, 20), False, "outside"),
        ((2, 11, 0), False, "outside"),
        ((4, 0, 0), False, "outside"),
        ((3, 5, 19), False, "ABI"),
        ((3, 8, 0), True, "IBGDA"),
        ((3, 4, 5), True, None),
    ],
)
def test_nvshmem_problem(version, ibgda, problem):
    found = nvshmem_problem(version, ibgda)
    assert (found is None) == (problem is None), found
    if problem:
        assert problem in found and ".".join(map(str, version)) in found


def test_the_pin_in_pyproject_matches_the_engine():
    """pyproject's [gpu] NVSHMEM range and the engine's own check say the same thing."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    (pin,) = [d for d in gpu if d.startswith("nvidia-nvshmem-cu13")]
    low, high = NVSHMEM_SUPPORTED
    assert f">={'.'.join(map(str, low))}" in pin and f"<{high[0]}" in pin
    for excluded in NVSHMEM_EXCLUDED:
        assert f"!={'.'.join(map(str, excluded))}" in pin


def _report(version, wheel=None, ibgda=""):
    lib = {"version": version, "path": "/x/libnvshmem_host.so.3", "nvidia-nvshmem-cu13": wheel}
    return {"NVSHMEM library": lib, "NVSHMEM_IB_ENABLE_IBGDA": ibgda}


def test_version_warnings():
    same = {"w1": _report((3, 8, 0), "3.8.0"), "w2": _report((3, 8, 0), "3.8.0")}
    assert version_warnings(same) == []
    assert version_warnings({"w1": {"NVSHMEM library": {"error": "ImportError"}}}) == []

    mixed = {"w1": _report((3, 8, 0), "3.8.0"), "w2": _report((3, 4, 5), "3.4.5")}
    (warning,) = version_warnings(mixed)
    assert "different NVSHMEM versions" in warning and "3.4.5" in warning and "3.8.0" in warning

    shadowed = version_warnings({"w1": _report((3, 4, 5), "3.8.0")})
    assert len(shadowed) == 1 and re.search(
        r"loaded NVSHMEM 3\.4\.5 .* pip installed nvidia-nvshmem-cu13 3\.8\.0", shadowed[0]
    )

    old = version_warnings({"w1": _report((3, 2, 5)), "w2": _report((3, 2, 5))})
    assert len(old) == 2 and all("outside" in w for w in old)

    ibgda = version_warnings({"w1": _report((3, 8, 0), "3.8.0", ibgda="1")})
    assert len(ibgda) == 1 and "IBGDA" in ibgda[0]


def test_cluster_warnings():
    from dask_redist.engines.cufftmp.checks import cluster_warnings

    one_host = {
        f"w{i}": {
            "host": "a",
            "nvmath": "1.0.0",
            "cuFFTMp": "12.1.3.2",
            "cupy": "14.2.0",
            "NVSHMEM_SYMMETRIC_SIZE": "4G",
            "network devices": [],
            "NVSHMEM environment": {},
        }
        for i in range(2)
    }
    assert cluster_warnings(one_host) == []  # one node: NVLink, no remote transport needed

    mixed = {**one_host, "w1": {**one_host["w1"], "nvmath": "0.9.0", "NVSHMEM_SYMMETRIC_SIZE": "8G"}}
    found = cluster_warnings(mixed)
    assert any("nvmath-python: 0.9.0, 1.0.0" in w for w in found) and any(
        "symmetric heap" in w for w in found
    )

    two_hosts = {**one_host, "w1": {**one_host["w1"], "host": "b", "network devices": ["mlx5_0"]}}
    found = cluster_warnings(two_hosts)
    assert any(
        w.startswith(
            "w0 (a): workers are on 2 hosts (a, b) but this one has no remote transport NVSHMEM can use"
        )
        and "no InfiniBand/RoCE device" in w
        and "set NVSHMEM_REMOTE_TRANSPORT (ucx, libfabric)" in w
        and "keep cufftmp to one node" in w
        for w in found
    ), found
    assert not any(w.startswith("w1") for w in found)  # it has a device
    assert any("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME" in w for w in found)

    ucx = {
        w: {
            **r,
            "NVSHMEM environment": {
                "NVSHMEM_REMOTE_TRANSPORT": "ucx",
                "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "ib0",
            },
        }
        for w, r in two_hosts.items()
    }
    assert cluster_warnings(ucx) == []
