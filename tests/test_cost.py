"""The cost model of ``redist.min-bytes: auto`` (`dask_redist.planning.cost`): pure, no timing.

Its decisions are checked against what was measured (the packaged models are fits of recorded
calibration runs, and refitting those files gives them back), its task count against the graphs
Dask builds, its fit against known lines.
"""

from __future__ import annotations

import os

import dask
import dask.array as da
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_redist.bench import calibrate
from dask_redist.bench.cases import gpu_suite, line_case, pencil_case, slab_case
from dask_redist.bench.results import load_json
from dask_redist.config import COST_TERMS, DASK_RECHUNK, DEFAULTS, ConfigError, Settings
from dask_redist.graph.decide import collective_spec
from dask_redist.planning import RechunkSpec
from dask_redist.planning.cost import (
    CostModel,
    dask_rechunk_is_faster,
    dask_tasks,
    fit,
    model_for,
    models,
    nonnegative_fit,
)

DOCS = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks")
PACKAGED = Settings().cost_model


def spec(case) -> RechunkSpec:
    return calibrate.spec(case)


@st.composite
def chunking(draw, n):
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=6)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_dask_tasks_counts_the_tasks_dask_builds(data):
    """`dask_tasks` (from the steps Dask's planner picks, without building them) against the
    tasks of the graph ``x.rechunk(new, method="tasks")`` has."""
    shape = tuple(data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=3)))
    old = tuple(data.draw(chunking(n)) for n in shape)
    new = tuple(data.draw(chunking(n)) for n in shape)
    itemsize = data.draw(st.sampled_from([1, 8]))
    dtype = {1: "u1", 8: "f8"}[itemsize]
    with dask.config.set({"array.chunk-size": data.draw(st.sampled_from(["100B", "1KiB", "128MiB"]))}):
        y = da.zeros(shape, chunks=old, dtype=dtype).rechunk(new, method="tasks")
        counted = dask_tasks(RechunkSpec(old, new, itemsize))
    built = sum(len(layer) for name, layer in y.dask.layers.items() if name.startswith("rechunk-"))
    if old == new:
        built = counted  # (no rechunk at all: nothing to count)
    assert counted == built


def _model(**lines) -> tuple:
    dask_line = lines.get("dask_rechunk", (0.01, 0.001, 0.0))
    collective_line = lines.get("collective", (0.05, 0.0, 0.0001, 0.0))
    return (("m", "numpy", lines.get("workers", 2), "synthetic", dask_line, collective_line),)


def test_model_for_takes_the_kind_measured_on_the_nearest_worker_count():
    entries = (
        ("a", "numpy", 2, "", (0,) * 3, (0,) * 4),
        ("b", "numpy", 8, "", (0,) * 3, (0,) * 4),
        ("c", "cupy", 1, "", (0,) * 3, (0,) * 4),
    )
    pick = {w: model_for(entries, "numpy", w).name for w in (1, 2, 4, 5, 6, 100)}
    assert pick == {1: "a", 2: "a", 4: "a", 5: "b", 6: "b", 100: "b"}  # (5: equally near, the larger)
    assert model_for(entries, "numpy", None).name == "b"
    assert model_for(entries, "cupy", 16).name == "c"
    assert model_for(entries, "cupy", None).name == "c"
    assert model_for(entries[:2], "cupy", 2) is None
    assert (
        dask_rechunk_is_faster(RechunkSpec(((5, 5),), ((10,),), 8), "cupy", entries[:2]) is None
    )  # no model: collective


def test_the_decision_follows_the_estimates_and_says_why():
    rechunk = RechunkSpec(((50, 50), (100,)), ((100,), (50, 50)), 8)  # 2 -> 2 slabs: 6 Dask tasks
    cheap_dask = _model(dask_rechunk=(0.01, 0.001, 0.0), collective=(0.05, 0.0, 0.0, 0.0))
    reason = dask_rechunk_is_faster(rechunk, "numpy", cheap_dask, workers=2)
    assert reason.startswith("Dask's rechunk is estimated faster: 16.0 ms (6 tasks) against 50.0 ms")
    assert "redist.min-bytes: auto" in reason and "cost model m, measured synthetic" in reason
    assert (
        dask_rechunk_is_faster(rechunk, "numpy", _model(dask_rechunk=(0.01, 0.01, 0.0)), workers=2) is None
    )  # 70 ms
    assert dask_rechunk_is_faster(rechunk, "cupy", cheap_dask) is None  # a model of NumPy chunks only


def test_fit_recovers_a_line_and_stays_non_negative():
    cases = [slab_case("1MiB", n) for n in (2, 4, 16, 64)] + [
        line_case("1MiB", 64, 4),
        line_case("8MiB", 4, 64),
    ]
    truth = CostModel("t", "numpy", 2, "", (0.02, 0.003, 2e-9), (0.05, 1e-4, 5e-4, 1e-9))
    runs = {DASK_RECHUNK: [], "collective": []}
    for case in cases:
        d, c = truth.seconds(spec(case))
        runs[DASK_RECHUNK].append((spec(case), d))
        runs["collective"].append((spec(case), c))
    got = fit("t", "numpy", 2, "", runs)
    np.testing.assert_allclose(got.dask_rechunk, truth.dask_rechunk, rtol=1e-6)
    np.testing.assert_allclose(got.collective, truth.collective, rtol=1e-6, atol=1e-12)
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    c = nonnegative_fit(x, np.array([3.0, 2.0, 1.0]))  # a falling line: the slope stays at 0
    assert np.all(c >= 0) and c[1] == 0 and c[0] == pytest.approx(2.0)


#: How each packaged model was fitted: (its calibration file, its cases, {model method: bench method}).
RECIPES = {
    "numpy-2": (
        "calibration-numpy-2.json",
        lambda: calibrate.cases(*calibrate.SIZES["numpy"]),
        calibrate.METHODS,
    ),
    "cupy-1": (
        "gpu-calibration-cupy-1.json",
        lambda: calibrate.cases(*calibrate.SIZES["cupy"]),
        calibrate.METHODS,
    ),
    "cupy-2": (
        "gpu-suite.json",
        lambda: [case for case, _ in gpu_suite()],
        {"collective": "redist-cufftmp", DASK_RECHUNK: "tasks"},
    ),
}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_packaged_models_are_fits_of_recorded_calibration_runs(name):
    """redist.yaml's models are what fitting their recorded runs gives: not numbers set by hand."""
    path, cases, methods = RECIPES[name]
    (packaged,) = [m for m in models(PACKAGED) if m.name == name]
    results, _ = load_json(os.path.join(DOCS, path))
    got = calibrate.model_from(results, cases(), packaged.kind, packaged.workers, packaged.measured, methods)
    np.testing.assert_allclose(got.dask_rechunk, packaged.dask_rechunk, rtol=1e-3)
    np.testing.assert_allclose(got.collective, packaged.collective, rtol=1e-3)
    assert {m.name for m in models(PACKAGED)} == set(RECIPES)


@pytest.mark.parametrize(
    "case, kind, workers, dask_wins",
    [
        (
            line_case("8MB", 100, 4),
            "numpy",
            2,
            True,
        ),  # issue 26: 0.10 s with Dask, 0.18 s with the collective
        (slab_case("1MiB", 2), "numpy", 2, True),  # 2 -> 2 slabs, small: 26 ms with Dask, 45 ms
        (slab_case("1MiB", 256), "numpy", 2, False),
        (slab_case("2GiB", 16), "numpy", 2, False),  # 2.31 s against 2.92 s
        (slab_case("2GiB", 645), "numpy", 2, False),  # 5.33 s against 9.67 s
        (line_case("1MiB", 4, 64), "numpy", 2, False),
        (line_case("8MB", 100, 4), "cupy", 1, True),  # one H200: 21.4 ms with Dask, 27.0 collective
        (slab_case("64MiB", 2), "cupy", 1, False),  # 24.3 ms with Dask, 21.0 ms collective
        (slab_case("8GiB", 16), "cupy", 1, False),  # 174 ms against 35.7 ms
        (slab_case("8GiB", 4096), "cupy", 1, False),
        (slab_case("8GiB", 2), "cupy", 2, False),  # two H200 over TCP: 2.11 s with Dask, 32 ms collective
        (slab_case("1MiB", 2), "cupy", 4, False),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_packaged_models_keep_dask_where_it_was_measured_faster(case, kind, workers, dask_wins):
    rechunk = spec(case)
    reason = dask_rechunk_is_faster(rechunk, kind, PACKAGED, workers)
    assert (reason is not None) == dask_wins, reason
    chunk_type = {"numpy": "numpy.ndarray", "cupy": "cupy.ndarray"}[kind]
    made, why = collective_spec(
        "x", "y", rechunk.old, rechunk.new, np.dtype(case.dtype), chunk_type, Settings(), workers
    )
    assert (made is None) == dask_wins
    assert ("estimated" in why) and ("redist.min-bytes: auto" in why) == dask_wins, why
    made, _ = collective_spec(
        "x", "y", rechunk.old, rechunk.new, np.dtype(case.dtype), chunk_type, Settings(min_bytes=0)
    )
    assert made is not None  # deciding by bytes instead


def test_cupy_rechunks_dask_would_run_as_p2p_stay_with_the_collective():
    """Dask's p2p rechunk fails on CuPy chunks (seen on the GPU node, 2026-12-02: distributed's
    shuffle takes a memoryview of each shard), so neither the cost model nor redist.min-bytes
    hands such a rechunk back to Dask; planned as ``tasks``, the same rechunk goes back."""
    rechunk = spec(line_case("8MB", 100, 4))  # the model keeps Dask's rechunk here (above)
    for config in (Settings(), Settings(min_bytes=2**40)):
        made, why = collective_spec(
            "x", "y", rechunk.old, rechunk.new, np.dtype("float64"), "cupy.ndarray", config, 1, "p2p"
        )
        assert made is not None and "p2p rechunk cannot move CuPy chunks" in why, why
        kept, _ = collective_spec(
            "x", "y", rechunk.old, rechunk.new, np.dtype("float64"), "cupy.ndarray", config, 1, "tasks"
        )
        assert kept is None
    numpy_kept, why = collective_spec(
        "x", "y", rechunk.old, rechunk.new, np.dtype("float64"), "numpy.ndarray", config, 1, "p2p"
    )
    assert numpy_kept is None and "below redist.min-bytes" in why  # (p2p moves NumPy chunks)


def test_pencils_over_two_workers_are_judged_too():
    """Pencils measured slower with the collective on CPU (2 GiB at 4x4: 2.19 against 1.90 s) are
    still the collective's under the model if the model says so; what it says is its estimates."""
    rechunk = spec(pencil_case("2GiB", 4))
    model = model_for(PACKAGED, "numpy", 2)
    dask_s, collective_s = model.seconds(rechunk)
    assert (dask_rechunk_is_faster(rechunk, "numpy", PACKAGED, 2) is None) == (collective_s <= dask_s)


def _cost_config(entry) -> dict:
    config = yaml.safe_load(yaml.safe_dump(DEFAULTS))["redist"]
    config["cost-model"] = {"mine": entry}
    return config


@pytest.mark.parametrize(
    "entry, names",
    [
        ("fast", "redist.cost-model.mine must be a mapping"),
        ({"kind": "tpu", "workers": 2}, "redist.cost-model.mine.kind"),
        ({"kind": "numpy", "workers": 0}, "redist.cost-model.mine.workers"),
        (
            {"kind": "numpy", "workers": 2, "dask-rechunk": {"fixed": 1}},
            "redist.cost-model.mine.dask-rechunk must be a mapping",
        ),
        (
            {
                "kind": "numpy",
                "workers": 2,
                "dask-rechunk": dict.fromkeys(COST_TERMS[DASK_RECHUNK], -1.0),
                "collective": dict.fromkeys(COST_TERMS["collective"], 0.0),
            },
            "redist.cost-model.mine.dask-rechunk.fixed",
        ),
        (  # its old name, named as set
            {"kind": "numpy", "workers": 2, "dask": {"fixed": 1}},
            "redist.cost-model.mine.dask must be a mapping",
        ),
        (
            {"kind": "numpy", "workers": 2, "dask-rechunk": {}, "dask": {}, "collective": {}},
            "redist.cost-model.mine sets both dask-rechunk and dask",
        ),
        (
            {"kind": "numpy", "workers": 2, "colective": {}},
            "redist.cost-model.mine has unknown keys colective",
        ),
    ],
)
def test_a_bad_cost_model_names_its_key(entry, names):
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        Settings.from_config(_cost_config(entry))


def test_a_calibration_file_is_a_dask_config_file_the_settings_read(tmp_path):
    """What `bench --calibrate` writes: dask reads it like any config file; it adds its model to the
    packaged ones (or replaces the one of the same name)."""
    model = CostModel("numpy-3", "numpy", 3, "here, now", (0.1, 0.01, 0.0), (0.0, 0.0, 0.0, 0.0))
    path = calibrate.write_model(model, str(tmp_path))
    config = dask.config.collect([path], env={})
    merged = dask.config.merge(DEFAULTS, config)
    got = {m.name: m for m in models(Settings.from_config(merged["redist"]).cost_model)}
    assert got["numpy-3"] == model and set(got) == {"numpy-3", *RECIPES}
    assert (
        dask_rechunk_is_faster(
            RechunkSpec(((5, 5),), ((10,),), 8), "numpy", Settings.from_config(merged["redist"]).cost_model, 3
        )
        is None
    )


def test_the_old_name_of_dask_rechunks_line_is_still_read(tmp_path):
    """``dask-rechunk`` is the line of Dask's own rechunk; ``dask``, its old name (calibration files
    written before the rename), is read the same, set through dask's config as users do: for a model
    of a new name, and in a file replacing a packaged model (merged into the packaged entry)."""
    line = {"fixed": 0.5, "per-task": 0.25, "per-byte": 0.0}
    collective = dict.fromkeys(COST_TERMS["collective"], 0.125)

    def read(method: str, name: str) -> CostModel:
        entry = {"kind": "numpy", "workers": 3, method: line, "collective": collective}
        with dask.config.set({f"redist.cost-model.{name}": entry}):
            return {m.name: m for m in models(Settings.from_config().cost_model)}[name]

    for name in ("numpy-3", "numpy-2"):  # (numpy-2: merged into the packaged numpy-2)
        new, old = read("dask-rechunk", name), read("dask", name)
        assert new == old and new.dask_rechunk == (0.5, 0.25, 0.0) and new.collective == (0.125,) * 4
        assert new.entry()[DASK_RECHUNK] == line and "dask" not in new.entry()  # (written: the new name)
    path = tmp_path / "redist-cost-model-numpy-2.yaml"  # a file written before the rename
    path.write_text(
        yaml.safe_dump(
            {
                "redist": {
                    "cost-model": {
                        "numpy-2": {"kind": "numpy", "workers": 2, "dask": line, "collective": collective}
                    }
                }
            }
        )
    )
    merged = dask.config.merge(DEFAULTS, dask.config.collect([str(path)], env={}))
    (got,) = [m for m in models(Settings.from_config(merged["redist"]).cost_model) if m.name == "numpy-2"]
    assert got.dask_rechunk == (0.5, 0.25, 0.0)


@pytest.mark.parametrize("value", [None, {}])
def test_no_cost_model_set_as_documented_keeps_the_collective(value):
    """``redist.cost-model: null`` (docs/configuration.md: no model, ``auto`` keeps the collective
    everywhere) set through dask's config or ``enable()``; it was refused as an unknown option."""
    import dask_redist

    rechunk = spec(slab_case("1MiB", 2))  # (the packaged model keeps it for Dask: above)
    for scope in (
        lambda: dask.config.set({"redist.cost-model": value}),
        lambda: dask_redist.enable(cost_model=value),
    ):
        with scope():
            settings = Settings.from_config()
            assert settings.cost_model == ()
            made, why = collective_spec(
                "x", "y", rechunk.old, rechunk.new, np.dtype("float64"), "numpy.ndarray", settings, 2
            )
            assert made is not None, why
    with pytest.raises(ConfigError, match="redist.engines must map engine names"):
        with dask.config.set({"redist.engines": None}):
            Settings.from_config()
