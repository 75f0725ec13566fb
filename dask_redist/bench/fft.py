"""``dask-redist bench --fft``: ``dask_redist.fft.fftn`` against the four steps users write by hand.

The input: a complex cube in pencils (``a x b x 1`` chunks, ``a * b`` = ``--chunks``), persisted
on the workers. Every method computes the 3-D FFT of it and persists the result; every
repetition builds the graph anew (an untimed warm-up first), ``y = method(x).persist(); wait(y)``:

* ``redist-fft``: ``dask_redist.fft.fftn(x)`` (on GPUs with ``redist.fft.gpu`` as configured);
* ``redist-fft-enabled``: the same under ``dask_redist.enable()`` (its rechunks rewritten at
  submission, where the stage tasks also run the FFT tasks before them);
* ``redist-fft-gpu`` (``--gpu``): the same with ``redist.fft.gpu: true``;
* ``four-step``: rechunk to slabs along axis 0, ``map_blocks(fftn, axes=(1, 2))``, rechunk to slabs
  along axis 1, ``map_blocks(fft, axis=0)``, with Dask's rechunk (``tasks`` on CuPy, where
  ``p2p`` fails);
* ``four-step-collective``: the same four steps under ``dask_redist.enable()``;
* ``cupy-whole`` (``--gpu``): ``cupy.fft.fftn`` of a whole array of that shape on one GPU, data
  already there (the ceiling: no Dask, no exchange).

Each result is checked against ``four-step``'s (largest difference over the largest value).
"""

from __future__ import annotations

import math
import time
import uuid
from contextlib import nullcontext

import dask
import dask.array as da
import numpy as np
from dask.utils import parse_bytes

from dask_redist.bench.harness import Result
from dask_redist.compat import worker_info

CPU_METHODS = ("redist-fft", "redist-fft-enabled", "four-step", "four-step-collective")
GPU_METHODS = (
    "redist-fft",
    "redist-fft-enabled",
    "redist-fft-gpu",
    "four-step",
    "four-step-collective",
    "cupy-whole",
)


def pencils(nchunks: int) -> tuple[int, int]:
    """``nchunks`` as ``a x b`` pencils, ``a >= b`` as close as its divisors allow."""
    b = max(d for d in range(1, math.isqrt(nchunks) + 1) if nchunks % d == 0)
    return nchunks // b, b


def fft_case(size: str, nchunks: int) -> tuple[str, tuple[int, int, int], tuple]:
    n = max(2, round((parse_bytes(size) / 16) ** (1 / 3)))
    a, b = pencils(nchunks)
    shape = (n, n, n)
    chunks = da.core.normalize_chunks((math.ceil(n / a), math.ceil(n / b), n), shape)
    return f"{n}^3 complex128, {len(chunks[0])}x{len(chunks[1])}x1 pencils", shape, chunks


def _local_fftn(block, axes):
    xp = __import__("cupy") if type(block).__module__.startswith("cupy") else np
    return xp.fft.fftn(block, axes=axes)


def four_step(x, parts: int):
    """What users write today: the 3-D FFT by hand on slabs, as examples/fft_pipeline.py did."""
    from dask_redist.planning.fft import slab_sizes

    n0, n1, n2 = x.shape
    y = x.rechunk((slab_sizes(n0, parts), n1, n2)).map_blocks(_local_fftn, axes=(1, 2), dtype=x.dtype)
    return y.rechunk((n0, slab_sizes(n1, parts), n2)).map_blocks(_local_fftn, axes=(0,), dtype=x.dtype)


def _method(name: str, kind: str):
    import dask_redist
    import dask_redist.fft as F

    if name == "redist-fft-enabled":
        return lambda x: F.fftn(x), lambda: dask_redist.enable()
    if name.startswith("redist-fft"):
        on = {"redist.fft.gpu": True} if name == "redist-fft-gpu" else {}
        return lambda x: F.fftn(x), lambda: dask.config.set(on)
    tasks = {"array.rechunk.method": "tasks"} if kind == "cupy" else {}  # (p2p fails on CuPy)
    if name == "four-step-collective":
        return (lambda x: four_step(x, x.npartitions)), lambda: dask_redist.enable()
    return (lambda x: four_step(x, x.npartitions)), lambda: dask.config.set(tasks)


def _same(block):
    return block


def input_array(client, shape, chunks, kind: str, seed: int = 0):
    from distributed import wait

    x = da.random.default_rng(seed).standard_normal(shape, chunks=chunks).astype(np.complex128)
    if kind == "cupy":
        import cupy

        x = x.map_blocks(cupy.asarray, meta=cupy.empty((0, 0, 0), dtype=np.complex128))
    # keys of its own (the same data for every method): no result of another run is reused
    x = x.map_blocks(_same, name=f"fft-bench-input-{uuid.uuid4().hex}", meta=x._meta).persist()
    wait(x)
    return x


def _time(client, case, name: str, kind: str, reps: int):
    """Times of ``reps`` runs after a warm-up, each on a fresh input (new keys: nothing cached;
    run ``k`` of every method on the same data), and the last result."""
    from distributed import wait

    build, context = _method(name, kind)
    times, y = [], None
    for rep in range(reps + 1):  # the first: warm-up
        y = None
        x = input_array(client, *case, kind, seed=rep)
        with context() or nullcontext():
            start = time.perf_counter()
            y = build(x).persist()
            wait(y)
            if rep:
                times.append(time.perf_counter() - start)
    return times, y


def _difference(y, reference) -> float:
    top = float(abs(reference).max().compute())
    return float(abs(y - reference).max().compute()) / (top or 1.0)


def _cupy_whole(shape, reps: int) -> list[float]:
    import cupy

    a = cupy.random.standard_normal(shape).astype(cupy.complex128)
    cupy.fft.fftn(a)
    out = []
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        cupy.fft.fftn(a)
        cupy.cuda.Device().synchronize()
        out.append(time.perf_counter() - start)
    return out


def run(client, size: str, nchunks: int, methods, reps: int, kind: str) -> list[Result]:
    """Every method on one case; results checked against ``four-step``'s."""
    name, shape, chunks = fft_case(size, nchunks)
    nbytes = math.prod(shape) * 16
    results, reference, outputs = [], None, {}
    for method in ["four-step"] + [m for m in methods if m != "four-step"]:
        r = Result(name, method, nbytes, math.prod(map(len, chunks)), 0)
        try:
            if method == "cupy-whole":
                worker = sorted(worker_info(client))[0]
                r.times = client.submit(_cupy_whole, shape, reps, workers=[worker], pure=False).result()
                r.note = "one GPU, whole array, no Dask"
            else:
                r.times, y = _time(client, (shape, chunks), method, kind, reps)
                r.nchunks_out = y.npartitions
                reference = y if method == "four-step" else reference
                outputs[method] = y
                r.correct = _difference(y, reference) < 1e-10
        except Exception as e:  # noqa: BLE001 - a method that fails says so in its row
            r.error = f"{type(e).__name__}: {e}".splitlines()[0]
        if method in methods:
            results.append(r)
    return sorted(results, key=lambda r: list(methods).index(r.method))


def main(args, command: str, connect, show, write) -> int:
    """``dask-redist bench --fft`` (the CLI passes its cluster, table and file helpers)."""
    import os

    from dask_redist.bench.harness import environment

    kind = "cupy" if args.gpu else "numpy"
    methods = tuple(args.methods or (GPU_METHODS if args.gpu else CPU_METHODS))
    results = []
    with connect(args) as client:
        env = environment(client)
        for size in args.size:
            for n in args.chunks:
                done = run(client, size, n, methods, args.reps, kind)
                show([r.row() for r in done])
                results += done
                if args.out:  # after every case: a run cut short keeps what it measured
                    write(os.path.join(args.out, args.name), results, env, command)
    return 0 if all(r.correct is not False and not r.error for r in results) else 1
