"""dask-redist bench --fft on the session cluster: every method runs and is checked (no timings asserted)."""

from __future__ import annotations

import pytest

from dask_redist.bench import fft as bench_fft


@pytest.mark.parametrize(("n", "pencils"), [(8, (4, 2)), (64, (8, 8)), (1024, (32, 32)), (7, (7, 1))])
def test_pencils(n, pencils):
    assert bench_fft.pencils(n) == pencils


def test_every_method_runs_and_is_checked(client):
    results = bench_fft.run(client, "512KiB", 8, bench_fft.CPU_METHODS, reps=1, kind="numpy")
    assert [r.method for r in results] == [
        "redist-fft",
        "redist-fft-enabled",
        "four-step",
        "four-step-collective",
    ]
    for r in results:
        assert r.error is None and r.correct is True and len(r.times) == 1, r
        assert r.nchunks_in == 8 and r.nchunks_out > 1
