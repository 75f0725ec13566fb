"""dask-redist bench --fft on the session cluster: every method runs and is checked (no timings asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from dask_redist.bench import fft as bench_fft


@pytest.mark.parametrize(("n", "pencils"), [(8, (4, 2)), (64, (8, 8)), (1024, (32, 32)), (7, (7, 1))])
def test_pencils(n, pencils):
    assert bench_fft.pencils(n) == pencils


def test_every_method_runs_and_is_checked(client):
    lines = []
    results = bench_fft.run(
        client, "512KiB", 8, bench_fft.CPU_METHODS, reps=1, kind="numpy", say=lines.append
    )
    assert [r.method for r in results] == [
        "redist-fft",
        "redist-fft-enabled",
        "four-step",
        "four-step-collective",
        "floor",
    ]
    for r in results:
        assert r.error is None and r.correct is True and len(r.times) == 1, r
        assert r.nchunks_in == 8 and r.nchunks_out > 1
    # where the time went: the marks of the last collective run (the CPU path's rechunks)
    collective = {"redist-fft", "redist-fft-enabled", "four-step-collective"}
    for r in results:
        marks = [event for _, event in r.timeline or []]
        if r.method in collective:
            assert "scheduler: start sent" in marks and "scheduler: outputs in memory" in marks, r.timeline
        else:
            assert r.timeline is None, r
    # one line per method as it ends (four-step first: the reference), each with its median
    assert [line.split(": ")[1].split()[0] for line in lines] == [
        "four-step",
        *(m for m in bench_fft.CPU_METHODS if m != "four-step"),
    ]
    assert all("median" in line and "right" in line for line in lines), lines


def test_the_four_steps_not_asked_for_run_once_as_the_reference(client):
    """Without ``four-step`` among the methods it still checks the others, run once, untimed, on
    the last repetition's input (at 1024 pencils its four timed runs cost a minute of GPU time)."""
    lines = []
    results = bench_fft.run(client, "512KiB", 8, ["redist-fft"], reps=2, kind="numpy", say=lines.append)
    assert [r.method for r in results] == ["redist-fft"]
    assert results[0].correct is True and len(results[0].times) == 2
    assert lines[0].split(": ")[1] == "four-step untimed, right"


def test_the_input_is_the_same_for_every_method_and_new_per_repetition(client):
    shape, chunks = (6, 5, 4), ((3, 3), (5,), (2, 2))
    a = bench_fft.input_array(client, shape, chunks, "numpy", seed=1).compute()
    b = bench_fft.input_array(client, shape, chunks, "numpy", seed=1).compute()
    c = bench_fft.input_array(client, shape, chunks, "numpy", seed=2).compute()
    assert a.dtype == np.complex128 and a.shape == shape and not a.imag.any()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and len(np.unique(a.real)) == a.size


def test_against_target_relates_the_gpu_path_to_the_whole_array_and_the_floor():
    def row(method, seconds):
        return bench_fft.Result("case", method, 1, 8, 8, times=[seconds])

    rows = [row("redist-fft-gpu", 0.3), row("cupy-whole", 0.1), row("floor", 0.1), row("four-step", 0.6)]
    assert bench_fft.against_target(rows) == (
        "redist-fft-gpu = 1.50 x (cupy-whole + floor), +100.0 ms beyond it (issue 40: at most +5 ms), 0.50 x four-step"
    )
    assert bench_fft.against_target(rows[:2]) is None


def test_a_gpu_transforms_steps_are_noted_only_where_one_ran_during_the_method():
    """`_fft_note`: the slowest worker's time per step of the last GPU transform; a worker whose
    `last fft` is the one it had before the method ran no GPU transform in it (another path)."""
    before = {"w1": {"last fft": {"leg in ms": 1.0, "transforms ms": 2.0}}}
    after = {
        "w1": {"last fft": {"leg in ms": 3.0, "transforms ms": 50.0}},
        "w2": {"last fft": {"leg in ms": 4.0, "transforms ms": 40.0}},
    }
    assert bench_fft._fft_note(after, before) == "leg in ms 4.0, transforms ms 50.0"
    # nothing ran since (the row's runs took the path that runs everywhere): the row says so
    assert bench_fft._fft_note(before, before) == bench_fft.NO_GPU_TRANSFORM
    assert bench_fft._fft_note(None, {}) == bench_fft.NO_GPU_TRANSFORM  # no engine ran at all


def test_the_slab_case_is_issue_40s_array():
    name, shape, chunks = bench_fft.fft_case("8GiB", 16, slabs=True)
    assert shape == (1024, 1024, 512) and chunks == ((64,) * 16, (1024,), (512,)), (shape, chunks)
    assert name == "1024x1024x512 complex128, 16 slabs"
    assert bench_fft.fft_case("8GiB", 16)[1] == (813, 813, 813)  # (pencils of a cube without it)
