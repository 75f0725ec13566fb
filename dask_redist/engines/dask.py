"""The ``dask`` engine: pieces travel over Dask's worker-to-worker comms.

Each rank cuts what it sends out of its staged chunks (views), keeps its own
pieces without a copy, and packs what goes to each peer into contiguous
buffers of at most ``redist.memory-budget`` bytes (`dask_redist.core.wire`): one
message (one device-to-host copy for CuPy over TCP) per batch instead of one per
piece, which matters when a rechunk has tens of thousands of pieces. All peers are
sent to at once; then the rank waits for what the others send.
Output chunks made of pieces are assembled lazily by the unpack tasks, in parallel on
the worker's threads. NumPy and CuPy pieces alike: Dask's serializers carry them
(CuPy stays on the GPU over UCX).

Where every rank's (needed) output chunks tile one box, the usual case (the
planner's owners are boxes where balance allows), ranks send input chunks cut to
output boxes instead of pieces (`dask_redist.planning.boxes.box_transfers`), and
each output chunk is cut from the box its rank assembled: pieces (``old chunk ∩ new
chunk``) can number in the millions (1024 row slabs to 1024 column slabs: 1024 x 1024),
and every piece cost a slice, a copy and an assembly step in Python. Where the received
blocks cross the output chunks only a few thousand times, they are copied straight into
the output chunks instead (no box: a third less new memory, one copy less;
`DIRECT_MAX_PARTS`). Both measured in docs/benchmarks.md ("Levers of 2026-12-01").
"""

from __future__ import annotations

import math

import numpy as np

from dask_redist.core.assemble import Assembly, cut, empty
from dask_redist.core.wire import Packed, batches, pack
from dask_redist.engines.description import EngineDescription, Request
from dask_redist.engines.protocol import Engine
from dask_redist.errors import RedistError
from dask_redist.planning import Transfers
from dask_redist.planning.boxes import box_transfers


#: Most (received block, output chunk) crossings copied one by one straight into the output
#: chunks; beyond it (e.g. 1024 row slabs to 1024 column slabs: a million) the blocks are
#: assembled into one box first and the chunks cut from it, in calls that follow the chunks.
#: Straight copies touch a third less new memory (no box): the cost on a machine where
#: first-touch page faults dominate (docs/benchmarks.md).
DIRECT_MAX_PARTS = 4096


def _in_order(recv: Transfers, received: dict[int, list]) -> list:
    """The received arrays in ``recv``'s order (each source's arrays arrive in its order)."""
    position = {s: 0 for s in received}
    blocks = []
    for s in recv.src.tolist():
        blocks.append(received[s][position[s]])
        position[s] += 1
    return blocks


def _crossings(lo: np.ndarray, hi: np.ndarray, corners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(block, chunk) index pairs where block boxes [lo, hi) and chunk boxes ``corners`` overlap."""
    a = np.maximum(lo[:, None, :], corners[None, :, 0, :])
    z = np.minimum(hi[:, None, :], corners[None, :, 1, :])
    return np.nonzero(np.all(z > a, axis=2))


def _assemble_outputs(owned, corners, blocks, recv: Transfers, parts, dtype, like) -> dict:
    """Output chunks allocated and filled from the blocks that cross them (every chunk covered)."""
    out = {f: empty(like, tuple((corners[k, 1] - corners[k, 0]).tolist()), dtype) for k, f in enumerate(owned)}
    covered = np.zeros(len(owned), dtype=np.int64)
    for i, k in zip(*parts):
        a = np.maximum(recv.lo[i], corners[k, 0])
        z = np.minimum(recv.hi[i], corners[k, 1])
        out[owned[k]][tuple(slice(int(x - c), int(y - c)) for x, y, c in zip(a, z, corners[k, 0]))] = blocks[i][
            tuple(slice(int(x - b), int(y - b)) for x, y, b in zip(a, z, recv.lo[i]))
        ]
        covered[k] += int(np.prod(z - a))
    sizes = np.prod(corners[:, 1] - corners[:, 0], axis=1)
    if not np.array_equal(covered, sizes):
        raise RedistError(f"output chunks {[owned[k] for k in np.flatnonzero(covered != sizes)][:5]} were not covered")
    return out


def cut_pieces(run, t: Transfers) -> list:
    """Views of the staged input chunks for every transfer in ``t``."""
    spec = run.spec.collective.rechunk
    return [cut(run.inputs[int(f)], spec.old_box(f)[0], lo, hi) for f, lo, hi in zip(t.old_block, t.lo, t.hi)]


def box_transfers_of(run) -> Transfers | None:
    """Input chunks cut to output boxes, when the run's outputs tile boxes (else None: pieces)."""
    plan, rechunk = run.plan, run.spec.collective.rechunk
    out_ranks = np.where(plan.needed, plan.out_ranks, -1)
    return box_transfers(rechunk.old, plan.in_ranks, rechunk.new, out_ranks, plan.nranks, rechunk.itemsize)


class DaskDescription(EngineDescription):
    """The dask engine, as the scheduler sees it: it runs wherever Dask does, so ``auto`` takes it
    when no engine it prefers takes the rechunk, and says why those did not."""

    preference = 0

    def chosen(self, request: Request, passed_over: list[str]) -> str:
        return passed_over[0] if passed_over else request.chunks

    def mapping(self, plan, settings) -> tuple[str, int, int]:
        t = plan.traffic
        largest = int((t - np.diag(np.diag(t))).max(initial=0))  # (between two ranks)
        messages = max(1, math.ceil(largest / settings.memory_budget))
        return f"pieces over dask comms, packed per peer (up to {messages} message(s) per peer, all sent at once)", 0, 1


class DaskEngine(Engine):
    name = "dask"
    description = DaskDescription

    def execute(self, run, transport) -> None:
        blocks = box_transfers_of(run)
        transfers = run.plan.transfers if blocks is None else blocks
        sends = transfers.take(transfers.src == run.rank)
        self._send(run, transport, sends.take(sends.canonical_order()))
        run.inputs = {}
        recv = transfers.take(transfers.dst == run.rank)
        recv = recv.take(recv.canonical_order())
        received = run.wait_received(recv)
        run.finish(run.assemblies(received) if blocks is None else self._cut_outputs(run, recv, received))

    @staticmethod
    def _cut_outputs(run, recv: Transfers, received: dict[int, list]) -> dict:
        """The output chunks of this rank from the blocks ``received`` (input chunks cut to its
        output box): copied straight into the output chunks where blocks and chunks cross at
        most `DIRECT_MAX_PARTS` times, else cut from the box assembled from them."""
        spec, like = run.spec.collective, run.like_array(received)
        owned = run.plan.owned(run.rank)
        if not owned:
            return {}
        corners = np.array([spec.rechunk.new_box(f) for f in owned])  # (n, 2, ndim)
        blocks = _in_order(recv, received)
        # (the crossing test is a blocks x chunks array: only where that is small)
        parts = _crossings(recv.lo, recv.hi, corners) if len(blocks) * len(owned) <= 64 * DIRECT_MAX_PARTS else None
        if parts is not None and len(parts[0]) <= DIRECT_MAX_PARTS:
            return _assemble_outputs(owned, corners, blocks, recv, parts, spec.dtype, like)
        lower, upper = tuple(corners[:, 0].min(axis=0).tolist()), tuple(corners[:, 1].max(axis=0).tolist())
        box = empty(like, tuple(u - l for l, u in zip(lower, upper)), spec.dtype)
        for i, a in enumerate(blocks):
            box[tuple(slice(int(l) - o, int(h) - o) for l, h, o in zip(recv.lo[i], recv.hi[i], lower))] = a
        out = {}
        for f, (lo, hi) in zip(owned, corners.tolist()):
            view = box[tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, lower))]
            out[f] = Assembly(tuple(lo), tuple(hi), spec.dtype, like, [(lo, hi, view)], shared=True)
        return out

    def _send(self, run, transport, sends: Transfers) -> None:
        """Pack what goes to each peer into buffers of at most the budget; keep this rank's own."""
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
