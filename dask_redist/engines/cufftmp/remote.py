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
"""

from __future__ import annotations

import os

VARIABLE = "NVSHMEM_REMOTE_TRANSPORT"
IB_DEVICES = "/sys/class/infiniband"  # where Linux lists InfiniBand / RoCE devices
_SET_HERE = "none"


def ib_devices(path: str = IB_DEVICES) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


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


def set_for_world(workers, devices=None) -> str:
    """Set ``NVSHMEM_REMOTE_TRANSPORT`` in this process for a world over ``workers`` (addresses),
    before NVSHMEM starts (module docstring); the value NVSHMEM will read."""
    from distributed.comm import get_address_host

    if _ours[0]:  # (a world before this one had it set here: decide afresh)
        os.environ.pop(VARIABLE, None)
        _ours[0] = False
    devices = ib_devices() if devices is None else devices
    value, _ = remote_transport({get_address_host(w) for w in workers}, devices, os.environ.get(VARIABLE))
    if VARIABLE not in os.environ and value == _SET_HERE:
        os.environ[VARIABLE] = value
        _ours[0] = True
    return value
