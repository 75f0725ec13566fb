"""A third engine, in a package of its own, runs end to end on a CPU cluster with its own settings.

`folder_engine` (tests/third_party_engine, with its own pyproject.toml) moves pieces through
files. Nothing of dask_redist names it: it registers through the entry-point group
``dask_redist.engines`` once its package's metadata is installed, or by ``redist.engines``;
the scheduler, ``explain`` and ``doctor`` learn from its description
(`folder_engine.FolderDescription`) that ``auto`` takes it for integer NumPy chunks, after
cufftmp and before dask, and it checks its own section, ``redist.folder.*``
(docs/design.md, "Add an engine").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
from conftest import scheduler_history, worker_leftovers
from folder_engine import FOLDER, FolderDescription

import dask_redist
from dask_redist.config import ConfigError, installed_engines

PACKAGE = Path(__file__).parent / "third_party_engine"


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The folder engine's package installed: its metadata (a dist-info made from its
    pyproject.toml, entry points and all) on the path, as pip would write it."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
    info = tmp_path / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
            for group, points in groups.items()
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert dict(installed_engines()) == {"folder": "folder_engine:FolderEngine"}


def _runs_end_to_end(client, **options) -> None:
    ints = np.arange(64 * 48, dtype=np.int64).reshape(64, 48)
    floats = np.random.default_rng(0).standard_normal((64, 48))
    with dask_redist.enable(**options):
        y = da.from_array(ints, chunks=(8, 48)).rechunk((64, 6))
        (entry,) = dask_redist.explain(y)
        assert (entry.engine, entry.engine_reason) == (
            "folder",
            "integer NumPy chunks, every worker on one host: through files",
        )
        assert entry.mapping == f"one file per pair of ranks in {FOLDER}"
        np.testing.assert_array_equal(y.compute(), ints)
        run = scheduler_history(client)[-1]
        assert run["engine"] == "folder" and run["outcome"] == "done", run

        z = da.from_array(floats, chunks=(8, 48)).rechunk((64, 6))  # auto passes it over: not integers
        assert dask_redist.explain(z)[0].engine == "dask"
        np.testing.assert_array_equal(z.compute(), floats)
        last = scheduler_history(client)[-1]
        assert last["engine"] == "dask" and last["outcome"] == "done", last

        diagnosis = dask_redist.doctor(client)
    assert dict(diagnosis.lines)["folder"].startswith(f"every worker writes {FOLDER} on ")
    assert all(row["folder"] == "ok" for row in diagnosis.rows())
    assert "engine folder: every worker writes" in str(diagnosis)
    assert worker_leftovers(client) == {}
    ranks = hashlib.sha1(" ".join(sorted(client.scheduler_info()["workers"])).encode()).hexdigest()[:12]
    assert not os.path.exists(
        os.path.join(FOLDER, f"{run['token']}-{run['run']}-{ranks}")
    )  # every file taken


def test_an_installed_engine_runs_end_to_end_with_its_own_settings(client, installed):
    """Registered by its entry point alone; ``redist.folder.poll`` is read and checked by the
    engine, and the workers run with it."""
    _runs_end_to_end(client, folder={"poll": "5ms"})
    polls = {
        s["engines"]["folder"]["stats"]["poll_s"]
        for s in dask_redist.status(client)["workers"].values()
        if "folder" in s["engines"]
    }
    assert polls == {0.005}


def test_an_engine_checks_its_own_settings(installed):
    with pytest.raises(
        ConfigError, match=r"redist.folder.poll must be a positive duration like '10ms', got 'soon'"
    ):
        dask_redist.enable(folder={"poll": "soon"})
    with pytest.raises(ConfigError, match=r"unknown option redist.folder.pole: the folder engine takes poll"):
        dask_redist.enable(folder={"pole": "1ms"})


def test_an_engine_not_registered_has_no_settings():
    """Without its entry point (nor redist.engines) nobody owns redist.folder: an unknown key."""
    assert "folder" not in dict(installed_engines())
    with pytest.raises(ConfigError, match="unknown option redist.folder.poll"):
        dask_redist.enable(folder={"poll": "5ms"})


def test_an_engine_registered_by_configuration_runs_end_to_end(client):
    _runs_end_to_end(client, engines={"folder": "folder_engine:FolderEngine"})


def test_the_registered_engine_is_named_by_no_file_of_the_package():
    """The proof is registration alone: no module or setting of dask_redist names the engine."""
    package = Path(dask_redist.__file__).parent
    for path in [*package.rglob("*.py"), *package.rglob("*.yaml")]:
        text = path.read_text()
        assert "FolderEngine" not in text and "folder_engine" not in text, path
    assert FolderDescription.preference is not None and os.path.isdir(FOLDER)
