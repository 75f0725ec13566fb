"""What ``dask-redist doctor`` checks for the cufftmp engine: each worker's GPU, CuPy, nvmath,
cuFFTMp and NVSHMEM (`worker_report`, run on the worker), what the workers of one world must
agree on (`cluster_warnings`), the NVSHMEM each loaded (`version_warnings`), and peer access."""

from __future__ import annotations

import os

from dask_redist.engines.cufftmp import remote
from dask_redist.engines.cufftmp.nvshmem import nvshmem_problem

FIXES = {
    "cupy": "install dask-redist with its [gpu] extra on every worker (CuPy for CUDA 13): pip install -e '.[gpu]' "
    "in the clone, or the wheel (docs/deployment.md#install)",
    "nvmath": "install dask-redist with its [gpu] extra on every worker (nvmath-python, nvidia-cufftmp-cu13, "
    "nvidia-nvshmem-cu13): pip install -e '.[gpu]' in the clone, or the wheel (docs/deployment.md#install)",
    "gpu": "start GPU workers: LocalCUDACluster() or `dask cuda worker <scheduler>`",
}


def worker_report() -> dict:
    """What one worker has (run on the worker: imports CuPy and nvmath there)."""
    from dask_redist.engines.cufftmp.nvshmem import nvshmem_library

    report = {"pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    report["network devices"] = remote.ib_devices()  # (its host: doctor adds it, `dask_redist.config.host`)
    report["gpu cpu mapping"] = remote.gpu_cpu_mapping()
    report["machine"], report["p2p disabled"] = remote.machine(), remote.p2p_disabled()
    report["NVSHMEM environment"] = {k: v for k, v in os.environ.items() if k in _NVSHMEM_KEYS}
    if remote.set_here():  # (not the environment's: dask-redist's, for the world of the moment)
        report["NVSHMEM environment"].pop(remote.VARIABLE, None)
    report["NVSHMEM_SYMMETRIC_SIZE"] = os.environ.get(
        "NVSHMEM_SYMMETRIC_SIZE", "unset (NVSHMEM default 1 GiB)"
    )
    try:
        import cupy

        report["cupy"] = cupy.__version__
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        report["gpu uuid"] = (
            bytes(props.get("uuid", b"")).hex() if isinstance(props.get("uuid"), bytes) else ""
        )
        free, total = cupy.cuda.runtime.memGetInfo()
        report["gpu memory free"] = f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB"
    except Exception as e:
        report["cupy"] = f"missing ({type(e).__name__})"
    for name, module in (
        ("nvmath", "nvmath"),
        ("cuFFTMp", "nvmath.bindings.cufftMp"),
        ("NVSHMEM", "nvmath.bindings.nvshmem"),
    ):
        try:
            m = __import__(module, fromlist=["_"])
            report[name] = getattr(m, "__version__", "loads")
        except Exception as e:
            report[name] = f"missing ({type(e).__name__}: {str(e)[:80]})"
    try:
        from nvmath.bindings import nvshmem

        report["NVSHMEM state"] = (
            "initialized" if nvshmem.init_status() >= nvshmem.STATUS_IS_INITIALIZED else "not started"
        )
        report["NVSHMEM library"] = nvshmem_library()
        report["NVSHMEM"] = ".".join(map(str, report["NVSHMEM library"]["version"]))
        report["cuFFTMp"] = report["NVSHMEM library"]["nvidia-cufftmp-cu13"] or report["cuFFTMp"]
    except Exception as e:  # no nvmath, or a libnvshmem_host without the version call
        report.setdefault("NVSHMEM library", {"error": f"{type(e).__name__}: {str(e)[:80]}"})
    report["NVSHMEM_IB_ENABLE_IBGDA"] = os.environ.get("NVSHMEM_IB_ENABLE_IBGDA", "")
    return report


_NVSHMEM_KEYS = (
    "NVSHMEM_REMOTE_TRANSPORT",
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME",
    "NVSHMEM_IB_ENABLE_IBGDA",
    "NVSHMEM_HCA_LIST",
)


def cluster_warnings(reports: dict[str, dict]) -> list[str]:
    """What several workers, or several nodes, need to agree on (from `worker_report`).

    Every worker of a world runs the same nvmath, cuFFTMp and CuPy and the same symmetric
    heap size (NVSHMEM allocates symmetric memory identically on every PE). Workers on more
    than one host reach each other through NVSHMEM's remote transport: each host needs a
    network device it can use (``/sys/class/infiniband``), or ``NVSHMEM_REMOTE_TRANSPORT``
    naming one that does not need it (``ucx``, ``libfabric``): `remote.transport_problem`;
    ``ucx`` without a device needs a GPU-CPU mapping where the workers span machines or P2P is
    off (`remote.mapping_needed`). A worker's host is its ``redist.host`` (``report["host"]``,
    pseudo-hosts included).
    """
    out = []
    for key, what in (
        ("nvmath", "nvmath-python"),
        ("cuFFTMp", "cuFFTMp"),
        ("cupy", "CuPy"),
        ("NVSHMEM_SYMMETRIC_SIZE", "symmetric heap size (NVSHMEM_SYMMETRIC_SIZE)"),
    ):
        seen = {str(r.get(key)) for r in reports.values() if r.get(key) is not None}
        if len(seen) > 1:
            out.append(f"workers differ in {what}: {', '.join(sorted(seen))}; make them the same everywhere")
    hosts = {r.get("host") for r in reports.values() if r.get("host")}
    if len(hosts) > 1:
        needed = remote.mapping_needed(reports.values())
        for address, r in sorted(reports.items()):
            env = (r.get("NVSHMEM environment") or {}).get(remote.VARIABLE)
            mapping = remote.counted_mapping(r, needed)
            if why := remote.transport_problem(r.get("network devices"), env, mapping):
                out.append(
                    f"{address} ({r.get('host')}): workers are on {len(hosts)} hosts ({', '.join(sorted(hosts))}) "
                    f"but this one has no remote transport NVSHMEM can use ({why}): {remote.REMEDY}"
                )
        ifnames = {
            str((r.get("NVSHMEM environment") or {}).get("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME"))
            for r in reports.values()
        }
        if ifnames == {"None"}:
            out.append(
                f"workers are on {len(hosts)} hosts: if they have several network interfaces, set "
                "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME on every worker to one the hosts reach each other on"
            )
    return out


def version_warnings(reports: dict[str, dict]) -> list[str]:
    """What is wrong with the NVSHMEM each worker loaded (from `worker_report`), worst first.

    A version cuFFTMp 12.1.3 does not support; workers of one cluster loading different
    versions (NVSHMEM's PEs must run the same library); a library that is not the one
    pip installed (another ``libnvshmem_host.so`` found first, e.g. through LD_LIBRARY_PATH).
    """
    out, versions = [], {}
    for address, r in sorted(reports.items()):
        lib = r.get("NVSHMEM library") or {}
        version = lib.get("version")
        if version is None:
            continue
        versions[address] = tuple(version)
        ibgda = str(r.get("NVSHMEM_IB_ENABLE_IBGDA", "")).strip().lower() in ("1", "true", "y", "yes", "on")
        if problem := nvshmem_problem(tuple(version), ibgda):
            out.append(f"{address}: {problem}")
        wheel = lib.get("nvidia-nvshmem-cu13")
        if wheel and tuple(int(p) for p in wheel.split(".")[:3]) != tuple(version):
            out.append(
                f"{address}: loaded NVSHMEM {'.'.join(map(str, version))} from {lib.get('path')}, but pip installed "
                f"nvidia-nvshmem-cu13 {wheel}: another libnvshmem_host comes first (LD_LIBRARY_PATH?)"
            )
    if len(set(versions.values())) > 1:
        seen = ", ".join(f"{w}: {'.'.join(map(str, v))}" for w, v in versions.items())
        out.append(f"workers load different NVSHMEM versions ({seen}); install the same one everywhere")
    return out


def _peer_access() -> str:
    """Peer access between the GPUs this process sees (all of them on a LocalCUDACluster host)."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return "not checked (no CuPy or no GPU here)"
    if n < 2:
        return f"not checked ({n} GPU visible here)"
    missing = [
        f"{i}->{j}"
        for i in range(n)
        for j in range(n)
        if i != j and not cupy.cuda.runtime.deviceCanAccessPeer(i, j)
    ]
    return "every pair" if not missing else f"missing for {', '.join(missing)}"


def remote_transport_line(reports: dict[str, dict]) -> str:
    """The NVSHMEM remote transport a world over every worker of ``reports`` would use, and why
    (`dask_redist.engines.cufftmp.remote`); the first worker's where they differ, said so."""
    hosts = {r.get("host") for r in reports.values()}  # (each worker's redist.host, as doctor asked it)
    seen = {
        remote.remote_transport(
            hosts, r.get("network devices") or [], (r.get("NVSHMEM environment") or {}).get(remote.VARIABLE)
        )
        for r in reports.values()
    }
    value, why = sorted(seen)[0]
    return f"NVSHMEM remote transport {value} ({why})" + ("; workers differ" if len(seen) > 1 else "")
