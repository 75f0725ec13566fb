"""Which way each piece of a hybrid run goes: through CUDA IPC or over Dask's comms, per pair of ranks.

Decided by every rank alike from what all of them share: the run's plan (its pieces, each from
rank ``src`` to rank ``dst``) and what every rank said in the run's first all-gather (its
`dask_redist.config.host`, and whether peers can map its output chunks). A piece goes through
CUDA IPC where both ranks are on one host and every rank of that host can be mapped; every other
piece over Dask's comms. A host with one rank that cannot be mapped sends all of its pieces over
comms, so no rank of it writes into memory a peer could not open (nor waits for one that will
not write).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def by_ipc(src: np.ndarray, dst: np.ndarray, hosts: Sequence[str], mappable: Sequence[bool]) -> np.ndarray:
    """Whether each piece (from rank ``src[i]`` to rank ``dst[i]``) is copied through CUDA IPC:
    ``hosts[r]`` is rank r's host, ``mappable[r]`` whether its output chunks can be mapped."""
    _, host_of = np.unique(np.asarray(hosts, dtype=object).astype(str), return_inverse=True)
    host_of = host_of.ravel()
    able = np.ones(int(host_of.max(initial=-1)) + 1, dtype=bool)
    np.logical_and.at(able, host_of, np.asarray(mappable, dtype=bool))
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    return (host_of[src] == host_of[dst]) & able[host_of[src]]


def summary(nbytes: np.ndarray, src: np.ndarray, dst: np.ndarray, ipc: np.ndarray) -> dict:
    """What went which way (pieces and bytes between ranks, a rank's own pieces apart), for stats."""
    own = np.asarray(src) == np.asarray(dst)
    nbytes = np.asarray(nbytes, dtype=np.int64)
    return {
        "pieces by ipc": int((ipc & ~own).sum()),
        "bytes by ipc": int(nbytes[ipc & ~own].sum()),
        "pieces by comms": int((~ipc & ~own).sum()),
        "bytes by comms": int(nbytes[~ipc & ~own].sum()),
        "own pieces": int(own.sum()),
    }
