"""The ``dask`` engine: pieces travel over Dask's worker-to-worker comms.

Each rank cuts what it sends out of its staged chunks (views), keeps its own
pieces without a copy, and packs what goes to each peer into contiguous
buffers of at most ``redist.memory-budget`` bytes (`dask_redist.core.wire`): one
message (one device-to-host copy for CuPy over TCP) per batch instead of one per
piece, which matters when a rechunk has tens of thousands of pieces. All peers are
sent to at once; then the rank waits for what the others send.
Output chunks are assembled lazily by the unpack tasks, in parallel on the
worker's threads. NumPy and CuPy pieces alike: Dask's serializers carry them
(CuPy stays on the GPU over UCX).
"""

from __future__ import annotations

from dask_redist.core.assemble import cut
from dask_redist.core.wire import Packed, batches, pack
from dask_redist.engines.protocol import Engine
from dask_redist.planning import Transfers


def cut_pieces(run, t: Transfers) -> list:
    """Views of the staged input chunks for every transfer in ``t``."""
    spec = run.spec.collective.rechunk
    return [cut(run.inputs[int(f)], spec.old_box(f)[0], lo, hi) for f, lo, hi in zip(t.old_block, t.lo, t.hi)]


class DaskEngine(Engine):
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
                outgoing += [
                    (dst, first, Packed(stop - first, pack(arrays[first:stop], t.nbytes[first:stop])))
                    for first, stop in batches(t.nbytes, budget)
                ]
        if outgoing:
            transport.send(outgoing)
        run.inputs = {}
        received = run.wait_received()
        run.finish(run.assemblies(received))
