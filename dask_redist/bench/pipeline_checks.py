"""The checks of ``bench --pipeline`` (`dask_redist.bench.pipeline`): sampled values of every
output against NumPy, computed here from the input's formula, or where the values depend on the
whole input (the 3-D FFT) against a direct DFT computed where the input's chunks are."""

from __future__ import annotations

import math

import dask
import numpy as np

from dask_redist.bench.cases import Case, expected_block


def _xp(block):
    return __import__("cupy") if type(block).__module__.startswith("cupy") else np


def _boxes(shape, chunks, rng, most: int = 6) -> list[tuple[slice, ...]]:
    """Small boxes (up to 3 a side) in up to ``most`` output chunks: the first, the last and
    random others (the C-order flat index), each at a random place inside its chunk."""
    grid = [len(c) for c in chunks]
    n = math.prod(grid)
    picks = sorted({0, n - 1, *(int(i) for i in rng.integers(0, n, most - 2))})
    bounds = [np.concatenate([[0], np.cumsum(c)]) for c in chunks]
    boxes = []
    for flat in picks:
        idx = np.unravel_index(flat, grid)
        box = []
        for axis, i in enumerate(idx):
            lo, hi = int(bounds[axis][i]), int(bounds[axis][i + 1])
            side = min(3, hi - lo)
            start = int(rng.integers(lo, hi - side + 1))
            box.append(slice(start, start + side))
        boxes.append(tuple(box))
    return boxes


def _inside(case: Case, token: int, box) -> np.ndarray:
    """The input in ``box``, as generated."""
    lower, shape = [s.start for s in box], [s.stop - s.start for s in box]
    return expected_block(case.dtype, token, shape, lower, case.shape)


def _column(case: Case, token: int, box) -> np.ndarray:
    """The input over all of axis 0 and ``box``'s extent on the other axes, as float64."""
    shape = (case.shape[0], *(s.stop - s.start for s in box[-2:]))
    lower = (0, *(s.start for s in box[-2:]))
    return expected_block(case.dtype, token, shape, lower, case.shape).astype(np.float64)


def _expected(pipeline: str, case: Case, token: int, box) -> np.ndarray:
    """NumPy's values of ``pipeline``'s output in ``box`` (not for fft, fftn's transform and generated)."""
    if pipeline == "elementwise":
        return (2 * _inside(case, token, box).astype(np.float64) + token) ** 2
    if pipeline == "reduction":
        return _column(case, token, box).mean(axis=0)
    if pipeline == "weather":
        z = 0.5 * _column(case, token, box) + token
        return (z - z.mean(axis=0))[box[0]]
    if pipeline == "fftn":  # without the transform: 2*x / 2, the input
        return _inside(case, token, box)
    raise ValueError(pipeline)


def _dft_points(block, points, global_shape, block_info=None):
    """This block's share of a direct DFT at each point: ``(lo, length, k0, k1, k2, twice)``, the
    transform along axis 0 over ``[lo, lo + length)`` (the whole axis, or one row) at ``k0``,
    over all of axes 1 and 2 at ``k1, k2``; ``twice``: along axis 1 two transforms in turn,
    which give ``n1 * v[-k1 mod n1]``."""
    xp = _xp(block)
    lower = [lo for lo, _ in block_info[0]["array-location"]]
    n1 = global_shape[1]
    out = []
    for lo, length, k0, k1, k2, twice in points:
        j0 = xp.arange(lower[0], lower[0] + block.shape[0])
        inside = (j0 >= lo) & (j0 < lo + length)
        e0 = xp.where(inside, xp.exp(-2j * np.pi * k0 * (j0 - lo) / length), 0)
        j1 = xp.arange(lower[1], lower[1] + block.shape[1])
        e1 = xp.where((j1 + k1) % n1 == 0, n1, 0) if twice else xp.exp(-2j * np.pi * k1 * j1 / n1)
        e2 = xp.exp(-2j * np.pi * k2 * xp.arange(lower[2], lower[2] + block.shape[2]) / global_shape[2])
        out.append(complex(e0 @ ((block @ e2) @ e1)))
    return np.array(out).reshape((1, 1, 1, len(points)))


def _fft_ok(y, x, case: Case, rechunk: bool, rng) -> bool:
    """Sampled values of ``y`` against a direct DFT of the input ``x`` (computed where its chunks
    are): the 3-D FFT, or without the rechunk ``fft2`` then the transform along axis 1 again."""
    places, points = [], []
    for box in _boxes(y.shape, y.chunks, rng):
        i0, k1, k2 = (s.start for s in box)
        if rechunk:  # the 3-D FFT
            points.append((0, case.shape[0], i0, k1, k2, False))
        else:  # row i0 untransformed along axis 0
            points.append((i0, 1, 0, k1, k2, True))
        places.append((i0, k1, k2))
    shares = x.map_blocks(
        _dft_points,
        points,
        case.shape,
        dtype=np.complex128,
        chunks=(1, 1, 1, len(points)),
        new_axis=3,
        meta=np.empty((0, 0, 0, 0), np.complex128),
    )
    reference = shares.sum(axis=(0, 1, 2))
    values = [y[i0 : i0 + 1, k1 : k1 + 1, k2 : k2 + 1] for i0, k1, k2 in places]
    reference, *values = dask.compute(reference, *values)
    got = np.array([complex(_host(v).ravel()[0]) for v in values])
    # rounding: of the order of eps x the sum of |input| (the values are below 65521 * sqrt(2))
    return bool(np.allclose(got, reference, rtol=1e-9, atol=1e-12 * 1.5 * 65521 * math.prod(case.shape)))


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def check_output(pipeline: str, case: Case, y, x, token: int, rechunk: bool, again=None) -> bool:
    """Whether sampled values of the output ``y`` are right (``x``: the input; ``again``, for
    ``generated``: the same random array made again, not rechunked)."""
    rng = np.random.default_rng(token)
    if pipeline == "fft" or (pipeline == "fftn" and rechunk):  # (fftn: fftn(2*x) / 2, the 3-D FFT)
        return _fft_ok(y, x, case, rechunk, rng)
    boxes = _boxes(y.shape, y.chunks, rng)
    got = [_host(a) for a in dask.compute(*[y[box] for box in boxes])]
    if pipeline == "generated":  # the same numbers again, without the rechunk
        want = [_host(a) for a in dask.compute(*[again[box] for box in boxes])]
        return all(np.array_equal(g, w) for g, w in zip(got, want))
    ok = True
    for box, g in zip(boxes, got):
        want = _expected(pipeline, case, token, box)
        atol = 0.0
        if case.dtype == "float32":  # float32 sums: rounding of eps x log2(terms) x the largest value
            atol = 1e-6 * (0.5 * 65521 + token) * (2 + math.log2(case.shape[0]))
        ok = ok and g.shape == want.shape and bool(np.allclose(g, want, rtol=1e-9, atol=atol))
    return ok
