"""A cufftmp run in the packed mapping: a (P, W) matrix of words, one all-to-all reshape per round.

Rank ``s`` packs what it sends to rank ``d`` into columns ``[C_d, C_d + W_d)`` of its row; the
input box of ``s`` is its row, the output box of ``d`` its column block (`planning.layout`).
"""

from __future__ import annotations

import numpy as np

from dask_redist.core.assemble import cut
from dask_redist.engines.copies import BoxCopies
from dask_redist.planning.layout import PackedLayout


def run_packed(engine, run, layout: PackedLayout, outputs) -> None:
    """Queue ``run``'s rounds of a packed layout on ``engine`` (a `CufftMpEngine`): each round packs
    what this rank sends to each peer into its row of the (P, W) word matrix, reshapes, and
    unpacks its column block into the output chunks (NumPy chunks through the pinned staging)."""
    spec = run.spec.collective
    dtype, rank, nranks = spec.dtype, run.rank, len(run.spec.workers)
    word = layout.word
    in_max = max(r.row_words for r in layout.packed_rounds) * word
    out_max = max(nranks * int(r.widths.max()) for r in layout.packed_rounds) * word
    plans = []
    for rnd in layout.packed_rounds:  # plan every round first (collective, same order everywhere)
        cols = rnd.columns
        boxes_in = [([0, s, 0], [1, s + 1, rnd.row_words]) for s in range(nranks)]
        boxes_out = [([0, 0, int(cols[d])], [1, nranks, int(cols[d + 1])]) for d in range(nranks)]
        plans.append(engine.plan(word, boxes_in, boxes_out, rank))
    regions = engine._regions(in_max, out_max, plans)
    src, dst, _ = regions
    host = run.spec.chunk_type == "numpy"
    uploaded = []  # the last round's uploaded pieces: queued copies read them until the next wait

    def work(k, exchange):
        rnd = layout.packed_rounds[k]
        if host:
            # the staging buffers are free once the last round is done: see .host
            engine.rounds.wait(run, dry=True)
        cols = rnd.columns
        t = rnd.transfers
        copies = BoxCopies(engine._keep)
        sent = np.flatnonzero(t.src == rank)
        pieces = [
            cut(
                run.inputs[int(t.old_block[i])],
                spec.rechunk.old_box(int(t.old_block[i]))[0],
                t.lo[i],
                t.hi[i],
            )
            for i in sent
        ]
        if host:  # (jobs hold raw pointers: ``pieces`` lives until the next round has waited)
            pieces = uploaded[:] = engine.host.upload(pieces)
        for i, piece in zip(sent, pieces):
            offset = src + int(cols[int(t.dst[i])]) * word + int(rnd.offset[i])
            copies.add(engine.arena.view(offset, piece.shape, dtype), piece)
        copies.launch()
        exchange()
        width = int(rnd.widths[rank]) * word
        received = np.flatnonzero(t.dst == rank)
        targets = []
        for i in received:
            f = int(t.new_block[i])
            lower = spec.rechunk.new_box(f)[0]
            targets.append(
                outputs[f][tuple(slice(int(l) - o, int(h) - o) for l, h, o in zip(t.lo[i], t.hi[i], lower))]
            )
        downloads = engine.host.downloads(targets) if host and targets else None
        for i, target in zip(received, downloads.device if downloads else targets):
            offset = dst + int(t.src[i]) * width + int(rnd.offset[i])
            copies.add(target, engine.arena.view(offset, target.shape, dtype))
        copies.launch()
        engine._mark("unstage")
        if downloads:  # unstaged on the GPU, then downloaded into the NumPy chunks
            downloads.start()
            engine.rounds.wait(run, dry=True)
            downloads.finish()

    engine.rounds.run(run, len(plans), lambda k: engine.exchange(plans[k], *regions), work)
