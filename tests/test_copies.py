"""The cufftmp engine's parts that run without a GPU.

The folding of box copies into (rows x contiguous bytes) jobs for the GPU's batched copy,
checked on NumPy views, whose strides mean what CuPy's do: a job replayed byte by byte,
as the kernel (dask_redist.engines.copies) does, must copy exactly what
``dst[...] = src`` copies, and touch nothing else. Also the threaded host copies of NumPy
chunks and the bounded plan cache (cuFFTMp faked).
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copy_helpers import Bump, InMemory, copy_rows, random_rechunk, replay_all, write_chunk

from dask_redist.engines.copies import fold


def in_buffer(shape, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A C-ordered array and the bytes under it."""
    buffer = np.zeros(int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return buffer, buffer.view(dtype).reshape(shape)


def address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def replay(job, dst_buffer, dst, src_buffer, src) -> None:
    """A folded copy between two views, each inside its own buffer."""
    copy_rows(
        *job, src_buffer, address(src) - address(src_buffer), dst_buffer, address(dst) - address(dst_buffer)
    )


@st.composite
def boxes(draw):
    """Array shapes for source and destination, one box of each of the same shape, a dtype."""
    ndim = draw(st.integers(1, 4))
    box = [draw(st.integers(1, 5)) for _ in range(ndim)]
    src_shape = [b + draw(st.integers(0, 3)) for b in box]
    dst_shape = [b + draw(st.integers(0, 3)) for b in box]
    at_src = [draw(st.integers(0, n - b)) for n, b in zip(src_shape, box)]
    at_dst = [draw(st.integers(0, n - b)) for n, b in zip(dst_shape, box)]
    dtype = draw(st.sampled_from([np.int8, np.float16, np.float32, np.float64, np.complex128]))
    return box, src_shape, at_src, dst_shape, at_dst, dtype


@settings(max_examples=300, deadline=None)
@given(boxes())
def test_a_folded_copy_copies_what_numpy_copies(case):
    box, src_shape, at_src, dst_shape, at_dst, dtype = case
    src_buffer, src_all = in_buffer(src_shape, dtype)
    src_all[...] = (np.arange(src_all.size) % 127 + 1).reshape(src_shape)
    dst_buffer, dst_all = in_buffer(dst_shape, dtype)
    src = src_all[tuple(slice(a, a + b) for a, b in zip(at_src, box))]
    dst_slices = tuple(slice(a, a + b) for a, b in zip(at_dst, box))
    expected = dst_all.copy()
    expected[dst_slices] = src
    job = fold(dst_all[dst_slices].shape, dst_all[dst_slices].strides, src.strides, src.itemsize)
    if job is None:  # more than two outer axes that cannot merge: the engine falls back to CuPy
        assert sum(1 for b in box if b > 1) >= 3
        return
    replay(job, dst_buffer, dst_all[dst_slices], src_buffer, src)
    np.testing.assert_array_equal(dst_all, expected)


def test_contiguous_and_slab_copies_are_single_rows():
    """The common cases fold to few, long rows: a whole chunk is one row of bytes."""
    a = np.zeros((4, 64, 32))
    assert fold(a.shape, a.strides, a.strides, a.itemsize) == (1, 1, a.nbytes, 0, 0, 0, 0)
    part = a[:, 8:16, :]  # a slab of a slab: 4 rows of 8 x 32 elements
    assert fold(part.shape, part.strides, part.strides, 8)[:3] == (1, 4, 8 * 32 * 8)


@st.composite
def stages(draw):
    """An array of 1-3 axes in chunks, and a box of it (a round's input box)."""
    ndim = draw(st.integers(1, 3))
    chunks = [draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)) for _ in range(ndim)]
    shape = [sum(c) for c in chunks]
    lower = [draw(st.integers(0, n - 1)) for n in shape]
    upper = [draw(st.integers(lo + 1, n)) for lo, n in zip(lower, shape)]
    dtype = draw(st.sampled_from([np.int8, np.float32, np.float64, np.complex128]))
    return chunks, lower, upper, dtype


@settings(max_examples=200, deadline=None)
@given(stages())
def test_a_chunk_table_stages_and_unstages_a_box_as_numpy_does(case):
    from dask_redist.engines.copies import ChunkTable

    chunks, lower, upper, dtype = case
    item = np.dtype(dtype).itemsize
    shape = tuple(sum(c) for c in chunks)
    data = (np.arange(int(np.prod(shape))) % 97 + 1).astype(dtype).reshape(shape)
    bounds = [np.cumsum((0, *c)) for c in chunks]
    grid = [range(len(c)) for c in chunks]
    boxes = [
        (tuple(int(b[i]) for b, i in zip(bounds, idx)), tuple(int(b[i + 1]) for b, i in zip(bounds, idx)))
        for idx in np.ndindex(*[len(g) for g in grid])
    ]
    memory, offset, ptrs = np.zeros(2 * data.nbytes + 64, np.uint8), 0, []
    for lo, hi in boxes:  # every chunk C-contiguous in one byte buffer, then the box
        part = data[tuple(slice(a, b) for a, b in zip(lo, hi))]
        memory[offset : offset + part.nbytes] = np.ascontiguousarray(part).view(np.uint8).ravel()
        ptrs.append(offset)
        offset += part.nbytes
    corners = np.array(boxes, dtype=np.int64)
    table = ChunkTable(corners[:, 0], corners[:, 1], np.array(ptrs, np.int64), item)
    box_shape = tuple(u - lo for lo, u in zip(lower, upper))
    box_at = offset

    replay_all(table.jobs(lower, upper, box_at, into_box=True), memory)
    box = memory[box_at : box_at + int(np.prod(box_shape)) * item].view(dtype).reshape(box_shape)
    np.testing.assert_array_equal(box, data[tuple(slice(a, b) for a, b in zip(lower, upper))])

    memory[:box_at] = 0  # the chunks forget, then get their parts of the box back
    replay_all(table.jobs(lower, upper, box_at, into_box=False), memory)
    for (lo, hi), ptr in zip(boxes, ptrs):
        n = int(np.prod([b - a for a, b in zip(lo, hi)]))
        chunk = memory[ptr : ptr + n * item].view(dtype).reshape([b - a for a, b in zip(lo, hi)])
        want = np.zeros_like(chunk)
        inter_lo = [max(a, b) for a, b in zip(lo, lower)]
        inter_hi = [min(a, b) for a, b in zip(hi, upper)]
        if all(h > l for l, h in zip(inter_lo, inter_hi)):
            sel = tuple(slice(l - o, h - o) for l, h, o in zip(inter_lo, inter_hi, lo))
            want[sel] = data[tuple(slice(l, h) for l, h in zip(inter_lo, inter_hi))]
        np.testing.assert_array_equal(chunk, want)


class EagerCopies:
    """`BoxCopies` as NumPy would do it: each copy at once."""

    def add(self, dst, src) -> None:
        dst[...] = src


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    data=st.data(),
)
def test_a_round_of_box_copies_stages_and_unstages_every_chunk_part(shape, data):
    """`_box_copies` (the copies of a direct round when no job table applies): staging the
    chunks' parts of a box into its arena view gives the box of the whole array; unstaging
    it into empty chunks fills exactly their parts of the box."""
    from dask_redist.engines.cufftmp.direct import _box_copies
    from dask_redist.planning.boxes import Box

    whole = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    cuts = [sorted({0, n, *data.draw(st.lists(st.integers(1, n), max_size=3))}) for n in shape]
    grids = [list(zip(c[:-1], c[1:])) for c in cuts]
    bounds = {}
    for i, corner in enumerate(np.ndindex(*[len(g) for g in grids])):
        bounds[i] = tuple(zip(*[g[j] for g, j in zip(grids, corner)]))
    chunks = {i: whole[Box(*b).slices()].copy() for i, b in bounds.items()}
    lo = [data.draw(st.integers(0, n - 1)) for n in shape]
    box = Box(tuple(lo), tuple(data.draw(st.integers(l + 1, n)) for l, n in zip(lo, shape)))

    staged = np.full(box.shape, -1, dtype=np.int64)
    _box_copies(EagerCopies(), chunks, bounds.__getitem__, staged, box, into_box=True)
    np.testing.assert_array_equal(staged, whole[box.slices()])

    empty = {i: np.full_like(c, -1) for i, c in chunks.items()}
    _box_copies(EagerCopies(), empty, bounds.__getitem__, staged, box, into_box=False)
    for i, b in bounds.items():
        inside = np.zeros(shape, dtype=bool)
        inside[box.slices()] = True
        mask = inside[Box(*b).slices()]
        np.testing.assert_array_equal(empty[i][mask], chunks[i][mask])
        assert (empty[i][~mask] == -1).all()


@settings(max_examples=60, deadline=None)
@given(data=st.data(), threads=st.sampled_from([1, 3]))
def test_host_copies_on_threads_copy_every_part_exactly(data, threads):
    """NumPy parts packed into (and scattered from) a staging buffer by `HostLink`'s threads, in
    slices along the first axis that is not 1: each part equals its source, nothing else written."""
    import dask_redist.engines.cufftmp.host as host

    original, host.SLICE_BYTES = host.SLICE_BYTES, 64  # many slices even for tiny parts
    try:
        parts = []
        for _ in range(data.draw(st.integers(1, 4))):
            shape = tuple(data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)))
            whole = np.arange(int(np.prod(shape)) * 3, dtype=np.int32).reshape(*shape[:-1], shape[-1] * 3)
            parts.append(whole[..., ::3])  # strided, as a chunk's part of a box is
        offsets, total = host._offsets(parts)
        assert all(o % host.ALIGN == 0 for o in offsets) and total >= sum(p.nbytes for p in parts)
        staging = np.full(total, 255, dtype=np.uint8)
        staged = [host._as(staging, o, p.shape, p.dtype) for o, p in zip(offsets, parts)]
        host.HostLink(threads=threads)._copy(list(zip(staged, parts)))
        for s, p in zip(staged, parts):
            np.testing.assert_array_equal(s, p)
        untouched = np.ones(total, dtype=bool)
        for o, p in zip(offsets, parts):
            untouched[o : o + p.nbytes] = False
        assert np.all(staging[untouched] == 255)
        back = [np.zeros_like(p) for p in parts]  # and scattered back into chunks
        host.HostLink(threads=threads)._copy(list(zip(back, staged)))
        for b, p in zip(back, parts):
            np.testing.assert_array_equal(b, p)
    finally:
        host.SLICE_BYTES = original


def _fake_cufftmp(monkeypatch) -> list:
    """``nvmath.bindings.cufftMp`` with a ``destroy_reshape`` that records handles (no GPU)."""
    import sys
    import types

    destroyed = []
    bindings = types.ModuleType("nvmath.bindings")
    bindings.cufftMp = types.SimpleNamespace(destroy_reshape=destroyed.append)
    monkeypatch.setitem(sys.modules, "nvmath", types.ModuleType("nvmath"))
    monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
    return destroyed


def test_cufftmp_keeps_the_most_recently_used_plans(monkeypatch):
    """Reshape plans are made once per geometry and bounded: beyond ``kept``, the least
    recently used are destroyed."""
    from dask_redist.engines.cufftmp.plans import Plans, ReshapePlan

    destroyed = _fake_cufftmp(monkeypatch)
    stats = {"plans": 0, "plan_s": 0.0}
    plans = Plans(stats)
    for k in range(5):
        plans.get(k, lambda k=k: ReshapePlan(handle=100 + k, workspace=0))
    assert plans.get(0, lambda: pytest.fail("made twice")).handle == 100  # used again: the most recent
    plans.forget(3)
    assert len(plans) == 3 and destroyed == [101, 102] and stats["plans"] == 5
    assert plans.get(3, lambda: pytest.fail("made twice")).handle == 103
    plans.forget(0)
    assert len(plans) == 0 and sorted(destroyed) == [100, 101, 102, 103, 104]


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_piece_jobs_copy_every_piece_from_input_to_output_chunk(data):
    """A world of one PE: `piece_jobs` (each old chunk ∩ new chunk straight from its input chunk
    into its output chunk), replayed byte by byte, builds every output chunk as NumPy cuts it."""
    from dask_redist.engines.copies import ChunkTable, piece_jobs
    from dask_redist.planning.plan import pieces

    shape, dtype, spec = random_rechunk(data, 9)
    whole = (np.arange(int(np.prod(shape))) % 113 + 1).astype(dtype).reshape(shape)
    memory = np.zeros(2 * whole.nbytes, np.uint8)
    tables, offset = [], 0
    for chunks, box_of, fill in ((spec.old, spec.old_box, True), (spec.new, spec.new_box, False)):
        n = int(np.prod([len(c) for c in chunks]))
        corners = np.array([box_of(f) for f in range(n)], dtype=np.int64).reshape(n, 2, len(shape))
        ptrs = []
        for lo, hi in corners.tolist():
            part = whole[tuple(slice(a, b) for a, b in zip(lo, hi))]
            if fill:
                memory[offset : offset + part.nbytes] = np.ascontiguousarray(part).view(np.uint8).ravel()
            ptrs.append(offset)
            offset += part.nbytes
        tables.append(
            (ChunkTable(corners[:, 0], corners[:, 1], np.array(ptrs, np.int64), dtype.itemsize), corners)
        )
    (src, _), (dst, out_corners) = tables
    old_flat, new_flat, lo, hi = pieces(spec)
    replay_all(piece_jobs(src, dst, old_flat, new_flat, lo, hi), memory)
    for (lo_, hi_), ptr in zip(out_corners.tolist(), dst.ptrs.tolist()):
        extent = [b - a for a, b in zip(lo_, hi_)]
        got = memory[ptr : ptr + int(np.prod(extent)) * dtype.itemsize].view(dtype).reshape(extent)
        np.testing.assert_array_equal(got, whole[tuple(slice(a, b) for a, b in zip(lo_, hi_))])


def test_piece_jobs_of_slabs_are_a_few_long_rows():
    """Slabs to slabs of a (4, 6, 8) float64 array: each piece is one contiguous row per plane."""
    from dask_redist.engines.copies import ChunkTable, piece_jobs

    old = np.array([[[0, 0, 0], [2, 6, 8]], [[2, 0, 0], [4, 6, 8]]])  # 2 slabs along axis 0
    new = np.array([[[0, 0, 0], [4, 3, 8]], [[0, 3, 0], [4, 6, 8]]])  # 2 slabs along axis 1
    src = ChunkTable(old[:, 0], old[:, 1], np.array([0, 1000]), 8)
    dst = ChunkTable(new[:, 0], new[:, 1], np.array([2000, 3000]), 8)
    lo = np.array([[0, 0, 0], [0, 3, 0], [2, 0, 0], [2, 3, 0]])
    hi = np.array([[2, 3, 8], [2, 6, 8], [4, 3, 8], [4, 6, 8]])
    jobs = piece_jobs(src, dst, [0, 0, 1, 1], [0, 1, 0, 1], lo, hi)
    assert jobs[:, 2].tolist() == [2] * 4 and jobs[:, 3].tolist() == [1] * 4  # 2 planes, rows merged
    assert jobs[:, 4].tolist() == [3 * 8 * 8] * 4  # a plane's part: 3 rows of 8 float64
    assert jobs[:, 0].tolist() == [0, 3 * 64, 1000, 1000 + 3 * 64]  # sources: where the piece starts
    assert jobs[:, 1].tolist() == [2000, 3000, 2000 + 2 * 3 * 64, 3000 + 2 * 3 * 64]


def test_a_chunk_staged_whole_is_one_row_and_a_column_of_a_box_one_row_per_line():
    """Two slabs of a (2, 4, 8) float64 array into the whole array's box: each slab is one
    contiguous row on both sides; a box of half the last axis cuts them into lines."""
    from dask_redist.engines.copies import ChunkTable

    old = np.array([[[0, 0, 0], [1, 4, 8]], [[1, 0, 0], [2, 4, 8]]])
    table = ChunkTable(old[:, 0], old[:, 1], np.array([0, 256]), 8)
    whole = table.jobs((0, 0, 0), (2, 4, 8), 1000, into_box=True)
    assert whole[:, 2:5].tolist() == [[1, 1, 256], [1, 1, 256]]  # (n0, n1, bytes): one row each
    assert whole[:, 0].tolist() == [0, 256] and whole[:, 1].tolist() == [1000, 1256]
    half = table.jobs((0, 0, 0), (2, 4, 4), 1000, into_box=False)
    assert half[:, 2:5].tolist() == [[1, 4, 32], [1, 4, 32]]  # 4 lines of 4 float64 each
    assert half[:, 0].tolist() == [1000, 1128] and half[:, 1].tolist() == [0, 256]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_one_pe_run_copies_every_needed_output_chunk_as_numpy_cuts_it(data):
    """The whole one-PE path (`empty_outputs`, `_local_jobs`: the plan's pieces as jobs relative
    to their chunks, plus the addresses of the chunks the run holds, in whatever order), its jobs
    replayed byte by byte: every needed output chunk equals the array's box. Twice, the second
    run's chunks elsewhere: its jobs come from the first run's table (`PieceJobs`), kept."""
    from types import SimpleNamespace

    from dask_redist.config import Settings
    from dask_redist.core.spec import CollectiveSpec, RunSpec
    from dask_redist.engines.cufftmp.engine import _local_jobs
    from dask_redist.engines.exchange import empty_outputs
    from dask_redist.planning import make_plan

    shape, dtype, rechunk = random_rechunk(data, 8)
    needed = None
    if data.draw(st.booleans()):  # some of the new chunks only (the rest is nobody's output)
        n_new = int(np.prod(rechunk.new_grid))
        needed = np.zeros(n_new, bool)
        needed[data.draw(st.lists(st.integers(0, n_new - 1), min_size=1, max_size=n_new))] = True
        needed = needed.reshape(rechunk.new_grid)
    in_ranks = np.zeros(rechunk.old_grid, np.int64)
    chosen = make_plan(rechunk, in_ranks, 1, needed=needed)
    spec = CollectiveSpec("t" * 32, "in", "out", rechunk, dtype, Settings(), "cupy")
    whole = (np.arange(int(np.prod(shape))) % 113 + 1).astype(dtype).reshape(shape)
    kept = {}
    for seq in (1, 2):
        run_spec = RunSpec(
            spec, seq, seq, ("w",), in_ranks, chosen.out_ranks, chosen.needed, "cufftmp", "cupy"
        )
        memory = np.zeros(2 * whole.nbytes + 64, np.uint8)
        inputs, offset = {}, data.draw(st.integers(1, 32))  # (no chunk at address 0)
        for flat in data.draw(st.permutations(range(int(np.prod(rechunk.old_grid))))):
            inputs[flat], offset = write_chunk(memory, offset, whole, *rechunk.old_box(flat))
        run = SimpleNamespace(spec=run_spec, plan=run_spec.plan, inputs=inputs, rank=0, state="running")
        outputs = empty_outputs(run, Bump(offset))  # (after the inputs in the same buffer)
        assert sorted(outputs) == np.flatnonzero(chosen.needed).tolist()
        replay_all(_local_jobs(run, outputs, kept), memory)
        assert len(kept) == 1  # (the second run's table is the first's)
        for flat, chunk in outputs.items():
            lo, hi = rechunk.new_box(flat)
            assert chunk.shape == tuple(b - a for a, b in zip(lo, hi))
            got = memory[chunk.data.ptr : chunk.data.ptr + int(np.prod(chunk.shape)) * dtype.itemsize]
            want = whole[tuple(slice(a, b) for a, b in zip(lo, hi))]
            np.testing.assert_array_equal(got.view(dtype).reshape(chunk.shape), want)


def test_one_pe_job_tables_are_kept_for_the_most_recent_geometries():
    """`_local_jobs` keeps the tables of the `KEPT_PIECE_JOBS` most recently used geometries, and
    a table used again gets each run's own addresses."""
    from types import SimpleNamespace

    from dask_redist.config import Settings
    from dask_redist.core.spec import CollectiveSpec, RunSpec
    from dask_redist.engines.cufftmp import engine
    from dask_redist.planning import RechunkSpec, make_plan

    def run(n: int, at: int, kept: dict):
        """Two chunks of n float64 merged into one, the chunks at ``at`` and after."""
        rechunk = RechunkSpec(((n, n),), ((2 * n,),), 8)
        spec = CollectiveSpec("t" * 32, "in", "out", rechunk, np.dtype(np.float64), Settings(), "cupy")
        plan = make_plan(rechunk, np.zeros(2, np.int64), 1)
        run_spec = RunSpec(spec, 1, 1, ("w",), plan.in_ranks, plan.out_ranks, plan.needed, "cufftmp", "cupy")
        inputs = {1: InMemory((n,), at + 8 * n), 0: InMemory((n,), at)}
        r = SimpleNamespace(spec=run_spec, plan=run_spec.plan, inputs=inputs, rank=0, state="running")
        jobs = engine._local_jobs(r, {0: InMemory((2 * n,), at + 4096)}, kept)
        assert jobs[:, 0].tolist() == [at, at + 8 * n]
        assert jobs[:, 1].tolist() == [at + 4096, at + 4096 + 8 * n]
        return rechunk

    k, kept = engine.KEPT_PIECE_JOBS, {}
    specs = {n: run(n, 64 * n, kept) for n in range(1, k + 1)}
    run(1, 8, kept)  # used again (other addresses): the most recent now
    specs[k + 1] = run(k + 1, 64, kept)
    assert [key[0] for key in kept] == [specs[n] for n in (*range(3, k + 1), 1, k + 1)]
