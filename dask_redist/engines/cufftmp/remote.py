"""NVSHMEM's remote transport for a world whose workers all share one host.

NVSHMEM reaches PEs on other hosts through its *remote transport*, chosen by the environment
variable ``NVSHMEM_REMOTE_TRANSPORT``: "Selected transport for remote operations: ibrc, ucx,
libfabric, ibdevx, none", default ``ibrc`` (NVSHMEM's environment variables,
https://docs.nvidia.com/nvshmem/api/gen/env.html, "Transport options"; the text is NVSHMEM's
own ``NVSHMEMI_ENV_DEF(REMOTE_TRANSPORT, ...)``). At every bootstrap, ``ibrc`` looks for
InfiniBand devices, and on a host without any it writes ``ibrc.cpp:...: error status: 7
(NVSHMEMX_ERROR_INTERNAL) no IB devices found`` into each PE's log, although a world on one
host reaches its PEs by peer-to-peer access and needs no remote transport.

So where every worker of a world is on one host and the host has no InfiniBand/RoCE device,
``NVSHMEM_REMOTE_TRANSPORT=none`` is set in the worker before NVSHMEM starts (where
``NVSHMEM_SYMMETRIC_SIZE`` is set: `World.join`). A value the environment sets already is
kept (the operator's choice); a ``none`` set here is taken back for a later world that spans
hosts. A host with InfiniBand devices keeps NVSHMEM's default: there the transport can serve
GPU pairs without peer access.

A worker's host is ``redist.host`` of its own process, else its address's host
(`dask_redist.config.host`): workers given two names on one machine (pseudo-hosts) are two hosts
here. A world over several hosts needs a remote transport on every worker (`transport_problem`):
``ucx`` or ``libfabric`` named in ``NVSHMEM_REMOTE_TRANSPORT`` (no InfiniBand needed: UCX's or
libfabric's TCP), or an InfiniBand/RoCE device for NVSHMEM's default; where one worker has none,
NVSHMEM's bootstrap could not reach it, and ``auto`` runs such rechunks on another engine
(`across_hosts_problem`).

UCX without an InfiniBand/RoCE device does NVSHMEM's atomics on the GPU's memory from the host
("libibverbs reported no active NICs; Assuming local atomics are required"), which needs a GPU-CPU
mapping: GDRCopy (``libgdrapi`` and its ``gdrdrv`` kernel module) or the CUDA driver's DMA-BUF
backend (driver 13.3, R610, or later). Without either, NVSHMEM initialized its ucx transport and
then stopped at its first atomic ("UCX atomic verb 8 is unsupported without a GPU CPU mapping"):
the world never formed (measured on one H200 with ``NVSHMEM_DISABLE_P2P=1``, docs/scale.md). So
where the workers span machines (`machine`: hostname and boot id), or a worker turned P2P off, a
worker with ``ucx``, no such device and neither mapping has no remote transport NVSHMEM can use:
the doctor says so, and ``auto`` runs such rechunks on another engine. Pseudo-hosts of one machine
reach each other by P2P and form their world with ``ucx`` set (measured, with P2P on): there the
mapping is not needed (`mapping_needed`).
"""

from __future__ import annotations

import os
import socket

VARIABLE = "NVSHMEM_REMOTE_TRANSPORT"
IB_DEVICES = "/sys/class/infiniband"  # where Linux lists InfiniBand / RoCE devices
_SET_HERE = "none"
#: Remote transports NVSHMEM can run without an InfiniBand/RoCE device (over TCP, among others).
WITHOUT_IB = ("ucx", "libfabric")
#: How to make a world over several hosts form, for reasons.
REMEDY = (
    "set NVSHMEM_REMOTE_TRANSPORT (ucx, libfabric) where the workers are started, for their network, "
    "or keep cufftmp to one node (docs/deployment.md#nvshmem-settings-for-several-nodes)"
)


#: The CUDA driver version (as ``cudaDriverGetVersion`` gives it) from which NVSHMEM's DMA-BUF backend works
DMA_BUF_DRIVER = 13030
GDRCOPY_DEVICE = "/dev/gdrdrv"
GDRCOPY_LIBRARY = "libgdrapi.so.2"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: NVSHMEM's setting that sends every pair of PEs, on one machine too, through the remote transport
DISABLE_P2P = "NVSHMEM_DISABLE_P2P"


def ib_devices(path: str = IB_DEVICES) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def gpu_cpu_mapping(device: str = GDRCOPY_DEVICE, driver: int | None = None) -> str | None:
    """What lets NVSHMEM's UCX transport do atomics without a network device (module docstring):
    "GDRCopy", "CUDA DMA-BUF", or None for neither. ``driver``: the CUDA driver's version (None:
    asked of CuPy; unknown counts as too old)."""
    import ctypes

    if os.path.exists(device):
        try:
            ctypes.CDLL(GDRCOPY_LIBRARY)
            return "GDRCopy"
        except OSError:
            pass
    if driver is None:
        try:
            import cupy

            driver = cupy.cuda.runtime.driverGetVersion()
        except Exception:  # noqa: BLE001 - no CUDA here: no DMA-BUF either
            driver = 0
    return "CUDA DMA-BUF" if driver >= DMA_BUF_DRIVER else None


def machine(boot_id: str = BOOT_ID) -> str:
    """This machine, whatever ``redist.host`` says: its hostname and the kernel's boot id."""
    try:
        with open(boot_id) as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()} {boot}"


def p2p_disabled() -> bool:
    """Does this process's ``NVSHMEM_DISABLE_P2P`` turn NVSHMEM's P2P transport off? (NVSHMEM's
    booleans: 1, y, yes, t, true, any case.)"""
    return os.environ.get(DISABLE_P2P, "").strip().lower() in ("1", "y", "yes", "t", "true")


def mapping_needed(facts) -> bool:
    """Do the workers of ``facts`` (each one's `facts` or doctor report) need a GPU-CPU mapping
    for ``ucx`` without a network device: they span machines, or one of them turned P2P off?
    Workers that did not say (an older dask-redist) are not counted."""
    said = [f for f in facts if "machine" in f]
    return len({f["machine"] for f in said}) > 1 or any(f.get("p2p disabled") for f in said)


def remote_transport(hosts, devices, environment: str | None) -> tuple[str, str]:
    """(what ``NVSHMEM_REMOTE_TRANSPORT`` NVSHMEM will read, why) for a world over workers on
    ``hosts`` whose host lists InfiniBand ``devices``, the environment holding ``environment``."""
    hosts = set(hosts)
    if environment:
        return environment, "set in the worker's environment"
    if len(hosts) == 1 and not devices:
        return "none", "every worker on one host without InfiniBand: set by dask-redist before NVSHMEM starts"
    if len(hosts) > 1:
        return "ibrc", f"NVSHMEM's default; workers on {len(hosts)} hosts"
    return "ibrc", f"NVSHMEM's default; InfiniBand devices here: {', '.join(devices)}"


_ours: list[bool] = [False]  # (whether the value in the environment is one set here)


def set_here() -> bool:
    """Is the ``NVSHMEM_REMOTE_TRANSPORT`` of this process one `set_for_world` set?"""
    return _ours[0]


def set_for_world(hosts, devices=None) -> str:
    """Set ``NVSHMEM_REMOTE_TRANSPORT`` in this process for a world over workers on ``hosts``
    (each member's `dask_redist.config.host`), before NVSHMEM starts (module docstring); the value
    NVSHMEM will read."""
    if _ours[0]:  # (a world before this one had it set here: decide afresh)
        os.environ.pop(VARIABLE, None)
        _ours[0] = False
    devices = ib_devices() if devices is None else devices
    value, _ = remote_transport(set(hosts), devices, os.environ.get(VARIABLE))
    if VARIABLE not in os.environ and value == _SET_HERE:
        os.environ[VARIABLE] = value
        _ours[0] = True
    return value


def environment() -> str | None:
    """``NVSHMEM_REMOTE_TRANSPORT`` as the worker's environment sets it (None: unset, or set by
    `set_for_world` for the world of the moment)."""
    return None if _ours[0] else (os.environ.get(VARIABLE) or None)


def facts() -> dict:
    """What `transport_problem` needs of this worker (its cufftmp capabilities carry them); its
    GPU-CPU mapping only where its transport is ``ucx`` (finding it asks CUDA's driver)."""
    out = {
        "network devices": ib_devices(),
        "remote transport": environment(),
        "machine": machine(),
        "p2p disabled": p2p_disabled(),
    }
    if (out["remote transport"] or "").strip().lower() == "ucx":
        out["gpu cpu mapping"] = gpu_cpu_mapping()
    return out


#: `transport_problem`'s ``mapping`` where the worker did not say (an older dask-redist): not counted
UNKNOWN = "unknown"


def counted_mapping(facts: dict, needed: bool) -> str | None:
    """The GPU-CPU mapping of a worker's ``facts`` (or doctor report) as `transport_problem` takes
    it: `UNKNOWN` (not counted) where its world does not need one (`mapping_needed`)."""
    return facts.get("gpu cpu mapping", UNKNOWN) if needed else UNKNOWN


def transport_problem(devices, environment: str | None, mapping: str | None = UNKNOWN) -> str | None:
    """Why NVSHMEM could not reach a worker on another host (``devices``: its InfiniBand/RoCE
    devices; ``environment``: its ``NVSHMEM_REMOTE_TRANSPORT``; ``mapping``: its `gpu_cpu_mapping`),
    or None."""
    value = (environment or "").strip().lower()
    if value == "ucx" and not devices and mapping is None:
        return (
            f"{VARIABLE}=ucx without an InfiniBand/RoCE device needs a GPU-CPU mapping for NVSHMEM's atomics, "
            "GDRCopy (libgdrapi and the gdrdrv module) or CUDA's DMA-BUF backend (driver 13.3, R610, or later), "
            "and this worker has neither: NVSHMEM's bootstrap would stop at its first atomic"
        )
    if value in WITHOUT_IB:
        return None
    if value == "none":
        return f"{VARIABLE}=none"
    if not devices:
        named = f"is {environment}" if value else "unset"
        return f"no InfiniBand/RoCE device for NVSHMEM's remote transport and {VARIABLE} {named}"
    return None


def across_hosts_problem(answers: dict[str, dict]) -> str | None:
    """Why a world over the workers of ``answers`` (address -> its cufftmp capabilities: ``host``
    and `facts`) cannot form, or None: they are on several hosts and one of them has no remote
    transport NVSHMEM can use. Workers that said nothing of their host are not counted."""
    hosts = sorted({str(a["host"]) for a in answers.values() if a.get("host")})
    if len(hosts) < 2:
        return None
    needed = mapping_needed(answers.values())
    bad = [
        (w, why)
        for w, a in sorted(answers.items())
        if a.get("host")
        and (
            why := transport_problem(
                a.get("network devices"),
                a.get("remote transport"),
                counted_mapping(a, needed),
            )
        )
    ]
    if not bad:
        return None
    (worker, why), more = bad[0], f" (and {len(bad) - 1} more workers)" if len(bad) > 1 else ""
    return (
        f"workers on {len(hosts)} hosts ({', '.join(hosts)}), but {worker}{more} has no remote transport "
        f"NVSHMEM can use ({why}); {REMEDY}"
    )
