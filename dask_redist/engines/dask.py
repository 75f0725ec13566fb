"""The ``dask`` engine: pieces travel over Dask's worker-to-worker comms.

Each rank cuts what it sends out of its staged chunks (views, no copy), keeps
its own pieces, sends the rest in batches of at most ``redist.memory-budget``
bytes to each peer (all peers at once), then waits for what the others send.
Output chunks are assembled lazily by the unpack tasks, in parallel on the
worker's threads. NumPy and CuPy pieces alike: Dask's serializers carry them
(CuPy stays on the GPU over UCX).
"""

from __future__ import annotations

import numpy as np

from dask_redist.assemble import cut
from dask_redist.plan import Transfers


def chunk_lowers(chunks) -> list[np.ndarray]:
    return [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64) for c in chunks]


def cut_pieces(run, t: Transfers) -> list:
    """Views of the staged input chunks for every transfer in ``t``."""
    spec = run.spec.collective.rechunk
    lowers = chunk_lowers(spec.old)
    out = []
    for k in range(len(t)):
        idx = np.unravel_index(int(t.old_block[k]), spec.old_grid)
        origin = [int(lw[i]) for lw, i in zip(lowers, idx)]
        out.append(cut(run.inputs[int(t.old_block[k])], origin, t.lo[k], t.hi[k]))
    return out


def batches(arrays: list, nbytes: np.ndarray, budget: int) -> list[tuple[int, list]]:
    """Consecutive (first, arrays) batches of at most ``budget`` bytes (a bigger piece alone)."""
    out, first, size = [], 0, 0
    for i, n in enumerate(nbytes.tolist()):
        if size + n > budget and i > first:
            out.append((first, arrays[first:i]))
            first, size = i, 0
        size += n
    if first < len(arrays):
        out.append((first, arrays[first:]))
    return out


class DaskEngine:
    name = "dask"

    def execute(self, run, transport) -> None:
        sends = run.plan.sends(run.rank)
        budget = run.spec.collective.settings.memory_budget
        nranks = len(run.spec.workers)
        run.set_phase("send")
        outgoing = []
        # start with the next rank so that not every rank sends to rank 0 first
        for dst in sorted(set(sends.dst.tolist()), key=lambda d: (d - run.rank - 1) % nranks):
            t = sends.take(sends.dst == dst)
            arrays = cut_pieces(run, t)
            if dst == run.rank:
                run.receive(run.rank, 0, arrays)
            else:
                outgoing += [(dst, first, part) for first, part in batches(arrays, t.nbytes, budget)]
        if outgoing:
            transport.send(outgoing)
        run.inputs = {}
        received = run.wait_received()
        run.finish(run.assemblies(received))
