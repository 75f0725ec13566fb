"""The benchmark's inputs: cases, placed arrays, and the check of every result.

Placement is controlled: input chunk ``i`` of ``n`` (C order) is created on
worker ``i * W // n`` of the ``W`` workers sorted by address (contiguous
blocks, the layout the design figures use), by a task pinned there. Values
follow a formula of the global position (`expected_block`), so every result is
checked on the workers without gathering it. The soak draws random cases
(`random_case`) and builds their inputs wherever Dask puts them (`generated`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dask
import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph
from dask.utils import format_bytes, parse_bytes

from dask_redist.compat import worker_info
from dask_redist.engines import descriptions

#: ``redist-<engine>`` for every engine of the registry (most preferred first), then Dask's own
#: methods; also: tasks-ucx, p2p-ucx, nvmath, ceiling, floor, enabled (the cost model chooses)
METHODS = (*(f"redist-{d.name}" for d in descriptions()), "tasks", "p2p")


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]
    dtype: str
    old: tuple
    new: tuple

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def _cube(nbytes: int | str, dtype: str) -> tuple[int, int]:
    """(bytes, side) of a cube of about ``nbytes`` of ``dtype``."""
    nbytes = parse_bytes(nbytes) if isinstance(nbytes, str) else nbytes
    return nbytes, round((nbytes / np.dtype(dtype).itemsize) ** (1 / 3))


def slab_case(nbytes: int | str, nchunks: int, dtype: str = "float64") -> Case:
    """A cube split into ``nchunks`` slabs along axis 0, rechunked to slabs along axis 1.

    Where the cube's side is shorter than ``nchunks`` (8 GiB of float64 is 1024 on a side), the
    array is ``(nchunks, nchunks, k)`` instead, ``k`` as large as the size allows (at least 1;
    the name then gives the size there is): slabs one row thick, as many as asked.
    """
    nbytes, n = _cube(nbytes, dtype)
    shape = (n, n, n)
    if n < nchunks:
        shape = (nchunks, nchunks, max(1, nbytes // np.dtype(dtype).itemsize // nchunks**2))
    split = _even(shape[0], nchunks)
    old, new = (split, (shape[1],), (shape[2],)), ((shape[0],), split, (shape[2],))
    size = nbytes if n >= nchunks else math.prod(shape) * np.dtype(dtype).itemsize
    return Case(f"slab {format_bytes(size)} {len(split)}->{len(split)} {dtype}", shape, dtype, old, new)


def pencil_case(nbytes: int | str, per_axis: int, dtype: str = "float64") -> Case:
    """Pencils along axis 2 (chunks on axes 0, 1) to pencils along axis 0 (chunks on 1, 2); a cube
    of side ``per_axis`` where the size asked for is smaller (the name gives the size there is)."""
    nbytes, n = _cube(nbytes, dtype)
    if n < per_axis:
        n, nbytes = per_axis, per_axis**3 * np.dtype(dtype).itemsize
    shape, split = (n, n, n), _even(n, per_axis)
    old, new = (split, split, (n,)), ((n,), split, split)
    return Case(f"pencil {format_bytes(nbytes)} {len(split)}x{len(split)} {dtype}", shape, dtype, old, new)


def _even(n: int, parts: int) -> tuple[int, ...]:
    """``n`` cut into ``parts`` chunks (at most ``n``) whose sizes differ by at most one: the
    case names give the chunk count there is (docs/benchmarks.md has how earlier cases differed)."""
    parts = max(1, min(parts, n))
    return tuple(int(x) for x in np.diff(np.linspace(0, n, parts + 1).round().astype(np.int64)))


def line_case(nbytes: int | str, chunks_in: int, chunks_out: int, dtype: str = "float64") -> Case:
    """A 1-D array in ``chunks_in`` even chunks rechunked to ``chunks_out`` (merging or splitting)."""
    nbytes = parse_bytes(nbytes) if isinstance(nbytes, str) else nbytes
    n = max(chunks_in, chunks_out, nbytes // np.dtype(dtype).itemsize)
    old, new = (_even(n, chunks_in),), (_even(n, chunks_out),)
    size = format_bytes(n * np.dtype(dtype).itemsize)
    return Case(f"line {size} {len(old[0])}->{len(new[0])} {dtype}", (n,), dtype, old, new)


def uneven_case(nbytes: int | str, dtype: str = "float64", seed: int = 0) -> Case:
    """A cube in 13 uneven slabs along axis 0 to 11 uneven slabs along axis 1, axis 2 cut in two."""
    nbytes, n = _cube(nbytes, dtype)
    rng = np.random.default_rng(seed)

    def split(length, parts):
        cuts = np.sort(rng.choice(np.arange(1, length), parts - 1, replace=False))
        return tuple(int(c) for c in np.diff(np.concatenate([[0], cuts, [length]])))

    old = (split(n, 13), (n,), (n,))
    new = ((n,), split(n, 11), (n - n // 3, n // 3))
    return Case(f"uneven {format_bytes(nbytes)} 13->22 {dtype}", (n, n, n), dtype, old, new)


def four_d_case(nbytes: int | str, nchunks: int, dtype: str = "float32") -> Case:
    """A 4-D array (n, n, n, 8n) in ``nchunks`` slabs along axis 0, rechunked to slabs along axis 3."""
    nbytes = parse_bytes(nbytes) if isinstance(nbytes, str) else nbytes
    n = round((nbytes / np.dtype(dtype).itemsize / 8) ** (1 / 4))
    shape = (n, n, n, 8 * n)
    old = da.core.normalize_chunks((math.ceil(n / nchunks), n, n, 8 * n), shape)
    new = da.core.normalize_chunks((n, n, n, math.ceil(8 * n / nchunks)), shape)
    return Case(f"4-D {format_bytes(nbytes)} {nchunks}->{nchunks} {dtype}", shape, dtype, old, new)


#: Every method on the 8 GiB slabs at 2-256 chunks: the collective on a TCP and on a UCX
#: dask-cuda cluster, Dask's own rechunks, and the peer-copy ceiling.
HEADLINE = (
    "redist-cufftmp",
    "redist-dask",
    "tasks",
    "p2p",
    "redist-cufftmp-ucx",
    "redist-dask-ucx",
    "tasks-ucx",
    "ceiling",
)
FAST = ("redist-cufftmp", "tasks-ucx", "ceiling")


def gpu_suite() -> list[tuple[Case, tuple[str, ...]]]:
    """The GPU table: each case with the methods run on it (slow ones only where they tell something).

    Run it with default settings (the README's table); tuned settings (a larger staging budget)
    go in a second table. Slabs of the 8 GiB cube stop at 1024 chunks (its side); 4096 chunks
    are pencils (64 x 64).
    """
    # raw Redistribute moves the same slabs whatever the chunk count: timed once per size
    suite = [(slab_case("8GiB", n), HEADLINE + (("nvmath",) if n == 16 else ())) for n in (2, 16, 64, 256)]
    suite += [
        (slab_case("8GiB", 1024), ("redist-cufftmp", "redist-cufftmp-ucx", "tasks-ucx", "ceiling")),
        (pencil_case("8GiB", 64), ("redist-cufftmp", "redist-cufftmp-ucx", "tasks-ucx", "ceiling")),
        (slab_case("1GiB", 16), ("redist-cufftmp", "redist-dask", "tasks", "tasks-ucx", "nvmath", "ceiling")),
        # larger than the staging budget: runs in rounds (raw Redistribute would need 32 GiB more heap)
        (slab_case("32GiB", 16), ("redist-cufftmp", "tasks-ucx", "ceiling")),
        (slab_case("8GiB", 16, "float32"), FAST),
        (slab_case("8GiB", 16, "complex128"), FAST),
        (pencil_case("8GiB", 4), FAST),
        (uneven_case("8GiB"), FAST),
        (four_d_case("8GiB", 16), FAST),
    ]
    return suite


# -- data with a known value at every index ---------------------------------------------

_MODULUS = {"f2": 2039, "i1": 127, "b1": 2}


def expected_block(dtype: str, seed: int, shape, lower, global_shape, xp=np):
    """Value at every index: (linear index * 7 + seed) mod m, exact in any dtype."""
    dt = np.dtype(dtype)
    m = _MODULUS.get(dt.str[1:], 65521)
    idx = [xp.arange(lo, lo + s, dtype=xp.int64) for lo, s in zip(lower, shape)]
    lin = xp.zeros(tuple(shape), dtype=xp.int64)
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        view = [1] * len(shape)
        view[axis] = shape[axis]
        lin = lin + idx[axis].reshape(view) * stride
        stride *= global_shape[axis]
    v = (lin * 7 + seed) % m
    if dt.kind == "c":
        return (v - 1j * v).astype(dt)
    return v.astype(dt)


def make_block(dtype, seed, shape, lower, global_shape, kind):
    """The block at ``lower`` of the case's input: `expected_block` as NumPy or CuPy (``kind``)."""
    if kind == "cupy":
        import cupy

        return expected_block(dtype, seed, shape, lower, global_shape, xp=cupy)
    return expected_block(dtype, seed, shape, lower, global_shape)


def contiguous(i: int, n: int, nworkers: int) -> int:
    """The default placement: contiguous blocks, chunk i of n on worker i * W // n."""
    return i * nworkers // n


def worker_addresses(client) -> list[str]:
    """The cluster's workers, sorted, asked of the scheduler (`compat.worker_info`: a bench row
    failed with an IndexError on the busy CPU machine when read through scheduler_info's cache)."""
    workers = sorted(worker_info(client))
    if not workers:
        raise RuntimeError("the cluster has no workers")
    return workers


def placed_array(client, case: Case, seed: int, kind: str = "numpy", placement=contiguous) -> da.Array:
    """The case's input, chunk i of n created on worker ``placement(i, n, W)``."""
    from distributed import wait

    workers = worker_addresses(client)
    grid = [len(c) for c in case.old]
    n = math.prod(grid)
    name = f"bench-input-{seed}-{dask.base.tokenize(case, kind, placement)}"
    bounds = [np.concatenate([[0], np.cumsum(c)]) for c in case.old]
    futures = {}
    for i, idx in enumerate(np.ndindex(*grid)):
        shape = tuple(c[j] for c, j in zip(case.old, idx))
        lower = tuple(int(b[j]) for b, j in zip(bounds, idx))
        futures[(name, *idx)] = client.submit(
            make_block,
            case.dtype,
            seed,
            shape,
            lower,
            case.shape,
            kind,
            key=(name, *idx),
            workers=[workers[placement(i, n, len(workers))]],
            allow_other_workers=False,
            pure=False,
        )
    wait(list(futures.values()))
    meta = np.empty((0,) * len(grid), dtype=case.dtype)
    if kind == "cupy":
        import cupy

        meta = cupy.empty((0,) * len(grid), dtype=case.dtype)
    graph = HighLevelGraph.from_collections(name, futures, dependencies=())
    return da.Array(graph, name, case.old, meta=meta)


def _check_block(block, dtype, seed, global_shape, block_info=None):
    lower = [lo for lo, _ in block_info[0]["array-location"]]
    xp = np
    if type(block).__module__.startswith("cupy"):
        import cupy as xp
    ok = bool((block == expected_block(dtype, seed, block.shape, lower, global_shape, xp=xp)).all())
    return np.array([ok]).reshape((1,) * block.ndim)


def flags(y: da.Array, case: Case, seed: int) -> da.Array:
    """One flag per chunk of ``y``: does it equal the case's formula? (A blockwise step.)"""
    return y.map_blocks(
        _check_block,
        case.dtype,
        seed,
        case.shape,
        dtype=bool,
        chunks=(1,) * y.ndim,
        meta=np.empty((0,) * y.ndim, bool),
    )


def check(y: da.Array, case: Case, seed: int) -> bool:
    return bool(flags(y, case, seed).all().compute())


#: dtypes of the soak's random cases
DTYPES = ("float64", "float32", "int8", "complex128", "float16", "bool")


def random_case(rng: np.random.Generator, max_bytes: int) -> Case:
    """A random geometry (1-3 axes, uneven chunks) of at most ``max_bytes``, old and new chunks differing."""
    dtype = str(rng.choice(DTYPES))
    ndim = int(rng.integers(1, 4))
    side = max(2, int((max_bytes / np.dtype(dtype).itemsize) ** (1 / ndim)))
    shape = tuple(int(rng.integers(2, side + 1)) for _ in range(ndim))

    def chunks():
        return tuple(_split(rng, n) for n in shape)

    old, new = chunks(), chunks()
    while new == old:
        new = chunks()
    return Case(
        f"{shape} {dtype} {tuple(map(len, old))}->{tuple(map(len, new))} chunks", shape, dtype, old, new
    )


def _split(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    parts = int(rng.integers(1, min(n, 8) + 1))
    cuts = np.sort(rng.choice(np.arange(1, n), parts - 1, replace=False)) if parts > 1 else np.array([], int)
    return tuple(int(c) for c in np.diff(np.concatenate([[0], cuts, [n]])))


def generated(case: Case, seed: int, kind: str) -> da.Array:
    """The case's input, persisted wherever Dask puts it (recomputable if its worker dies)."""
    meta = np.empty((0,) * len(case.shape), dtype=case.dtype)
    if kind == "cupy":
        import cupy

        meta = cupy.empty((0,) * len(case.shape), dtype=case.dtype)
    template = da.zeros(case.shape, chunks=case.old, dtype=np.int8)
    return template.map_blocks(
        _block, case.dtype, seed, case.shape, kind, dtype=case.dtype, meta=meta
    ).persist()


def _block(template, dtype, seed, global_shape, kind, block_info=None):
    lower = [lo for lo, _ in block_info[0]["array-location"]]
    return make_block(dtype, seed, template.shape, lower, global_shape, kind)
