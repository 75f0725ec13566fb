"""The benchmark harness on CPU: its cases, its bookkeeping and one real run through the CLI."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dask_redist import bench as b
from dask_redist.cli import main


@pytest.mark.parametrize(
    "case",
    [
        b.slab_case("8MiB", 5),
        b.pencil_case("8MiB", 3),
        b.uneven_case("8MiB"),
        b.four_d_case("8MiB", 4, "float32"),
    ]
    + [case for case, _ in b.gpu_suite()],
    ids=lambda c: c.name,
)
def test_cases_are_valid_rechunks(case):
    for chunks in (case.old, case.new):
        assert tuple(map(sum, chunks)) == case.shape
        assert all(c > 0 for axis in chunks for c in axis)
    assert case.old != case.new
    assert case.nbytes == math.prod(case.shape) * np.dtype(case.dtype).itemsize


def test_uneven_case_is_uneven_and_reproducible():
    case = b.uneven_case("8MiB")
    assert len(set(case.old[0])) > 1 and len(set(case.new[1])) > 1
    assert case == b.uneven_case("8MiB")


def test_gpu_suite_covers_the_cases_the_table_promises():
    names = [case.name for case, _ in b.gpu_suite()]
    assert [n for n in names if n.startswith("slab 8.00 GiB") and "float64" in n] == [
        f"slab 8.00 GiB {n}->{n} float64" for n in (2, 16, 64, 256, 1024)
    ]
    assert "pencil 8.00 GiB 64x64 float64" in names  # 4096 chunks
    ucx = {m for _, ms in b.gpu_suite() for m in ms if m.endswith("-ucx")}
    assert {"redist-cufftmp-ucx", "redist-dask-ucx", "tasks-ucx"} <= ucx  # the UCX-cluster section
    for part in ("1.00 GiB", "32.00 GiB", "float32", "complex128", "pencil", "uneven", "4-D"):
        assert any(part in n for n in names), part
    for _, methods in b.gpu_suite():
        assert {"redist-cufftmp", "tasks-ucx", "ceiling"} <= set(methods)


def test_crossing_bytes_of_a_slab_rechunk_over_two_workers():
    case = b.slab_case(2**24, 4)  # 128^3 float64 = 16 MiB; each worker keeps half of its half
    assert b.crossing_bytes(case, 2) == case.nbytes // 4
    assert b.crossing_bytes(case, 1) == 0


def test_ceiling_row_and_fraction_of_ceiling():
    case = b.slab_case(2**24, 4)
    ceiling = {"peer GB/s per direction": 100.0, "local copy GB/s (read + write)": 1000.0}
    (row,) = _ceiling_only(case, ceiling)
    assert row.times == [pytest.approx(case.nbytes / 4 / 100e9)]
    assert row.row()["of ceiling"] == "100%"


def _ceiling_only(case, ceiling):
    class FakeScheduler:
        @staticmethod
        def identity(n_workers=-1):
            return {"workers": {"a": {}, "b": {}}}

    class FakeClient:  # the ceiling row needs only the worker count
        scheduler = FakeScheduler()

        @staticmethod
        def sync(f, *args, **kwargs):
            return f(*args, **kwargs)

    return b.run_case(FakeClient(), case, ("ceiling",), ceiling=ceiling)


def test_cli_runs_checks_writes_and_appends(tmp_path):
    out = str(tmp_path)
    args = "bench --workers 2 --size 4MiB --chunks 4 --reps 1 --name t".split() + ["--out", out]
    assert main(args + ["--methods", "redist-dask", "tasks", "tasks-ucx", "nvmath"]) == 0
    first = json.loads((tmp_path / "t.json").read_text())
    rows = {r["method"]: r for r in first["results"]}
    assert rows["redist-dask"]["correct"] is True and len(rows["redist-dask"]["times"]) == 1
    assert rows["tasks"]["correct"] is True
    assert rows["nvmath"]["error"] == "the raw Redistribute is timed on CuPy chunks only"
    assert rows["tasks-ucx"]["error"]  # no UCX stack here: the row says why instead of failing the run
    assert main(args + ["--methods", "p2p", "--append"]) == 0
    second = json.loads((tmp_path / "t.json").read_text())
    assert [r["method"] for r in second["results"]] == ["redist-dask", "tasks", "nvmath", "tasks-ucx", "p2p"]
    assert second["command"].count("dask-redist bench") == 2
    results, command = b.load_json(str(tmp_path / "t.json"))
    assert [r.method for r in results] == [r["method"] for r in second["results"]]
    assert command == second["command"]
    md = (tmp_path / "t.md").read_text()
    assert "4->4 float64 | p2p |" in md and "equal" in md


def test_cli_against_a_scheduler_without_workers_says_so():
    """`--scheduler ADDR` whose workers have not joined: a clear message after --wait-workers, no traceback."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, dashboard_address=None) as cluster:
        for command in ("demo", "doctor", "bench"):
            with pytest.raises(SystemExit, match="no worker joined the scheduler") as info:
                main([command, "--scheduler", cluster.scheduler_address, "--wait-workers", "0.5"])
            assert cluster.scheduler_address in str(info.value) and "--wait-workers" in str(info.value)


def test_cli_against_an_address_where_no_scheduler_is_says_so():
    import socket

    with socket.socket() as s:  # a free port, nobody listening
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(SystemExit, match="could not reach a scheduler at " + address):
        main(["doctor", "--scheduler", address, "--wait-workers", "1"])


def test_the_scale_model_measures_every_part_and_fits_growth(tmp_path):
    from dask_redist.bench import scale

    results = scale.run_model(
        ("slab", "uneven"), ranks=(2, 4), chunks=(16, 64, 256), reps=1, progress=lambda _: None
    )
    assert {m.part for m in results} == set(scale.PARTS)
    assert all(m.seconds is not None and m.seconds > 0 and m.peak_bytes >= 0 for m in results)
    slab = [m for m in results if m.case == "slab" and m.part == "scheduler: owners" and m.ranks == 2]
    assert [m.pieces for m in slab] == [16 * 16, 64 * 64, 256 * 256]  # row slabs to column slabs
    exponents = scale.fit(results)
    assert ("slab", "worker: plan", 2) in exponents and all(np.isfinite(k) for k in exponents.values())
    assert (
        main(
            [
                "bench",
                "--scale",
                "--ranks",
                "2",
                "--scale-chunks",
                "16",
                "64",
                "--cases-scale",
                "slab",
                "--reps",
                "1",
                "--out",
                str(tmp_path),
                "--name",
                "s",
            ]
        )
        == 0
    )
    assert "scheduler: owners" in (tmp_path / "s.md").read_text()


def test_protocol_ucx_runs_every_method_on_ucx():
    """`bench --protocol ucx` puts every method on a UCX cluster; by default only ``-ucx`` names go there."""
    import argparse

    from dask_redist.cli.bench import _by_cluster

    plan = [("case", ["redist-dask", "tasks", "tasks-ucx"])]
    ucx = _by_cluster(argparse.Namespace(scheduler=None, protocol="ucx"), plan)
    assert ucx == [("ucx", [("case", ["redist-dask", "tasks", "tasks-ucx"])])]
    tcp = _by_cluster(argparse.Namespace(scheduler=None, protocol="tcp"), plan)
    assert tcp == [("tcp", [("case", ["redist-dask", "tasks"])]), ("ucx", [("case", ["tasks-ucx"])])]


def test_slopes_and_phases_tables():
    """The markdown's per-chunk cost (a line through the medians) and per-phase timeline tables."""
    from dask_redist.bench.harness import Result
    from dask_redist.bench.results import markdown, phases, slopes

    results = [
        Result(f"slab 1.00 MiB {n}->{n} float64", "redist-dask", 2**20, n, n, times=[(10 + 0.5 * n) / 1e3])
        for n in (4, 16, 64)
    ]
    results[-1].timeline = [
        (1.0, "worker 0: first stage"),
        (2.0, "worker 1: first stage"),
        (5.0, "scheduler: run asked"),
        (9.0, "worker 0: executed"),
        (12.0, "worker 1: executed"),
        (14.0, "worker 0: last unpack"),
        (15.0, "worker 1: last unpack"),
        (20.0, "scheduler: outputs in memory"),
    ]
    table = slopes(results)
    assert table[1][3] == "ms per added chunk"
    (row,) = table[2:]
    assert (
        row[:3] == ["slab 1.00 MiB", "redist-dask", "4-64"] and float(row[3]) == 0.5 and float(row[4]) == 10.0
    )
    (phase_row,) = phases(results)[2:]
    assert phase_row[2:] == [
        "",
        "",
        "1.0",
        "5.0",
        "",
        "",
        "12.0",
        "",
        "15.0",
        "20.0",
        "42.0",
    ]  # first stage: earliest; executed, last unpack: latest
    text = markdown(results, {"date": "d", "machine": "m", "workers": 2}, "cmd")
    assert "Cost per added chunk" in text and "Where the time goes" in text
    assert slopes(results[:1]) == [] and phases(results[:1]) == []


def test_slab_cases_give_as_many_chunks_as_asked_beyond_the_cube_side():
    """8 GiB of float64 is a cube of side 1024: 4096 slabs were 1024 (the same case as 1024, so the
    bench kept one row for both). Now a (4096, 4096, 64) array of as many bytes."""
    cases = {n: b.slab_case("8GiB", n) for n in (1024, 4096)}
    assert cases[1024].shape == (1024, 1024, 1024)
    big = cases[4096]
    assert len(big.old[0]) == len(big.new[1]) == 4096 and big.nbytes == 8 * 2**30
    assert big.name == "slab 8.00 GiB 4096->4096 float64" != cases[1024].name
    tiny = b.slab_case("4MiB", 4096)  # below 4096^2 values: one value deep, the name says its size
    assert tiny.shape == (4096, 4096, 1) and tiny.name.startswith("slab 128.00 MiB 4096->4096")
    pencil = b.pencil_case("1MiB", 64)  # a 64^3 cube at least
    assert pencil.shape == (64, 64, 64) and len(pencil.old[0]) == 64 and "2.00 MiB" in pencil.name


def test_bench_plans_each_case_once():
    """Two chunk counts giving the same case (pencils: 1000 and 1024 are both 32x32) run once."""
    import argparse

    from dask_redist.cli.bench import _bench_plan

    args = argparse.Namespace(
        suite=None,
        methods=["floor"],
        size=["8MiB"],
        dtype=["float64"],
        chunks=[1000, 1024, 16],
        cases=["slab", "pencil"],
    )
    names = [case.name for case, _ in _bench_plan(args)]
    assert (
        len(names) == len(set(names)) == 5
    )  # slabs 1000, 1024 (cube side 102: beyond it), 16; pencils 32x32, 4x4


def test_relate_to_floor_gives_each_row_its_chunk_counts_floor():
    rows = [
        b.Result("slab a 4->4", "floor", 1, 4, 4, times=[0.01]),
        b.Result("slab a 4->4", "tasks", 1, 4, 4, times=[0.05]),
        b.Result("slab b 4->4", "tasks", 1, 4, 4, times=[0.02]),  # no floor of its own: the same counts'
        b.Result("slab a 8->8", "tasks", 1, 8, 8, times=[0.05]),  # no floor for 8 chunks
    ]
    b.relate_to_floor(rows)
    assert [r.row()["x floor"] for r in rows] == ["1.00", "5.00", "2.00", ""]
    assert rows[0].row()["GB/s"] == ""  # the floor moves no bytes


def test_floor_layer_is_keyed_like_the_output_and_runs_coroutines(client):
    """The floor's tasks: one per output chunk, keyed like the case's output chunks (grid included),
    coroutines, each reading an input chunk; measured on a real cluster, every value checked."""
    import inspect

    from dask.core import flatten

    from dask_redist.bench.floor import floor_input, floor_layer, measure_floor

    case = b.uneven_case("1MiB")  # 13 input chunks, 11 x 2 output chunks
    x = floor_input(client, case, seed=5)
    y = floor_layer(x, case, seed=5)
    assert y.numblocks == tuple(len(c) for c in case.new)
    layer = y.__dask_graph__().layers[y.name]
    assert len(layer) == math.prod(y.numblocks) == 22
    assert all(inspect.iscoroutinefunction(t.func) and len(t.dependencies) == 1 for t in layer.values())
    assert {d for t in layer.values() for d in t.dependencies} == set(flatten(x.__dask_keys__()))  # all 13
    times, correct = measure_floor(client, case, reps=2)
    assert len(times) == 2 and correct is True


def _fails_on_its_second_chunk(block, block_info=None):
    if block_info[0]["chunk-location"] == (1,):
        raise ValueError("the second chunk failed")
    return block


def test_a_timed_run_whose_chunk_failed_raises_instead_of_giving_a_time(client):
    """``wait`` returns on failed futures too: a run whose collective failed must not be timed."""
    import dask.array as da

    from dask_redist.bench.harness import computed

    y = da.ones(8, chunks=2).map_blocks(_fails_on_its_second_chunk, dtype=float).persist()
    with pytest.raises(ValueError, match="the second chunk failed"):
        computed(client, y, "numpy")
    computed(client, da.ones(8, chunks=2).persist(), "numpy")  # (all done: returns)


def test_cli_floor_rows(tmp_path):
    """`--methods floor tasks`: a floor row per case, and every row as a multiple of it."""
    out = str(tmp_path)
    args = "bench --workers 2 --size 1MiB --chunks 4 --reps 1 --name f --methods floor tasks".split()
    assert main(args + ["--out", out]) == 0
    rows = {r["method"]: r for r in json.loads((tmp_path / "f.json").read_text())["results"]}
    assert rows["floor"]["correct"] is True and len(rows["floor"]["times"]) == 1
    assert rows["tasks"]["floor_s"] == rows["floor"]["median"]
    assert "| x floor |" in (tmp_path / "f.md").read_text()


def test_the_enabled_row_says_what_the_cost_model_ran(client):
    """``enabled`` is a user's ``enable()``: a rechunk the cost model leaves to Dask and one it
    gives the collective, each row checked against NumPy and its note naming what ran."""
    import dask

    case = b.slab_case("1MiB", 2)
    for min_bytes, ran in (("auto", "Dask's rechunk"), (0, "the collective")):
        with dask.config.set({"redist.min-bytes": min_bytes}):
            (row,) = b.run_case(client, case, ("enabled",), reps=1)
        assert row.correct is True and len(row.times) == 1
        assert row.note == f"enable() ran {ran}"
        assert (row.timeline is None) is (ran == "Dask's rechunk")
        if row.timeline:  # the graph's arrival and its tasks (distributed's events), then the stages
            first = {e: t for t, e in reversed(row.timeline)}
            stage = min(t for e, t in first.items() if e.endswith(": first stage"))
            assert 0 <= first["scheduler: graph in"] <= first["scheduler: tasks created"] <= stage


@pytest.fixture
def gpu_client():
    import conftest

    yield from conftest.gpu_client()


@pytest.mark.gpu
def test_floor_on_cupy_chunks(gpu_client):
    """`bench --gpu --methods floor`: the floor's chunks are CuPy arrays on the workers."""
    from dask_redist.bench.floor import floor_input, measure_floor

    case = b.slab_case("8MiB", 16)
    x = floor_input(gpu_client, case, seed=3, kind="cupy")
    assert type(x.blocks[0, 0, 0].compute()).__module__.startswith("cupy")
    times, correct = measure_floor(gpu_client, case, reps=2, kind="cupy")
    assert len(times) == 2 and correct is True


@pytest.mark.slow
def test_cli_calibrate_writes_a_model_the_settings_read(cluster, tmp_path):
    """`bench --calibrate`: both methods on every calibration case, each result checked, and a dask
    config file whose model `Settings` reads (named by kind and worker count)."""
    import dask

    from dask_redist.config import DEFAULTS, Settings
    from dask_redist.planning.cost import models

    out = str(tmp_path)
    assert (
        main(
            [
                "bench",
                "--calibrate",
                "--scheduler",
                cluster.scheduler_address,
                "--size",
                "64KiB",
                "256KiB",
                "--reps",
                "1",
                "--out",
                out,
                "--name",
                "cal",
            ]
        )
        == 0
    )
    rows = json.loads((tmp_path / "cal.json").read_text())["results"]
    assert {r["method"] for r in rows} == {"redist-auto", "tasks"} and all(r["correct"] for r in rows)
    nworkers = len(cluster.workers)
    path = tmp_path / f"redist-cost-model-numpy-{nworkers}.yaml"
    merged = dask.config.merge(DEFAULTS, dask.config.collect([str(path)], env={}))
    (model,) = [m for m in models(Settings.from_config(merged["redist"]).cost_model) if m.workers == nworkers]
    assert (
        model.kind == "numpy"
        and "workers, dask" in model.measured
        and all(v >= 0 for v in model.dask_rechunk + model.collective)
    )
    with pytest.raises(SystemExit, match="two --size values"):
        main(["bench", "--calibrate", "--scheduler", cluster.scheduler_address, "--size", "64KiB"])


# -- bench --pipeline ------------------------------------------------------------------------


def test_the_weather_case_is_daily_chunks_to_long_time_series():
    from dask_redist.bench.pipeline import weather_case

    era5 = weather_case("36.4GB", 8760)  # dask#11162's year of hourly fields
    assert era5.shape == (8760, 721, 1440) and era5.dtype == "float32"
    assert era5.old == ((1,) * 8760, (721,), (1440,))
    assert era5.new[0] == (8760,) and len(era5.new[1]) * len(era5.new[2]) == 8760
    small = weather_case("256KiB", 4)
    assert small.nbytes <= 256 * 1024 and tuple(map(len, small.new)) == (1, 2, 2)


def test_every_pipeline_gives_its_rows_checked(client):
    """`bench --pipeline`: per pipeline, without / with / tasks rows, and once per input case the
    bare rechunk and Dask's floor, every one timed and checked; the summary says what the
    rechunk adds. No timings asserted."""
    from dask_redist.bench import pipeline as p

    lines, shared, results = [], {}, []
    opts = p.Options(engine="dask", reps=1)
    for name in p.PIPELINES:
        results += p.run_pipeline(client, name, "256KiB", 4, opts, shared, say=lines.append)
    by = {(r.case.split(": ")[0], r.method): r for r in results}
    for name in p.PIPELINES:
        for method in ("without", "with", "tasks"):
            r = by[(name, method)]
            assert r.error is None and r.correct is True and len(r.times) == 1, r
            assert r.tasks > 0, r
        assert by[(name, "with")].note == "enable() ran the collective"
    bare_floor = [r for r in results if r.method in ("bare", "floor")]
    assert len(bare_floor) == 2 * 4  # four: float64 slabs, complex128 slabs, weather, fftn's own bare row
    assert all(r.correct is True and len(r.times) == 1 for r in bare_floor), bare_floor
    whole = [r for r in results if r.method == "whole"]  # fftn's transform in one call, no Dask
    assert [(r.case, len(r.times), r.error) for r in whole] == [
        (p.pipeline_case("fftn", "256KiB", 4).name, 1, None)
    ]
    rows = p.summary(results)
    assert [row["pipeline"] for row in rows] == list(p.PIPELINES)
    for row in rows:
        assert all(row[k].endswith(" ms") for k in ("without", "with", "adds", "bare", "floor", "tasks")), row
        assert row["checked"] == "equal", row
        assert row["whole"].endswith(" ms") == (row["pipeline"] == "fftn"), row
    assert len(lines) == len(results)


def test_the_fftn_pipeline_transforms_issue_40s_shape_without_large_prime_factors():
    """``fftn``'s input is the 3-D FFT case of `bench --fft --fft-slabs`, ``(2n, 2n, n)``, its
    ``n`` a length without a prime factor above 5 (a cube of 8 GiB complex128 would be 813 =
    3 x 271 on a side, a length cuFFT transforms with Bluestein's algorithm)."""
    from dask_redist.bench import pipeline as p
    from dask_redist.bench.fft import smooth

    case = p.pipeline_case("fftn", "8GiB", 16)
    assert case.shape == (1024, 1024, 512) and case.nbytes == 8 * 2**30
    assert tuple(map(len, case.old)) == (16, 1, 1) and tuple(map(len, case.new)) == (1, 16, 1)
    assert p.pipeline_case("fftn", "256MiB", 16).shape == (320, 320, 160)  # (the cube root: 161 = 7 x 23)
    assert [smooth(n) for n in (1, 7, 161, 271, 512, 813)] == [1, 6, 160, 270, 512, 810]


@given(st.integers(1, 5000))
def test_smooth_is_the_nearest_length_without_a_prime_factor_above_5(n):
    from dask_redist.bench.fft import smooth

    def largest_prime_factor(m):
        largest, p = 1, 2
        while p * p <= m:
            while m % p == 0:
                largest, m = p, m // p
            p += 1
        return max(largest, m)

    def is_smooth(m):
        return m >= 1 and largest_prime_factor(m) <= 5

    m = smooth(n)
    assert is_smooth(m)
    assert not any(is_smooth(k) for k in range(n - abs(n - m) + 1, n + abs(n - m)) if k != m)
    assert m <= n or not is_smooth(2 * n - m)  # (of two as near, the shorter)


@pytest.mark.parametrize("pipeline", ["elementwise", "fft", "weather", "fftn"])
def test_a_wrong_result_fails_its_row(client, monkeypatch, pipeline):
    """A pipeline whose rechunked (``fftn``: transformed) result is off (here: one added after
    that step) is WRONG."""
    from dask_redist.bench import pipeline as p

    build = p.build

    def off(pipeline, case, x, token, rechunk, method=None):
        y = build(pipeline, case, x, token, rechunk, method)
        return y + 1 if rechunk else y

    monkeypatch.setattr(p, "build", off)
    shared = {p.pipeline_case(pipeline, "256KiB", 4).name: []}  # (no bare rechunk, no floor)
    rows = p.run_pipeline(client, pipeline, "256KiB", 4, p.Options(reps=1, tasks_up_to=0), shared)
    correct = {r.method: r.correct for r in rows}
    assert correct == {"without": True, "with": False}, rows
    assert p.summary(rows)[0]["checked"] == "WRONG" and p.summary(rows)[0]["tasks"] == "skipped"


def test_the_fft_pipeline_without_the_rechunk_does_the_same_transforms_and_is_checked(client, monkeypatch):
    """``without`` transforms along axis 1, as long as the axis ``with`` transforms after the
    rechunk (along axis 0 within each slab it was a sixteenth as long at 16 chunks), and its
    values are checked: a transform along axis 0 instead is WRONG."""
    import dask.array as da

    from dask_redist.bench import pipeline as p
    from dask_redist.bench import pipeline_cases as steps

    case = p.pipeline_case("fft", "256KiB", 4)
    assert case.shape[0] == case.shape[1]
    seen = []

    def recording(block):
        seen.append(block.shape)
        return steps._fft0(block)

    x = da.zeros(case.shape, chunks=case.old, dtype=case.dtype)
    monkeypatch.setattr(steps, "_fft1", recording)
    p.build("fft", case, x, 0, rechunk=False).compute(scheduler="sync")
    assert seen and all(shape[1] == case.shape[0] for shape in seen)

    shared = {case.name: []}
    rows = p.run_pipeline(client, "fft", "256KiB", 4, p.Options(reps=1, tasks_up_to=0), shared)
    assert {r.method: r.correct for r in rows} == {"without": False, "with": True}, rows


def test_a_pipeline_bench_stops_when_its_cluster_lost_a_worker_for_good_keeping_what_ran(
    monkeypatch, tmp_path, capsys
):
    """A worker that closed and did not come back (2026-12-06, one H100: the bench then waited
    until its command was killed): the next run waits `WORKERS_BACK_S`, then the bench stops,
    says where and why, and writes the rows measured so far; its exit status is 1."""
    import contextlib

    from distributed import Client, LocalCluster

    from dask_redist.bench import pipeline as p
    from dask_redist.cli import parser

    monkeypatch.setattr(p, "WORKERS_BACK_S", 1.0)
    real = p._one_run

    def then_lose_a_worker(client, pipeline, case, method, r, opts, timed):
        real(client, pipeline, case, method, r, opts, timed)
        if method == "without" and timed:  # (its only timed run: reps=1)
            cluster.scale(1)
            while len(client.scheduler_info()["workers"]) > 1:
                time.sleep(0.05)

    @contextlib.contextmanager
    def connect(args):
        with Client(cluster) as client:
            client.wait_for_workers(2)
            yield client

    monkeypatch.setattr(p, "_one_run", then_lose_a_worker)
    args = parser().parse_args(
        "bench --pipeline --pipelines elementwise reduction --size 256KiB --chunks 4 --reps 1 "
        f"--tasks-up-to 0 --engine dask --out {tmp_path} --name lost".split()
    )
    with LocalCluster(n_workers=2, processes=False, dashboard_address=None) as cluster:
        assert p.main(args, "dask-redist bench --pipeline", connect, lambda rows, title="": None) == 1
    out = capsys.readouterr().out
    assert "dask-redist bench: stopped at elementwise, 4 chunks: the cluster has 1 of the 2 workers" in out, (
        out
    )
    rows = json.loads((tmp_path / "lost.json").read_text())["results"]
    assert [(r["method"], len(r["times"]), r["correct"]) for r in rows] == [("without", 1, True)]


def test_a_cluster_started_here_fails_a_task_no_worker_can_run(monkeypatch):
    """The CLI's local clusters set distributed's no-workers timeout: a task pinned to a worker
    that is gone fails instead of waiting for good."""
    from distributed.scheduler import NoValidWorkerError

    from dask_redist.cli import clusters, parser

    monkeypatch.setattr(clusters, "NO_WORKERS_TIMEOUT", "1s")
    args = parser().parse_args(["bench", "--workers", "1"])
    with clusters.client_for(args) as client:
        gone = client.submit(
            math.sqrt, 4, workers=["tcp://127.0.0.1:9"], allow_other_workers=False, pure=False
        )
        with pytest.raises(NoValidWorkerError):
            gone.result(timeout=60)
        assert client.submit(math.sqrt, 4).result(timeout=60) == 2


def test_cli_pipeline_writes_markdown_and_json(tmp_path):
    args = "bench --pipeline --workers 2 --size 256KiB --chunks 4 --reps 1 --engine dask --name p"
    args = args.split() + [
        "--pipelines",
        "elementwise",
        "reduction",
        "--tasks-up-to",
        "0",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert [row["pipeline"] for row in data["pipelines"]] == ["elementwise", "reduction"]
    assert {r["method"] for r in data["results"]} == {"without", "with", "bare", "floor"}
    assert all(r["correct"] is True for r in data["results"])
    md = (tmp_path / "p.md").read_text()
    assert md.startswith("Command: `dask-redist bench --pipeline") and "Date: " in md
    assert "| elementwise | slab" in md and "skipped" in md


def test_the_pipeline_summary_relates_the_rows_and_gives_the_gpu_time():
    """One summary row per pipeline and chunk count: what the rechunk adds (medians), the bare
    rechunk and the floor of its input, and where cufftmp kept statistics, its GPU ms."""
    from dask_redist.bench import pipeline as p

    case = "slab 8.00 GiB 16->16 float64"
    stats = {
        "w": {"last": {"layout": "slabs", "rounds": 1, "stage ms": 1.0, "reshape ms": 5.0, "unstage ms": 2.0}}
    }

    def row(name, method, times, **kw):
        return p.PipelineResult(name, method, 1, 16, 16, times=times, correct=True, **kw)

    rows = [
        row(
            f"elementwise: {case}",
            "without",
            [0.030, 0.040, 0.050],
            tasks=16,
            peak_gpu_bytes={"w": 3 * 2**30},
        ),
        row(f"elementwise: {case}", "with", [0.100, 0.090], tasks=34, engine_stats=stats),
        row(case, "bare", [0.060], engine_stats=stats, peak_gpu_bytes={"w": 2**30, "v": 2**31}),
        row(case, "floor", [0.020]),
    ]
    (s,) = p.summary(rows)
    assert (s["without"], s["with"], s["adds"], s["bare"], s["floor"]) == (
        "40.0 ms",
        "95.0 ms",
        "55.0 ms",
        "60.0 ms",
        "20.0 ms",
    )
    assert s["tasks"] == "skipped" and s["GPU ms (with / bare)"] == "8.0 / 8.0" and s["checked"] == "equal"
    assert s["task count (without / with / tasks)"] == "16 / 34 / -"
    assert s["GPU mem + (without / with / bare)"] == "3.00 GiB / - / 2.00 GiB"  # (the busiest worker's)
    (cpu,) = p.summary(rows[1:2] + [row(case, "bare", [0.06])])  # none measured (NumPy): empty
    assert cpu["GPU mem + (without / with / bare)"] == "", cpu
    rows[2].gpu_cached_bytes = {"w": 0, "v": 2**29}  # (every row: the busiest worker's, and its cached)
    assert rows[2].row()["GPU mem +"] == "2.00 GiB (512.00 MiB of it cached free)"
    rows[2].gpu_array_peak_bytes = {"w": 2**30, "v": 3 * 2**29}
    assert (
        rows[2].row()["GPU mem +"]
        == "2.00 GiB (512.00 MiB of it cached free; CuPy arrays at most 1.50 GiB more)"
    )
    assert rows[0].row()["GPU mem +"] == "3.00 GiB" and rows[1].row()["GPU mem +"] == ""
    md = p.markdown(rows, {"date": "d", "machine": "m", "workers": 1}, "dask-redist bench --pipeline")
    assert md.startswith("Command: `dask-redist bench --pipeline`") and "| elementwise | slab 8.00 GiB" in md
    assert "reshape ms 5.00" in md  # every row's note: the engine's last run


@pytest.mark.gpu
def test_every_pipeline_on_cupy_chunks(gpu_client):
    """`bench --pipeline --gpu`: the pipelines on CuPy chunks (CuPy's FFT and RandomState in the
    graph, the checks' values brought to the host), every row checked but ``whole`` (fftn in one call,
    no Dask: a time only), with the engine's GPU ms."""
    from dask_redist.bench import pipeline as p

    shared, results = {}, []
    for name in p.PIPELINES:
        results += p.run_pipeline(
            gpu_client, name, "8MiB", 16, p.Options(kind="cupy", reps=1), shared, say=lambda _: None
        )
    checked = [r for r in results if r.method != "whole"]
    assert all(r.error is None and r.correct is True for r in checked), [
        r for r in checked if r.error or not r.correct
    ]
    whole = [r for r in results if r.method == "whole"]  # fftn's transform in one call, no Dask
    assert [(r.case, len(r.times), r.error) for r in whole] == [
        (p.pipeline_case("fftn", "8MiB", 16).name, 1, None)
    ]
    withs = [r for r in results if r.method == "with"]
    assert len(withs) == len(p.PIPELINES)
    for r in withs:  # (the collective or Dask's rechunk, as enable()'s cost model chose)
        assert r.note.startswith("enable() ran"), r
    assert all(row["checked"] == "equal" for row in p.summary(results))
    workers = set(gpu_client.scheduler_info()["workers"])
    for r in results:  # the GPU memory each method's warm-up added on each worker (CuPy's pool keeps it)
        if r.method in ("without", "with", "bare"):
            assert r.peak_gpu_bytes is not None and set(r.peak_gpu_bytes) == workers, r
            assert set(r.gpu_cached_bytes) == workers and min(r.gpu_cached_bytes.values()) >= 0, r
            assert set(r.gpu_array_peak_bytes) == workers, r
    (elementwise,) = [r for r in results if r.case.startswith("elementwise") and r.method == "without"]
    # the pool grew (by whole blocks: what it kept from the input may serve some of the outputs),
    # and the arrays held as the watch stopped are at least the outputs, each worker its share
    assert max(elementwise.peak_gpu_bytes.values()) > 0
    assert max(elementwise.gpu_array_peak_bytes.values()) >= elementwise.nbytes // len(workers)
    assert all(row["GPU mem + (without / with / bare)"].count("B") == 3 for row in p.summary(results))


def test_a_peak_watch_keeps_the_highest_reading_until_stopped():
    """`gpu_state.PeakWatch` (what a warm-up's CuPy arrays held at most, on a GPU): the highest of
    readings taken on its own thread, the last one at `stop`; after that it reads nothing more."""
    from dask_redist.bench.gpu_state import PeakWatch

    held, reads = [5], []

    def read():
        reads.append(sum(held))
        return reads[-1]

    watch = PeakWatch(read, every=0.001)
    assert watch.first == 5
    held.append(100)  # a peak the watch must see while it lasts
    deadline = time.monotonic() + 10
    while watch.peak < 105 and time.monotonic() < deadline:
        time.sleep(0.001)
    held[1:] = [20]
    assert watch.stop() == 105 and reads[-1] == 25
    n = len(reads)
    time.sleep(0.02)
    assert len(reads) == n  # stopped
    assert PeakWatch(read, limit=0.0).stop() == 25  # (a watch past its limit still reads at stop)


def test_a_rows_note_says_how_much_of_the_peers_memory_its_ranks_mapped():
    """The peers path's stats per worker: the note gives the most any rank mapped, then the
    slowest rank's steps."""
    peers = {"layout": "peers", "rounds": 1, "all-gathers": "files"}
    stats = {
        "a": {"last": {**peers, "mapped MiB": 512.0, "steps ms": {"map": 1.5, "copy": 3.0}}},
        "b": {"last": {**peers, "mapped MiB": 8192.0, "steps ms": {"map": 42.0, "copy": 2.0}}},
    }
    note = b.Result("c", "redist", 1, 16, 16, engine_stats=stats)._engine_note()
    assert note == (
        "peers, 1 round(s); mapped up to 8192 MiB of peers' memory; "
        "slowest rank's steps ms (all-gathers through files): map 42.00, copy 3.00"
    )
