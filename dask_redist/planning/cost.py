"""When Dask's own rechunk is faster: the measured model behind ``redist.min-bytes: auto``.

The collective pays a fixed cost Dask's ``tasks`` rechunk does not (a barrier task, a round
trip to the scheduler to plan and start the run, a message to every worker) and a cost per
input and per output chunk (a stage marker, an unpack task). Dask's rechunk pays per task it
plans: a merge task per output chunk of each step and a split task per piece (old chunk x new
chunk intersection) that is not a whole old chunk, each scheduled and often moved. Both pay
per byte. So each method's seconds are modelled as a line:

    Dask's rechunk   fixed + per-task x tasks + per-byte x bytes
    the collective   fixed + per-input-chunk x n_in + per-output-chunk x n_out + per-byte x bytes

where ``tasks`` counts the tasks of every step Dask plans (`dask_tasks`, with Dask's own
planner). The coefficients are not set by hand: `fit` draws them (non-negative least squares,
relative errors) through runs of both methods that ``dask-redist bench --calibrate`` measures
on the machine it runs on (`dask_redist.bench.calibrate`), which writes them as a dask config
file (``redist.cost-model``). The packaged models in ``redist.yaml`` are fits of the latest
calibration runs recorded in docs/benchmarks.md ("The cost model"), one per chunk kind and
worker count they were measured on; a rechunk is judged by the model of its kind measured on
the nearest worker count (`model_for`). ``auto`` keeps Dask's rechunk where the model says it
is faster, and says so with both estimates; a kind without a model keeps the collective.

Only Dask's ``tasks`` rechunk is modelled. Where Dask itself would pick ``p2p`` (large graphs
under distributed) the collective was measured faster at every size (docs/benchmarks.md).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from dask.utils import format_bytes

from dask_redist.compat import plan_dask_rechunk
from dask_redist.config import COST_TERMS, DASK_RECHUNK
from dask_redist.planning.geometry import RechunkSpec, axis_segments


@dataclass(frozen=True)
class CostModel:
    """One measured model: each method's coefficients in `COST_TERMS` order (seconds)."""

    name: str
    kind: str
    workers: int
    measured: str
    dask_rechunk: tuple[float, ...]  # Dask's own rechunk (`DASK_RECHUNK`)
    collective: tuple[float, ...]

    def seconds(self, spec: RechunkSpec, f: dict | None = None) -> tuple[float, float]:
        """(Dask's rechunk, the collective): the estimated seconds of ``spec`` (whose `features`
        are ``f``, where already counted)."""
        f = features(spec) if f is None else f
        return (
            float(np.dot(self.dask_rechunk, f[DASK_RECHUNK])),
            float(np.dot(self.collective, f["collective"])),
        )

    def entry(self) -> dict:
        """As ``redist.cost-model.<name>`` in a dask config file."""
        lines = {m: dict(zip(COST_TERMS[m], map(float, c))) for m, c in zip(COST_TERMS, self.lines())}
        return {"kind": self.kind, "workers": self.workers, "measured": self.measured, **lines}

    def lines(self) -> tuple[tuple[float, ...], ...]:
        """Each method's coefficients, in `COST_TERMS` order."""
        return self.dask_rechunk, self.collective


def models(cost_model: tuple) -> list[CostModel]:
    """`Settings.cost_model` (validated by `dask_redist.config`) as models."""
    return [CostModel(*entry) for entry in cost_model]


def model_for(cost_model: tuple, kind: str, workers: int | None) -> CostModel | None:
    """The model of ``kind`` measured on the worker count nearest ``workers`` (the larger on a tie;
    any where the count is unknown), or None without a model of that kind."""
    mine = [m for m in models(cost_model) if m.kind == kind]
    if not mine:
        return None
    if workers is None:
        return max(mine, key=lambda m: m.workers)
    return min(mine, key=lambda m: (abs(m.workers - workers), -m.workers))


def piece_count(spec: RechunkSpec) -> int:
    """Old chunk x new chunk intersections (pieces) of a rechunk: a product over the axes."""
    return math.prod(len(axis_segments(o, n)) for o, n in zip(spec.old, spec.new))


def step_tasks(old, new) -> int:
    """Tasks of one step of Dask's ``tasks`` rechunk from ``old`` to ``new`` chunks: one per new
    chunk (a concatenation, or an alias of its one piece) and a split (getitem) per piece that is
    not a whole old chunk. Pieces are a product over the axes, and so are the whole ones."""
    pieces = whole = 1
    for o, n in zip(old, new):
        seg = axis_segments(o, n)
        pieces *= len(seg.old)
        whole *= int(np.count_nonzero(seg.stop - seg.start == np.asarray(o, dtype=np.int64)[seg.old]))
    return math.prod(map(len, new)) + pieces - whole


def dask_tasks(spec: RechunkSpec) -> int:
    """Tasks of Dask's ``tasks`` rechunk: summed over the steps Dask's planner picks."""
    steps = [spec.old, *plan_dask_rechunk(spec.old, spec.new, spec.itemsize)]
    return sum(step_tasks(a, b) for a, b in itertools.pairwise(steps))


def features(spec: RechunkSpec) -> dict[str, tuple]:
    """What each method's coefficients multiply, in `COST_TERMS` order."""
    n_in, n_out = math.prod(spec.old_grid), math.prod(spec.new_grid)
    return {DASK_RECHUNK: (1, dask_tasks(spec), spec.nbytes), "collective": (1, n_in, n_out, spec.nbytes)}


def _ms(seconds: float) -> str:
    """Three significant figures or so: a near tie must not read as '27 ms against 27 ms'."""
    if seconds >= 10:
        return f"{seconds:.0f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def dask_rechunk_is_faster(
    spec: RechunkSpec, kind: str, cost_model: tuple, workers: int | None = None
) -> str | None:
    """Why Dask's own rechunk is expected to be faster for this rechunk (``redist.min-bytes:
    auto``), or None when the collective is (or no model covers ``kind``)."""
    return verdict(spec, kind, cost_model, workers)[0]


def verdict(
    spec: RechunkSpec, kind: str, cost_model: tuple, workers: int | None = None
) -> tuple[str | None, str]:
    """(`dask_rechunk_is_faster`, the model's estimates of both methods as text for ``explain``)
    of one rechunk: the model looked up and the `features` counted once (Dask's planner runs for
    them); (None, '') without a model."""
    model = model_for(cost_model, kind, workers)
    if model is None:
        return None, ""
    f = features(spec)
    dask_s, collective_s = model.seconds(spec, f)
    estimated = f"estimated {_ms(collective_s)} against {_ms(dask_s)} for Dask's rechunk; {_source(model)}"
    if dask_s >= collective_s:
        return None, estimated
    faster = (
        f"Dask's rechunk is estimated faster: {_ms(dask_s)} ({f[DASK_RECHUNK][1]} tasks) against {_ms(collective_s)} "
        f"for the collective ({f['collective'][1]} chunks in, {f['collective'][2]} out, "
        f"{format_bytes(spec.nbytes)}; {_source(model)}); redist.min-bytes: auto (set it to a size, e.g. 0, "
        "to decide by bytes instead)"
    )
    return faster, estimated


def _source(model: CostModel) -> str:
    return f"cost model {model.name}, measured {model.measured or 'on ' + str(model.workers) + ' workers'}"


def nonnegative_fit(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The non-negative coefficients ``c`` minimizing ``|x c - y|``: the least-squares fit on the
    subset of columns whose fit is non-negative with the smallest residual (the optimum is one
    of them; a handful of columns, so all subsets are tried). Ties keep the earlier columns."""
    best, best_residual = np.zeros(x.shape[1]), float(np.sum(y**2))
    for size in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), size):
            c, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(c < 0):
                continue
            residual = float(np.sum((x[:, cols] @ c - y) ** 2))
            if residual < best_residual * (1 - 1e-9):
                best, best_residual = np.zeros(x.shape[1]), residual
                best[list(cols)] = c
    return best


def fit_line(method: str, runs: list[tuple[RechunkSpec, float]]) -> tuple[float, ...]:
    """``method``'s coefficients through ``runs`` (spec, seconds), in relative error: the small
    rechunks, where the choice is close, weigh as much as the large."""
    x = np.array([features(spec)[method] for spec, _ in runs], dtype=float)
    y = np.array([seconds for _, seconds in runs], dtype=float)
    scale = np.abs(x).max(axis=0)  # (columns of seconds, counts and bytes: conditioned first)
    scale[scale == 0] = 1
    c = nonnegative_fit(x / scale / y[:, None], np.ones(len(y)))
    return tuple(float(v) for v in c / scale)


def fit(name: str, kind: str, workers: int, measured: str, runs: dict[str, list]) -> CostModel:
    """A model through measured ``runs`` ({"dask-rechunk": [(spec, s)], "collective": [(spec, s)]})."""
    return CostModel(name, kind, workers, measured, *(fit_line(m, runs[m]) for m in COST_TERMS))
