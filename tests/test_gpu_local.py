"""A world of one PE (one GPU worker): cufftmp copies every piece from its input chunk straight
into its output chunk in one launch, without the arena's rounds (marker ``gpu``; skipped
without GPUs). Run on the GPU node: ``pytest -q tests/test_gpu_local.py``."""

from __future__ import annotations

import os

import pytest

import conftest
from gpu_helpers import case, layouts_of_a_run
from dask_redist.bench import Case

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def one_gpu():
    """One worker on one GPU (a world of one PE), whatever REDIST_TEST_GPUS / REDIST_TEST_PES say."""
    before = {k: os.environ.get(k) for k in ("REDIST_TEST_GPUS", "REDIST_TEST_PES")}
    os.environ.update(REDIST_TEST_GPUS="1", REDIST_TEST_PES="1")
    try:
        yield from conftest.gpu_client()
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.update({k: v})


def layout_of_a_run(client, c: Case, seed: int, **options) -> str:
    (layout,) = layouts_of_a_run(client, c, seed, **options)  # (one worker)
    return layout


CASES = [
    case((64, 48, 32), (32, 48, 32), (64, 24, 32), name="2 slabs -> 2 slabs"),
    case((64, 48, 32), (8, 48, 32), (64, 6, 32), name="slabs"),
    case((60, 50, 40), (7, 50, 40), (60, 11, 40), name="uneven slabs"),
    case((32, 32, 32), (8, 8, 32), (32, 8, 8), name="pencils"),
    case((64, 48), (8, 48), (64, 6), "float16", name="float16, 2-D"),
    case((40, 30, 20), (5, 30, 20), (40, 3, 20), "complex128", name="complex128"),
    case((1000,), (7,), (33,), "float32", name="1-D uneven"),
]


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_one_pe_copies_chunk_to_chunk(one_gpu, c):
    assert layout_of_a_run(one_gpu, c, 3).startswith("local")


def test_beyond_the_piece_limit_and_in_4_d_the_arena_rounds_run(one_gpu):
    from dask_redist.engines.cufftmp import engine

    four_d = case((12, 10, 8, 6), (3, 10, 8, 6), (12, 10, 2, 6), name="4-D")
    assert not layout_of_a_run(one_gpu, four_d, 4).startswith("local")  # (a job table has 3 axes)
    old = one_gpu.run(lambda: setattr(engine, "LOCAL_MAX_PIECES", 10))
    try:
        assert not layout_of_a_run(one_gpu, CASES[1], 5, memory_budget="64KiB").startswith(
            "local"
        )  # 64 pieces
    finally:
        one_gpu.run(lambda: setattr(engine, "LOCAL_MAX_PIECES", 1 << 16))
    assert old  # (every worker answered)


def test_a_rechunk_run_again_copies_from_the_kept_table(one_gpu):
    """A second run of the same rechunk (fresh input chunks, fresh outputs: other addresses) takes
    its copy jobs from the table the first one built (`PieceJobs`, kept by geometry): values equal
    both times."""
    from dask_redist.engines import loaded_engines

    c = CASES[2]  # uneven slabs
    for seed in (6, 7):
        assert layout_of_a_run(one_gpu, c, seed).startswith("local")
    kept = one_gpu.run(lambda: len(loaded_engines()["cufftmp"].piece_jobs))
    assert all(n >= 1 for n in kept.values()), kept
