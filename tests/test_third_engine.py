"""A third engine, registered by configuration alone, runs end to end on a CPU cluster.

`engines.FolderEngine` (tests/engines.py) moves pieces through files. Nothing of the package
names it: ``redist.engines`` registers it, and the scheduler, ``explain`` and ``doctor`` learn
from its description (`engines.FolderDescription`) that ``auto`` takes it for integer NumPy
chunks, after cufftmp and before dask (docs/design.md, "Add an engine").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import dask.array as da
import numpy as np
from conftest import scheduler_history, worker_leftovers
from engines import FOLDER, FolderDescription

import dask_redist

REGISTER = {"folder": "engines:FolderEngine"}


def test_an_engine_registered_by_configuration_runs_end_to_end(client):
    ints = np.arange(64 * 48, dtype=np.int64).reshape(64, 48)
    floats = np.random.default_rng(0).standard_normal((64, 48))
    with dask_redist.enable(engines=REGISTER):
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


def test_the_registered_engine_is_named_by_no_file_of_the_package():
    """The proof is configuration alone: no module or setting of dask_redist names the engine."""
    package = Path(dask_redist.__file__).parent
    for path in [*package.rglob("*.py"), *package.rglob("*.yaml")]:
        text = path.read_text()
        assert "FolderEngine" not in text and "engines:Folder" not in text, path
    assert FolderDescription.preference is not None and os.path.isdir(FOLDER)
