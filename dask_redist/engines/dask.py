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
`DIRECT_MAX_PARTS`). Both measured in docs/benchmarks.md.
"""

from __future__ import annotations

import math

import numpy as np

from dask_redist.core.assemble import Assembly, empty
from dask_redist.core.wire import tcp_shard_size
from dask_redist.engines.description import EngineDescription, Request
from dask_redist.engines.exchange import in_order, receives, send_pieces, sends
from dask_redist.engines.protocol import Engine
from dask_redist.errors import RedistError
from dask_redist.planning import Transfers
from dask_redist.planning.boxes import box_transfers


#: Most (received block, output chunk) crossings copied one by one straight into the output
#: chunks; beyond it (e.g. 1024 row slabs to 1024 column slabs: a million) the blocks are
#: assembled into one box first and the chunks cut from it, in calls that follow the chunks.
#: Straight copies touch a third less new memory (no box) and copy once where the box copies
#: twice: the cost on a machine where first-touch page faults dominate. The bound and the
#: pencil case that moved it are measured in docs/benchmarks.md.
DIRECT_MAX_PARTS = 65536
#: Output chunks of at least this many bytes (on average) are put together by their unpack tasks,
#: in parallel on the worker's threads, from views of the blocks (`_output_assemblies`); smaller
#: ones by the collective thread before the run ends, where a task's build per chunk costs more
#: than it spreads. Measured in docs/benchmarks.md ("the `dask` engine's large chunks").
LAZY_MIN_BYTES = 32 * 2**20


def _crossings(lo: np.ndarray, hi: np.ndarray, new_chunks, owned: list[int], corners: np.ndarray, limit: int):
    """(block, k, lower, upper) of every overlap of a block box [lo, hi) with output chunk
    ``owned[k]`` (flat indices into the grid of ``new_chunks``; ``corners``: their boxes), or
    None where there are more than ``limit``. Found on the chunk grid axis by axis: counted
    before any is enumerated."""
    bounds = [np.concatenate([[0], np.cumsum(c, dtype=np.int64)]) for c in new_chunks]
    first = np.stack([np.searchsorted(b, lo[:, a], side="right") - 1 for a, b in enumerate(bounds)], axis=1)
    stop = np.stack([np.searchsorted(b, hi[:, a], side="left") for a, b in enumerate(bounds)], axis=1)
    counts = np.prod(np.maximum(stop - first, 0), axis=1)
    if int(counts.sum()) > limit:
        return None
    grid = tuple(len(c) for c in new_chunks)
    position = np.full(math.prod(grid), -1, dtype=np.int64)
    position[np.asarray(owned, dtype=np.int64)] = np.arange(len(owned))
    pairs = [
        (
            i,
            np.ravel_multi_index(
                [g.ravel() for g in np.meshgrid(*map(np.arange, first[i], stop[i]), indexing="ij")], grid
            ),
        )
        for i in np.flatnonzero(counts).tolist()
    ]
    block = np.concatenate([np.full(len(f), i) for i, f in pairs]) if pairs else np.zeros(0, np.int64)
    k = position[np.concatenate([f for _, f in pairs])] if pairs else np.zeros(0, np.int64)
    block, k = block[k >= 0], k[k >= 0]
    a, z = np.maximum(lo[block], corners[k, 0]), np.minimum(hi[block], corners[k, 1])
    keep = np.all(z > a, axis=1)
    return block[keep], k[keep], a[keep], z[keep]


def _covered(owned, corners, parts) -> None:
    """Raise unless the parts (`_crossings`) cover every output chunk."""
    _, k, a, z = parts
    covered = (
        np.bincount(k, weights=np.prod(z - a, axis=1), minlength=len(owned))
        if len(k)
        else np.zeros(len(owned))
    )
    sizes = np.prod(corners[:, 1] - corners[:, 0], axis=1)
    if not np.array_equal(covered.astype(np.int64), sizes):
        raise RedistError(
            f"output chunks {[owned[j] for j in np.flatnonzero(covered != sizes)][:5]} were not covered"
        )


def _part_views(blocks, recv: Transfers, parts):
    """(output position, global lower corner, extent, view into its block) of every part
    (`_crossings`)."""
    block, k, a, z = parts
    at_block, extent = (a - recv.lo[block]).tolist(), (z - a).tolist()
    for i, kk, lo, b, e in zip(block.tolist(), k.tolist(), a.tolist(), at_block, extent):
        yield kk, lo, e, blocks[i][tuple(slice(x, x + n) for x, n in zip(b, e))]


def _output_assemblies(owned, corners, blocks, recv: Transfers, parts, dtype, like) -> dict:
    """Output chunks as `Assembly`s of views into the blocks that cross them (every chunk covered)."""
    _covered(owned, corners, parts)
    out = {
        f: Assembly(tuple(lo), tuple(hi), dtype, like, [], shared=True)
        for f, (lo, hi) in zip(owned, corners.tolist())
    }
    for kk, lo, e, view in _part_views(blocks, recv, parts):
        out[owned[kk]].parts.append((lo, [x + n for x, n in zip(lo, e)], view))
    return out


def _assemble_outputs(owned, corners, blocks, recv: Transfers, parts, dtype, like) -> dict:
    """Output chunks allocated and filled from the blocks that cross them (every chunk covered)."""
    _covered(owned, corners, parts)
    out = [empty(like, tuple((corners[k, 1] - corners[k, 0]).tolist()), dtype) for k in range(len(owned))]
    lowers = corners[:, 0].tolist()
    for kk, lo, e, view in _part_views(blocks, recv, parts):
        out[kk][tuple(slice(x - c, x - c + n) for x, c, n in zip(lo, lowers[kk], e))] = view
    return dict(zip(owned, out))


def box_transfers_of(run) -> Transfers | None:
    """Input chunks cut to output boxes, when the run's outputs tile boxes (else None: pieces)."""
    plan, rechunk = run.plan, run.spec.collective.rechunk
    out_ranks = np.where(plan.needed, plan.out_ranks, -1)
    return box_transfers(rechunk.old, plan.in_ranks, rechunk.new, out_ranks, plan.nranks, rechunk.itemsize)


class DaskDescription(EngineDescription):
    """The dask engine, as the scheduler sees it: it runs wherever Dask does, so ``auto`` takes it
    when no engine it prefers takes the rechunk, and says why those did not."""

    preference = 0
    recovery = True  # a run the engine chosen cannot finish recovers here: it runs wherever Dask does

    def chosen(self, request: Request, passed_over: list[str]) -> str:
        return passed_over[0] if passed_over else request.chunks

    def mapping(self, plan, settings) -> tuple[str, int, int]:
        t = plan.traffic
        largest = int((t - np.diag(np.diag(t))).max(initial=0))  # (between two ranks)
        messages = max(1, math.ceil(largest / settings.memory_budget))
        # over TCP a message is also at most the comm's shard size (`exchange.send_pieces`)
        over_tcp = max(1, math.ceil(largest / min(settings.memory_budget, tcp_shard_size())))
        count = f"{messages}" if over_tcp == messages else f"{over_tcp} over TCP, {messages} over UCX"
        return (
            f"pieces over dask comms, packed per peer (up to {count} message(s) per peer, all sent at once)",
            0,
            1,
        )


class DaskEngine(Engine):
    name = "dask"
    description = DaskDescription

    def execute(self, run, transport) -> None:
        blocks = box_transfers_of(run)
        send_pieces(run, transport, sends(run, blocks))
        run.inputs = {}
        recv = receives(run, blocks)
        received = run.wait_received(recv)
        run.finish(run.assemblies(received) if blocks is None else self._cut_outputs(run, recv, received))

    @staticmethod
    def _cut_outputs(run, recv: Transfers, received: dict[int, list]) -> dict:
        """The output chunks of this rank from the blocks ``received`` (input chunks cut to its
        output box): copied straight into the output chunks where blocks and chunks cross at
        most `DIRECT_MAX_PARTS` times (by the unpack tasks where the chunks are large:
        `LAZY_MIN_BYTES`), else cut from the box assembled from them."""
        spec, like = run.spec.collective, run.like_array(received)
        owned = run.plan.owned(run.rank)
        if not owned:
            return {}
        corners = np.array([spec.rechunk.new_box(f) for f in owned])  # (n, 2, ndim)
        blocks = in_order(recv, received)
        parts = _crossings(recv.lo, recv.hi, spec.rechunk.new, owned, corners, DIRECT_MAX_PARTS)
        if parts is not None:
            lazy = (
                np.prod(corners[:, 1] - corners[:, 0], axis=1).mean() * spec.dtype.itemsize >= LAZY_MIN_BYTES
            )
            assemble = _output_assemblies if lazy else _assemble_outputs
            return assemble(owned, corners, blocks, recv, parts, spec.dtype, like)
        lower, upper = tuple(corners[:, 0].min(axis=0).tolist()), tuple(corners[:, 1].max(axis=0).tolist())
        box = empty(like, tuple(u - l for l, u in zip(lower, upper)), spec.dtype)
        for i, a in enumerate(blocks):
            box[tuple(slice(int(l) - o, int(h) - o) for l, h, o in zip(recv.lo[i], recv.hi[i], lower))] = a
        out = {}
        for f, (lo, hi) in zip(owned, corners.tolist()):
            view = box[tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, lower))]
            out[f] = Assembly(tuple(lo), tuple(hi), spec.dtype, like, [(lo, hi, view)], shared=True)
        return out
