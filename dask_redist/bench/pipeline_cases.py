"""The pipelines of ``dask-redist bench --pipeline`` (`bench.pipeline` runs and times them): each one's
input case, and its steps with the rechunk (or ``fftn``'s transform) or without it."""

from __future__ import annotations

import math

import dask.array as da
from dask.utils import format_bytes, parse_bytes

from dask_redist.bench.cases import Case, _even, slab_case
from dask_redist.bench.fft import fft_case, pencils
from dask_redist.bench.pipeline_checks import _xp

PIPELINES = ("elementwise", "fft", "reduction", "generated", "weather", "fftn")


def weather_case(nbytes: int | str, nchunks: int) -> Case:
    """(time, lat, lon) float32: ``nchunks`` time steps, one a chunk, lat x lon (about 1:2) of
    ``nbytes`` in all, rechunked to ``nchunks`` long time series (``pencils(nchunks)`` blocks of
    lat x lon). ``--size 36.4GB --chunks 8760``: (8760, 721, 1440), a year of hourly ERA5 at 0.25 degrees."""
    nbytes = parse_bytes(nbytes) if isinstance(nbytes, str) else nbytes
    per_step = max(2, nbytes // 4 // nchunks)
    lat = max(1, round(math.sqrt(per_step / 2)))
    lon = max(1, per_step // lat)
    a, b = pencils(nchunks)
    shape = (nchunks, lat, lon)
    old = ((1,) * nchunks, (lat,), (lon,))
    new = ((nchunks,), _even(lat, a), _even(lon, b))
    size = format_bytes(math.prod(shape) * 4)
    name = f"weather {size} ({nchunks}, {lat}, {lon}) {nchunks}->{len(new[1])}x{len(new[2])} float32"
    return Case(name, shape, "float32", old, new)


def pipeline_case(pipeline: str, size: str, nchunks: int) -> Case:
    """The input case of a pipeline (its old and new chunks: the rechunk's)."""
    if pipeline == "weather":
        return weather_case(size, nchunks)
    if pipeline == "fftn":
        return fftn_case(size, nchunks)
    return slab_case(size, nchunks, "complex128" if pipeline == "fft" else "float64")


def fftn_case(size: str, nchunks: int) -> Case:
    """Issue 40's 3-D FFT (`fft.fft_case`'s slabs: ``(2n, 2n, n)`` complex128, ``n`` a length
    without large prime factors), ``nchunks`` slabs along axis 0 (``new``: along axis 1, where
    ``tasks`` rechunks them)."""
    shape = fft_case(size, nchunks, slabs=True)[1]
    old = (_even(shape[0], nchunks), shape[1:2], shape[2:])
    new = (shape[:1], _even(shape[1], nchunks), shape[2:])
    size = format_bytes(math.prod(shape) * 16)
    name = f"fftn of slab {size} {shape} {len(old[0])}->{len(new[1])} complex128"  # (its own bare row)
    return Case(name, shape, "complex128", old, new)


# -- the pipelines -------------------------------------------------------------------------


def _fft2(block):
    return _xp(block).fft.fft2(block, axes=(1, 2))


def _fft0(block):
    return _xp(block).fft.fft(block, axis=0)


def _fft1(block):
    return _xp(block).fft.fft(block, axis=1)


def _rechunked(y, case: Case, rechunk: bool, method: str | None):
    return y.rechunk(case.new, method=method) if rechunk else y


def generated_input(case: Case, seed: int, kind: str) -> da.Array:
    """Random numbers in the case's input chunks, made by the graph (not persisted)."""
    if kind == "cupy":
        import cupy

        state = da.random.RandomState(seed, RandomState=cupy.random.RandomState)
    else:
        state = da.random.RandomState(seed)
    return state.random_sample(case.shape, chunks=case.old)


def build(pipeline: str, case: Case, x, token: int, rechunk: bool, method: str | None = None) -> da.Array:
    """The pipeline's output (not computed); ``x``: the placed input, or for ``generated`` the
    seed's random array; ``method``: the rechunk's (None: Dask's choice, or the collective)."""
    if pipeline == "elementwise":
        return _rechunked(2 * x + token, case, rechunk, method) ** 2
    if pipeline == "fft":
        y = _rechunked(x.map_blocks(_fft2, dtype=x.dtype, meta=x._meta), case, rechunk, method)
        return y.map_blocks(_fft0 if rechunk else _fft1, dtype=x.dtype, meta=x._meta)
    if pipeline == "reduction":
        return _rechunked(x, case, rechunk, method).mean(axis=0)
    if pipeline == "generated":
        return _rechunked(x, case, rechunk, method)
    if pipeline == "weather":
        z = _rechunked(0.5 * x + token, case, rechunk, method)
        return z - z.mean(axis=0)
    if pipeline == "fftn":
        y = 2 * x
        if method == "tasks":  # the 3-D FFT by hand, with Dask's rechunk
            y = y.map_blocks(_fft2, dtype=x.dtype, meta=x._meta).rechunk(case.new, method="tasks")
            y = y.map_blocks(_fft0, dtype=x.dtype, meta=x._meta)
        elif rechunk:
            y = bare("fftn", case, y)
        return y / 2
    raise ValueError(f"no pipeline {pipeline!r}; there are {', '.join(PIPELINES)}")


def bare(pipeline: str, case: Case, x) -> da.Array:
    """What the pipeline's collective step is alone: the rechunk, or for ``fftn`` the transform."""
    if pipeline == "fftn":
        from dask_redist.fft import fftn

        return fftn(x)
    return x.rechunk(case.new)
