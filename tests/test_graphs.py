"""Random graphs of several rechunks among other steps, under the collective: binary steps with an
operand chunked otherwise (Dask rechunks one of them to match), views (transposes, slices),
scans, reductions, an output used twice; 3-D rechunks given every way Dask takes them (tuples,
dicts, -1, one size a side) over several dtypes. NumPy's values, and every rechunk run as one
collective step.

Drawn with NumPy's generator, not Hypothesis (as `test_fuse.random_pipeline`): the cluster's
threads use the random module meanwhile, which Hypothesis reports as a strategy's doing."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import runs_since, scheduler_history
from test_fuse import enabled  # noqa: F401 (a fixture: the collective on every rechunk, however small)

pytestmark = pytest.mark.filterwarnings("ignore:Sending large graph:UserWarning")


def chunks_of(rng, n: int) -> tuple[int, ...]:
    """A random chunking of an axis of length ``n`` (up to 6 chunks)."""
    cuts = sorted({int(c) for c in rng.integers(1, n, rng.integers(0, min(n, 6)))}) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


UNARY = {
    "2x+1": lambda v: 2 * v + 1,
    "sin": np.sin,
    "T": lambda v: v.T,
    "slice": lambda v: v[1:, ::2],
    "cumsum0": lambda v: v.cumsum(axis=0),
    "sum1": lambda v: v.sum(axis=1, keepdims=True),
    "float32": lambda v: v.astype("float32").astype("float64"),
}


def graph(seed: int):
    """(the output, NumPy's value, the steps, how many rechunks changed chunks)."""
    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(2, 40)), int(rng.integers(2, 40)))
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    x = da.from_array(a, chunks=tuple(chunks_of(rng, s) for s in shape))
    other = da.from_array(b, chunks=tuple(chunks_of(rng, s) for s in shape))
    if rng.integers(2):
        x = x.persist()
    v, want, steps, changed = x, a, [], 0
    for _ in range(int(rng.integers(1, 6))):
        kind = int(rng.integers(4))
        if kind == 0:
            new = tuple(chunks_of(rng, s) for s in v.shape)
            changed += new != v.chunks
            v, step = v.rechunk(new), f"rechunk{new}"
        elif kind == 1 and v.shape == shape:
            v, want, step = v + other, want + b, "+other"
        else:
            step = str(rng.choice(sorted(UNARY)))
            if step == "slice" and min(v.shape) < 3:
                continue
            v, want = UNARY[step](v), UNARY[step](want)
        steps.append(step)
    return v, want, steps, changed


@pytest.mark.usefixtures("enabled")
@pytest.mark.parametrize("seed", range(30))
def test_random_graphs_of_rechunks_and_other_steps_equal_numpy(client, seed):
    y, want, steps, changed = graph(seed)
    before = scheduler_history(client)
    twice = seed % 3 == 0  # (the output used by a second step too)
    got = dask.compute(y, y.sum()) if twice else dask.compute(y)
    np.testing.assert_allclose(got[0], want, rtol=1e-10, atol=1e-10, err_msg=str(steps))
    if twice:
        np.testing.assert_allclose(got[1], want.sum(), rtol=1e-9, atol=1e-9, err_msg=str(steps))
    runs = runs_since(client, before)
    assert all(r["outcome"] == "done" for r in runs), (steps, runs)
    if changed:
        assert runs, f"no rechunk of {steps} ran as a collective step"


def rechunk_form(rng, shape: tuple[int, ...]):
    """New chunks as a user writes them: tuples of sizes, a dict with -1, one size a side, or a
    dict of a size and -1."""
    form = int(rng.integers(4))
    if form == 0:
        return tuple(chunks_of(rng, s) for s in shape)
    if form == 1:
        return {int(rng.integers(len(shape))): -1}
    if form == 2:
        return tuple(int(rng.integers(1, s + 1)) for s in shape)
    return {0: int(rng.integers(1, shape[0] + 1)), len(shape) - 1: -1}


@pytest.mark.usefixtures("enabled")
@pytest.mark.parametrize("seed", range(20))
def test_rechunks_written_every_way_over_dtypes_then_a_step_equal_numpy(client, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(rng.integers(2, 18)) for _ in range(3))
    dtype = str(rng.choice(["float64", "int16", "complex64", "bool"]))
    a = rng.random(shape) > 0.5 if dtype == "bool" else (rng.standard_normal(shape) * 10).astype(dtype)
    x = da.from_array(a, chunks=tuple(chunks_of(rng, s) for s in shape))
    y = x.rechunk(rechunk_form(rng, shape))
    changed = y.chunks != x.chunks
    step = int(rng.integers(4))
    if step == 0:  # an anomaly
        y, want = y - y.mean(axis=0), a - a.mean(axis=0)
    elif step == 1:
        y, want = y.sum(axis=(0, 2)), a.sum(axis=(0, 2))
    elif step == 2:  # a second rechunk of a concatenation
        y = da.concatenate([y, y], axis=1)
        y, want = y.rechunk(rechunk_form(rng, y.shape)), np.concatenate([a, a], axis=1)
    else:
        y, want = (y * 2).transpose(2, 0, 1).rechunk({0: -1}), (a * 2).transpose(2, 0, 1)
    before = scheduler_history(client)
    got = y.compute()
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    runs = runs_since(client, before)
    assert all(r["outcome"] == "done" for r in runs), runs
    if changed:
        assert runs, "the rechunk did not run as a collective step"
