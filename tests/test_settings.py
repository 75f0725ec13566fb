"""The ``redist.*`` settings as a user meets them: checked on the client whichever way they were
set, with a short error naming the key, and there even where dask's config lost them."""

from __future__ import annotations

import copy
import subprocess
import sys

import dask
import pytest

import dask_redist
from dask_redist.config import Settings
from dask_redist.graph.optimize import CollectiveOptimizer


def test_settings_fall_back_to_the_packaged_defaults_where_dask_lost_them():
    """distributed's test utilities restore a config copied before dask_redist was imported (issue
    26, item 9): enable() raised KeyError: 'redist'."""
    code = (
        "import distributed.utils_test as ut, dask, dask_redist\n"
        "ut.reset_config()\n"
        "assert dask.config.get('redist', None) is None\n"
        "dask_redist.enable()\n"
        "print(dask_redist.Settings.from_config() == dask_redist.Settings(), dask.config.get('redist.engine'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "auto"]


def test_keys_dask_lost_one_by_one_are_read_from_the_packaged_defaults():
    saved = copy.deepcopy(dask.config.config)
    try:
        del dask.config.config["redist"]["timeouts"]["barrier"]
        del dask.config.config["redist"]["engine"]
        with dask.config.set({"redist.min-bytes": 0}):
            settings = Settings.from_config()
        assert settings.barrier_timeout == 60.0 and settings.engine == "auto" and settings.min_bytes == 0
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)


def test_settings_follow_every_change_of_the_config_and_a_bad_one_fails_each_time():
    """`Settings.from_config` keeps its recent reads (by the config's text): a change, made any way
    and undone, is read at once; a bad value is never kept and fails every read."""
    base = Settings.from_config()
    for _ in range(2):
        with dask.config.set({"redist.retries": 7, "redist.nvshmem.shared-gpu-max-chunks": 9}):
            assert (Settings.from_config().retries, Settings.from_config().section("nvshmem")) == (
                7,
                {
                    "symmetric-size": None,
                    "exit-when-stuck": True,
                    "shared-gpu-copies": True,
                    "shared-gpu-max-chunks": 9,
                },
            )
        assert Settings.from_config() == base
    saved = copy.deepcopy(dask.config.config)
    try:
        dask.config.config["redist"]["retries"] = 5  # (changed in place, not through set)
        assert Settings.from_config().retries == 5
        dask.config.config["redist"]["retries"] = -1
        for _ in range(2):
            with pytest.raises(dask_redist.ConfigError, match="redist.retries"):
                Settings.from_config()
    finally:
        dask.config.config.clear()
        dask.config.config.update(saved)
    assert Settings.from_config() == base


def test_a_preload_that_cannot_enable_says_so(cluster):
    from distributed import Client

    with dask.config.set({"distributed.client.preload": ["dask_redist.preload"], "redist.engine": "mpi"}):
        with pytest.warns(
            RuntimeWarning, match="could not turn the collective on: ConfigError: redist.engine"
        ):
            with Client(cluster, set_as_default=False):
                pass
    assert not isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)
    assert dask_redist.api._enabled == []


def test_a_preload_given_an_enabled_that_is_not_true_or_false_says_so(cluster):
    """``redist.enabled`` is true or false (docs/configuration.md); ``DASK_REDIST__ENABLED=maybe`` used
    to turn the collective on without a word. The preload now says so and leaves it off."""
    from distributed import Client

    with dask.config.set({"distributed.client.preload": ["dask_redist.preload"], "redist.enabled": "maybe"}):
        with pytest.warns(
            RuntimeWarning,
            match="could not turn the collective on: ConfigError: redist.enabled must be true or false, got 'maybe'",
        ):
            with Client(cluster, set_as_default=False):
                assert not isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)
    assert dask_redist.api._enabled == []


def _bad_in_config(how: str, tmp_path):
    """A context in which ``redist.*`` holds a bad value, set ``how`` a user would."""
    if how == "dask.config.set":
        return dask.config.set({"redist.engine": "bogus"})
    if how == "unknown key":
        return dask.config.set({"redist.memory_budgit": "2GiB"})
    if how == "yaml":
        (tmp_path / "redist.yaml").write_text("redist:\n  engine: bogus\n")
        collected = dask.config.collect(paths=[str(tmp_path)], env={})
    else:  # environment, as dask reads it at import
        collected = dask.config.collect(paths=[], env={"DASK_REDIST__MEMORY_BUDGET": "lots"})
    return _config_updated(collected)


class _config_updated:
    def __init__(self, new: dict):
        self.new, self.saved = new, None

    def __enter__(self):
        self.saved = copy.deepcopy(dask.config.config)
        dask.config.update(dask.config.config, self.new)

    def __exit__(self, *exc):
        dask.config.config.clear()
        dask.config.config.update(self.saved)


MESSAGES = {
    "dask.config.set": r"redist\.engine must be auto, an engine of redist\.engines \(dask, cufftmp, hybrid\) or 'package\.module:EngineClass', got 'bogus'",
    "unknown key": r"unknown option redist\.memory-budgit \(did you mean redist\.memory-budget\?\)",
    "yaml": r"redist\.engine must be auto, an engine of redist\.engines \(dask, cufftmp, hybrid\) or 'package\.module:EngineClass', got 'bogus'",
    "environment": r"redist\.memory-budget must be a size like '1GiB', got 'lots'",
}


def _one_short_config_error(excinfo, capfd, client, name: str) -> None:
    error = excinfo.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__), repr(error)
    assert len(excinfo.traceback) <= 12, str(excinfo.getrepr())
    err = capfd.readouterr().err
    assert "Logging error" not in err and "serialize" not in err, err[-3000:]
    held = client.run_on_scheduler(lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks])
    assert not [k for k in held if name in k], "something was submitted"


@pytest.mark.parametrize("how", list(MESSAGES))
def test_a_bad_setting_after_enable_is_one_short_config_error_before_anything_is_sent(
    client, how, tmp_path, capfd
):
    """Issue 26 item 2: a bad value set after enable() was raised while the graph was pickled,
    under ~100 lines of logging errors and a TypeError."""
    import dask.array as da

    x = da.random.random((64, 64), chunks=(8, 64))
    with dask_redist.enable():
        with _bad_in_config(how, tmp_path):
            y = x.rechunk((64, 8))
            for submit in (y.compute, y.persist, lambda: client.compute(y)):
                with pytest.raises(dask_redist.ConfigError, match=MESSAGES[how]) as excinfo:
                    submit()
                _one_short_config_error(excinfo, capfd, client, y.name)
        assert (y.compute() == x.compute()).all()  # (the same array, the setting gone)


@pytest.mark.parametrize("how", list(MESSAGES))
def test_a_bad_setting_before_enable_is_raised_by_enable(how, tmp_path):
    before = list(dask_redist.api._enabled)
    try:
        with _bad_in_config(how, tmp_path):
            with pytest.raises(dask_redist.ConfigError, match=MESSAGES[how]) as excinfo:
                dask_redist.enable()
        assert len(excinfo.traceback) <= 6 and excinfo.value.__cause__ is None
        assert dask_redist.api._enabled == before
    finally:
        for handle in [h for h in dask_redist.api._enabled if h not in before]:
            dask_redist.disable(handle)


def _fails(y, client, how: str):
    """``y`` computed where it fails (an engine that fails on rank 0; one the workers cannot load is
    refused before anything is submitted); ``future``: a Future of it is kept, and with it the
    erred keys on the scheduler."""
    timeouts = {"collective": "20s", "barrier": "20s"}
    with dask_redist.enable(engine="engines:FailingEngine", timeouts=timeouts):
        if how == "future":
            future = client.compute(y)
            assert "injected failure on rank 0" in str(future.exception(timeout=60))
            return future
        with pytest.raises(dask_redist.RedistError, match="injected failure on rank 0"):
            y.compute()


@pytest.mark.parametrize("how", ["future", "compute"])
def test_a_retry_with_other_settings_or_after_disable_gets_a_fresh_run(client, how):
    """Issue 26 item 8: the output keys are Dask's whatever the settings; right after a failure
    (the Client's release of the failed keys reaches the scheduler after a graph submitted at
    once) or while a Future of it is kept, the same rechunk submitted with another engine, or
    after disable(), got the old error. Now the erred keys are cancelled first: a fresh run."""
    import dask.array as da
    import numpy as np

    a = np.arange(48 * 48.0).reshape(48, 48)
    y = da.from_array(a, chunks=(6, 48)).rechunk((48, 6))
    kept = _fails(y, client, how)
    with dask_redist.enable(engine="dask"):
        np.testing.assert_array_equal(y.compute(), a)
    if kept is not None:
        assert kept.status == "cancelled"
    kept = _fails(y, client, how)  # (its handle is the last: leaving it is disable())
    np.testing.assert_array_equal(y.compute(), a)  # Dask's own rechunk


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("size-class-bits", 99, "an integer from 0 to 16"),
        ("size-class-bits", -1, "an integer from 0 to 16"),
        ("retries", 10**6, "an integer from 0 to 100"),
        ("retries", -1, "an integer from 0 to 100"),
        ("nvshmem.shared-gpu-max-chunks", 0, "an integer from 1 to 1048576"),
        ("nvshmem.shared-gpu-max-chunks", 2**21, "an integer from 1 to 1048576"),
        ("timeouts.barrier", "0s", "a duration above 0s and at most 30 days"),
        ("timeouts.collective", "400 days", "a duration above 0s and at most 30 days"),
        ("timeouts.bootstrap", -5, "a duration above 0s and at most 30 days"),
        ("memory-budget", 0, "a number of bytes >= 1"),
        ("nvshmem.symmetric-size", 0, "a number of bytes >= 1"),
        ("min-bytes", -1, "a number of bytes >= 0"),
        ("numpy-via-gpus", -1, "a number of bytes >= 0"),
        ("cost-model.numpy-2.workers", 0, "an integer >= 1"),
        ("cost-model.numpy-2.dask-rechunk.per-task", float("inf"), "a finite number >= 0"),
        ("cost-model.numpy-2.collective.fixed", -0.1, "a finite number >= 0"),
    ],
)
def test_every_numeric_setting_checks_its_range_naming_key_value_and_range(key, value, says):
    from dask_redist.engines import check_settings

    with dask.config.set({f"redist.{key}": value}):
        with pytest.raises(dask_redist.ConfigError) as e:
            check_settings(Settings.from_config())  # (redist.nvshmem.*: the cufftmp engine's own check)
    message = str(e.value)
    assert f"redist.{key}" in message and repr(value) in message and says in message, message


def test_the_ranges_cover_every_integer_setting():
    """A new integer key gets a range too (`checks.RANGES`)."""
    from dask_redist.checks import RANGES
    from dask_redist.config import DEFAULTS, flatten

    ints = {
        k.removeprefix("redist.")
        for k, v in flatten(DEFAULTS["redist"]).items()
        if isinstance(v, int) and not isinstance(v, bool) and not k.startswith("redist.cost-model.")
    }
    assert ints == set(RANGES)


def test_every_true_or_false_setting_is_checked_by_enable():
    """docs/configuration.md: a value of the wrong type raises `ConfigError` naming the key, and
    `enable()` checks the values at once; `redist.fft.gpu: "yes"` used to pass `enable()` and be
    refused only when a transform was built (`redist.enabled` is the preload's own, checked there)."""
    from dask_redist.config import DEFAULTS, flatten

    keys = sorted(
        k.removeprefix("redist.")
        for k, v in flatten(DEFAULTS["redist"]).items()
        if isinstance(v, bool) and k != "redist.enabled"
    )
    assert "fft.gpu" in keys and "fuse" in keys, keys
    for key in keys:
        *section, last = key.replace("-", "_").split(".")  # (at most two levels)
        options = {section[0]: {last: "yes"}} if section else {last: "yes"}
        with pytest.raises(dask_redist.ConfigError, match=rf"redist\.{key} must be true or false, got 'yes'"):
            with dask_redist.enable(**options):
                pass


def test_the_cufftmp_engine_reads_and_checks_redist_nvshmem():
    """``redist.nvshmem.*`` keeps its keys, now the cufftmp engine's own section: read by it
    (`engine_settings`), checked by it when enabled, and the runtime's exit-when-stuck kept."""
    from dask_redist.engines import engine_settings

    with dask.config.set(
        {"redist.nvshmem.shared-gpu-max-chunks": 9, "redist.nvshmem.symmetric-size": "2GiB"}
    ):
        settings = Settings.from_config()
        (name,) = [
            d.name for d in dask_redist.engines.descriptions(settings) if d.settings_section == "nvshmem"
        ]
        mine = engine_settings(name, settings)
        assert (mine.shared_gpu_max_chunks, mine.symmetric_size, mine.shared_gpu_copies) == (9, 2**31, True)
        assert settings.exit_when_stuck is True
    assert engine_settings(name, Settings()).shared_gpu_max_chunks == 128  # (the packaged defaults)
    for bad, message in [
        (
            {"shared-gpu-max-chunks": 0},
            "redist.nvshmem.shared-gpu-max-chunks must be an integer from 1 to 1048576",
        ),
        ({"symmetric-size": "lots"}, "redist.nvshmem.symmetric-size must be a size"),
        ({"shared-gpu-copies": "yes"}, "redist.nvshmem.shared-gpu-copies must be true or false"),
        ({"exit-when-stuck": 1}, "redist.nvshmem.exit-when-stuck must be true or false"),
    ]:
        with pytest.raises(dask_redist.ConfigError, match=message):
            dask_redist.enable(nvshmem=bad)
    with pytest.raises(dask_redist.ConfigError, match="unknown option redist.nvshmem.heap"):
        dask_redist.enable(nvshmem={"heap": "1GiB"})


def test_known_keys_are_checked_without_reading_every_packages_metadata(monkeypatch):
    """``dask_redist.rechunk`` checks its options at every call: the installed engines (entry
    points: every package's metadata read) are looked up only for a key no setting knows, where
    an engine's own section may still take it."""
    from dask_redist import config

    def scan():
        raise AssertionError("the installed engines were looked up")

    monkeypatch.setattr(config, "installed_engines", scan)
    config.check_known({})
    config.check_known({"redist.engine": "dask", "redist.engines.mine": "m:E", "redist.cost-model.x.a": 1})
    with pytest.raises(AssertionError, match="looked up"):  # (an engine's section: asked of them)
        config.check_known({"redist.mine.option": 1})
    monkeypatch.setattr(config, "installed_engines", lambda: (("mine", "m:E"),))
    config.check_known({"redist.mine.option": 1, "redist.engine": "auto"})
    with pytest.raises(dask_redist.ConfigError, match=r"unknown option redist\.memory-budgit"):
        config.check_known({"redist.mine.option": 1, "redist.memory-budgit": "1GiB"})


def test_a_persisted_rechunk_that_failed_keeps_its_error_after_disable(client):
    """Found at 2 pseudo-hosts on one H200: a rechunk persisted where its engine was refused, then
    a computation from it after leaving enable(), read "cancelled for reason: lost dependencies"
    (disable() cancelled the persisted keys as if they were a failed compute's). The user's
    persisted keys stay erred: what is computed from them reports the engine's error."""
    import dask.array as da
    import numpy as np
    from distributed import wait

    a = np.arange(48 * 48.0).reshape(48, 48)
    x = client.persist(da.from_array(a, chunks=(6, 48)))
    with dask_redist.enable(engine="engines:FailingEngine", timeouts={"collective": "20s", "barrier": "20s"}):
        y = x.rechunk((48, 6)).persist()
        wait(y)
    assert {f.status for f in client.futures_of(y)} == {"error"}
    with pytest.raises(dask_redist.RedistError, match="injected failure on rank 0"):
        (y + 1).sum().compute()
    np.testing.assert_array_equal(x.rechunk((48, 6)).compute(), a)  # (another name: Dask's rechunk)


def test_a_workers_own_bad_redist_setting_does_not_fail_a_rechunk():
    """Settings are read on the client (docs/configuration.md): a worker whose own config holds a
    ``redist.*`` key that does not check (a typo in its YAML, ``DASK_REDIST__RETRIES=many`` where
    it was started) runs the rechunk with the client's. Its first stage task read the worker's
    config to register the plugins and failed every rechunk with that ConfigError."""
    import dask.array as da
    import numpy as np
    from distributed import Client

    from conftest import local_cluster

    def spoil():
        dask.config.set({"redist.memory-budgit": 1, "redist.retries": "many"})

    xn = np.arange(240 * 30, dtype=float).reshape(240, 30)
    x = da.from_array(xn, chunks=(20, 30))
    with local_cluster(2, threads_per_worker=1) as cluster, Client(cluster) as client:
        client.run(spoil)
        with dask_redist.enable(engine="dask", min_bytes=0):
            got = ((x + 1).rechunk((240, 5)) * 2).compute()
            np.testing.assert_array_equal(got, (xn + 1) * 2)
            assert [r["outcome"] for r in dask_redist.status(client)["history"]] == ["done"]
