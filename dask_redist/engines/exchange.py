"""The exchange kit of an engine that moves pieces: what this rank sends and receives, by peer, and the pieces cut.

Both sides of a transfer list it in one order (`dask_redist.planning.Transfers.canonical_order`),
so a rank hands what it receives to ``run.receive`` in the order its peer sent it; an engine
moves the bytes its own way between `sends` and `receives`, or over Dask's comms (`send_pieces`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from dask_redist.core.assemble import cut
from dask_redist.core.wire import Packed, SendBuffers, as_is, batches, pack, padded_sizes
from dask_redist.planning import Transfers

#: Packed buffers kept for the next run, per worker process (`dask_redist.core.wire.SendBuffers`):
#: filling fresh pages cost up to ten times as much on the CPU machine, as it varied from run to run
#: (docs/benchmarks.md, "Where the CPU runs' slow mode came from").
SEND_BUFFERS_KEPT = 256 * 2**20
#: ... and at most this part of the worker's memory limit (the kept buffers are memory Dask does not manage)
SEND_BUFFERS_SHARE = 1 / 16
_send_buffers = SendBuffers(SEND_BUFFERS_KEPT)


def bound_send_buffers(memory_limit: int | None) -> int:
    """Keep at most `SEND_BUFFERS_KEPT` bytes of packed buffers in this process, and at most
    `SEND_BUFFERS_SHARE` of ``memory_limit`` (the worker's; None or 0: none); the bound."""
    keep = (
        SEND_BUFFERS_KEPT
        if not memory_limit
        else min(SEND_BUFFERS_KEPT, int(memory_limit * SEND_BUFFERS_SHARE))
    )
    _send_buffers.bound(keep)
    return keep


def sends(run, transfers: Transfers | None = None) -> Transfers:
    """What this rank sends of ``transfers`` (default: the plan's pieces), in the order both sides use."""
    t = run.plan.transfers if transfers is None else transfers
    mine = t.take(t.src == run.rank)
    return mine.take(mine.canonical_order())


def receives(run, transfers: Transfers | None = None) -> Transfers:
    """What this rank receives of ``transfers`` (default: the plan's pieces), in the order both sides use."""
    t = run.plan.transfers if transfers is None else transfers
    mine = t.take(t.dst == run.rank)
    return mine.take(mine.canonical_order())


def in_order(recv: Transfers, received: dict[int, list]) -> list:
    """The arrays received from each source (``run.wait_received``) in ``recv``'s order (each
    source's arrive in its order)."""
    position = {s: 0 for s in received}
    out = []
    for s in recv.src.tolist():
        out.append(received[s][position[s]])
        position[s] += 1
    return out


def empty_outputs(run, xp, round_to: int = 0) -> dict:
    """This rank's output chunks, allocated by ``xp.empty`` (none once the run was aborted); those
    an FFT's leg gives (``run.into``, `dask_redist.engines.cufftmp.fft.Leg`) taken as they are.
    ``round_to``: each chunk of that many bytes or more is the start of an allocation of a
    multiple of it (`rounded_empty`)."""
    if run.state == "failed":
        return {}
    spec = run.spec.collective
    owned = run.plan.owned(run.rank)
    lower, upper = spec.rechunk.new_boxes(owned)
    given = getattr(run, "into", {})
    return {
        f: given[f] if f in given else rounded_empty(xp, tuple(shape), spec.dtype, round_to)
        for f, shape in zip(owned, (upper - lower).tolist())
    }


def rounded_empty(xp, shape: tuple, dtype, round_to: int = 0):
    """``xp.empty(shape, dtype)``; where it has ``round_to`` bytes or more and not a multiple of
    them, a view of the first bytes of an allocation rounded up to one (a peer process maps a
    whole allocation through CUDA IPC, and one not a multiple of the GPU's 2 MiB pages costs it
    far more to map: docs/benchmarks.md)."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if not round_to or nbytes < round_to or nbytes % round_to == 0:
        return xp.empty(shape, dtype=dtype)
    whole = xp.empty(-(-nbytes // round_to) * round_to, dtype=np.uint8)
    return whole[:nbytes].view(dtype).reshape(shape)


def by_peer(run, t: Transfers, side: str) -> Iterator[tuple[int, Transfers]]:
    """(peer, its transfers) of `sends` (``side`` "dst") or `receives` (``side`` "src"), the rank
    after this one first: not every rank starts with rank 0."""
    peers = getattr(t, side)
    nranks = len(run.spec.workers)
    for peer in sorted(set(peers.tolist()), key=lambda p: (p - run.rank - 1) % nranks):
        yield peer, t.take(peers == peer)


def cut_pieces(run, t: Transfers) -> list:
    """Views of the staged input chunks for every transfer in ``t``."""
    spec = run.spec.collective.rechunk
    return [cut(run.inputs[int(f)], spec.old_box(f)[0], lo, hi) for f, lo, hi in zip(t.old_block, t.lo, t.hi)]


def send_pieces(run, transport, mine: Transfers) -> None:
    """Send ``mine`` (`sends`, or part of it) to its ranks: what goes to each peer packed into
    buffers of at most ``redist.memory-budget`` bytes (`dask_redist.core.wire`), all peers at once;
    this rank's own pieces handed to ``run.receive`` as they are (views, no copy).

    Where the wire copies the bytes (`Transport.wire_limit`: Dask's TCP comms) a message is also
    at most the size above which the comm would split it into shards that the receiver copies
    back together into a new buffer, and NumPy pieces are packed into buffers kept from run to
    run (`SEND_BUFFERS_KEPT`)."""
    budget = run.spec.collective.settings.memory_budget
    run.set_phase("send")
    outgoing = []
    for dst, t in by_peer(run, mine, "dst"):
        arrays = cut_pieces(run, t)
        if dst == run.rank:
            run.receive(run.rank, 0, arrays)
            continue
        limit = wire_limit(transport, dst)
        pool = None if limit is None else _send_buffers
        cap = budget if limit is None else min(budget, limit)
        outgoing += [
            (dst, first, Packed(stop - first, pack(arrays[first:stop], t.nbytes[first:stop], pool)))
            for first, stop in batches(padded_sizes(t.nbytes), cap, as_is(arrays, t.nbytes))
        ]
    if not outgoing:
        return
    buffers = [packed.buffer for _, _, packed in outgoing]
    try:
        transport.send(outgoing)
    except BaseException:
        _send_buffers.give_back(buffers, keep=False)  # (a send still under way may read them)
        raise
    _send_buffers.give_back(buffers)


def wire_limit(transport, dst: int) -> int | None:
    """`Transport.wire_limit` of ``transport`` for rank ``dst``; None where it has none."""
    limit = getattr(transport, "wire_limit", None)
    return None if limit is None else limit(dst)
