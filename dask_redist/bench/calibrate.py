"""``dask-redist bench --calibrate``: measure the cost model of ``redist.min-bytes: auto`` here.

Times the collective (``redist.engine: auto``, as users run it) and Dask's ``tasks`` rechunk, taking
turns run by run (a shared machine's drift then slows both alike), on
cases chosen to tell the model's terms apart (`cases`): slabs at 2-256 chunks (per chunk and per
task), two sizes (per byte), 1-D merges and a split (input and output chunk counts apart, the
few tasks of a merge), then fits each method's line (`dask_redist.planning.cost.fit`) and writes
it as a dask config file (`write_model`): dask reads every YAML file of its config directory, so
from the next session on ``auto`` decides with what was measured on this cluster.
"""

from __future__ import annotations

import os

import numpy as np
import yaml

from dask_redist.bench.cases import Case, line_case, pencil_case, slab_case, worker_addresses
from dask_redist.bench.harness import Result, run_case
from dask_redist.config import DASK_RECHUNK
from dask_redist.planning import RechunkSpec
from dask_redist.planning.cost import CostModel, fit

#: Calibration sizes (small, large) per chunk kind, unless given.
SIZES = {"numpy": ("1MiB", "512MiB"), "cupy": ("64MiB", "4GiB")}

#: The methods timed ({model's line: bench method}): the collective as ``auto`` runs it, and
#: Dask's own rechunk.
METHODS = {"collective": "redist-auto", DASK_RECHUNK: "tasks"}


def cases(small: str, large: str) -> list[Case]:
    """The calibration cases (see the module docstring)."""
    return [
        *(slab_case(small, n) for n in (2, 4, 16, 64, 256)),
        *(slab_case(large, n) for n in (2, 16)),
        pencil_case(large, 4),
        pencil_case(small, 8),
        line_case("8MB", 100, 4),  # 1-D, 100 -> 4 chunks (issue 26: Dask faster on CPU)
        line_case(small, 256, 16),
        line_case(small, 4, 64),
    ]


def spec(case: Case) -> RechunkSpec:
    return RechunkSpec(case.old, case.new, np.dtype(case.dtype).itemsize)


def runs(results: list[Result], methods: dict = METHODS) -> dict[str, list]:
    """{"dask-rechunk": [(case name, median s)], "collective": [...]} of the checked results of
    ``methods`` ({model's line: bench method})."""
    by_method = {bench: model for model, bench in methods.items()}
    out: dict[str, list] = {model: [] for model in methods}
    for r in results:
        if r.method in by_method and r.times and r.correct:
            out[by_method[r.method]].append((r.case, r.median))
    return out


def model_from(
    results: list[Result],
    case_list: list[Case],
    kind: str,
    workers: int,
    measured: str,
    methods: dict = METHODS,
) -> CostModel:
    """Fit the model of ``kind`` through the ``results`` of ``case_list`` (others are left out)."""
    specs = {c.name: spec(c) for c in case_list}
    found = {
        m: [(specs[name], s) for name, s in rows if name in specs]
        for m, rows in runs(results, methods).items()
    }
    for method, rows in found.items():
        if len(rows) < 3:
            raise RuntimeError(
                f"calibration: only {len(rows)} checked runs of {methods[method]}; see the table"
            )
    return fit(f"{kind}-{workers}", kind, workers, measured, found)


def calibrate(
    client, kind: str, reps: int, sizes=None, measured: str = "", progress=print
) -> tuple[CostModel, list[Result]]:
    """Time the calibration cases on ``client``'s cluster and fit the model of ``kind``."""
    small, large = sizes or SIZES[kind]
    workers = len(worker_addresses(client))
    case_list = cases(small, large)
    results = []
    for case in case_list:
        progress(f"calibration: {case.name} ...")
        results += run_case(client, case, tuple(METHODS.values()), reps=reps, kind=kind, interleave=True)
    return model_from(results, case_list, kind, workers, measured), results


def write_model(model: CostModel, folder: str, command: str = "dask-redist bench --calibrate") -> str:
    """``model`` as the dask config file ``<folder>/redist-cost-model-<name>.yaml``; its path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"redist-cost-model-{model.name}.yaml")
    with open(path, "w") as f:
        f.write(f"# dask-redist's cost model for redist.min-bytes: auto, written by `{command}`\n")
        yaml.safe_dump({"redist": {"cost-model": {model.name: model.entry()}}}, f, sort_keys=False)
    return path
