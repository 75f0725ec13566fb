"""A cufftmp run in the direct mapping: each rank's boxes of the array, one reshape per round.

Each round stages this rank's part of its input box into the arena, reshapes (every rank's
input box to every rank's output box), and cuts its output box into the output chunks
(`planning.layout.DirectLayout`). CuPy chunks are copied by job tables, a stage or an unstage
in one launch (`copies.ChunkTable`); NumPy chunks travel through the pinned staging (`.host`).
"""

from __future__ import annotations

from dask_redist.core.assemble import parts_in
from dask_redist.engines.copies import BoxCopies, ChunkTable, launch
from dask_redist.engines.cufftmp.host import HostParts
from dask_redist.planning.boxes import Box
from dask_redist.planning.layout import DirectLayout


def run_direct(engine, run, layout: DirectLayout, outputs) -> None:
    """Queue ``run``'s rounds of a direct layout on ``engine`` (a `CufftMpEngine`)."""
    spec = run.spec.collective
    dtype, rank, nranks = spec.dtype, run.rank, len(run.spec.workers)
    item = spec.rechunk.itemsize
    in_max = max(max(b.size for b in layout.boxes(k)[0]) for k in range(layout.rounds)) * item
    out_max = max(max(b.size for b in layout.boxes(k)[1]) for k in range(layout.rounds)) * item
    plans = []
    for k in range(layout.rounds):  # plan every round first (collective, same order everywhere)
        reshape = layout.reshapes[k]  # (at the origin: rounds of one slab width share a plan)
        boxes = list(zip(reshape.lower.tolist(), reshape.upper.tolist()))
        plans.append(engine.plan(reshape.word, boxes[:nranks], boxes[nranks:], rank))
    regions = engine._regions(in_max, out_max, plans)
    old_box, new_box = spec.rechunk.old_box, spec.rechunk.new_box
    host = run.spec.chunk_type == "numpy"
    tables = (
        None
        if host
        else (
            ChunkTable.of(run.inputs, old_box, item, boxes_of=spec.rechunk.old_boxes),
            ChunkTable.of(outputs, new_box, item, boxes_of=spec.rechunk.new_boxes),
        )
    )

    def work(k, exchange):
        ins, outs = layout.boxes(k)
        b_in, b_out = ins[rank], outs[rank]
        if not host:
            _round(
                engine,
                exchange,
                regions,
                dtype,
                (b_in, run.inputs, old_box),
                (b_out, outputs, new_box),
                tables,
            )
            return
        engine.rounds.wait(
            run, dry=True
        )  # the staging buffers are free once the last round is done: see .host
        up = HostParts(engine.host, run.inputs, old_box, b_in, upload=True)
        down = HostParts(engine.host, outputs, new_box, b_out, upload=False)
        local = (ChunkTable.of(up.device, up.box_of, item), ChunkTable.of(down.device, down.box_of, item))
        stage, unstage = (b_in, up.device, up.box_of), (b_out, down.device, down.box_of)
        _round(engine, exchange, regions, dtype, stage, unstage, local)
        down.downloads.start()
        engine.rounds.wait(run, dry=True)
        down.downloads.finish()

    engine.rounds.run(run, len(plans), lambda k: engine.exchange(plans[k], *regions), work)


def _round(engine, exchange, regions, dtype, stage, unstage, tables) -> None:
    """Queue one round around ``exchange()`` (its reshape): ``stage`` and ``unstage`` are (this
    rank's box, chunks, their bounds by flat index); ``tables`` their `ChunkTable` (None: one
    copy each)."""
    src, dst, _ = regions
    (b_in, inputs, in_box), (b_out, outputs, out_box) = stage, unstage
    if tables[0] is not None and tables[1] is not None:  # every copy of a stage in one launch
        launch(tables[0].jobs(b_in.lower, b_in.upper, engine.arena.ptr + src, into_box=True), engine._keep)
        exchange()
        launch(tables[1].jobs(b_out.lower, b_out.upper, engine.arena.ptr + dst, into_box=False), engine._keep)
        engine._mark("unstage")
        return
    copies = BoxCopies(engine._keep)
    _box_copies(copies, inputs, in_box, engine.arena.view(src, b_in.shape, dtype), b_in, into_box=True)
    copies.launch()
    exchange()
    _box_copies(copies, outputs, out_box, engine.arena.view(dst, b_out.shape, dtype), b_out, into_box=False)
    copies.launch()
    engine._mark("unstage")


def _box_copies(copies: BoxCopies, chunks: dict, box_of, view, box: Box, into_box: bool) -> None:
    """Add a copy between each chunk's part of ``box`` and ``view`` (``box`` in the arena)."""
    for _, part, ours in parts_in(chunks, box_of, box):
        arena = view[part.slices(box.lower)]
        dst, src = (arena, ours) if into_box else (ours, arena)
        copies.add(dst, src)
