"""dask_redist.fft on dask-cuda workers (marker ``gpu``; skipped without GPUs and CuPy).

With ``redist.fft.gpu: true`` transforms of CuPy chunks run as one collective step through
cuFFTMp (`dask_redist.fft.gpu`); the results are compared with numpy.fft of the same data,
and the scheduler's history must show the run on the cufftmp engine. What cuFFTMp cannot run
must give the same results through the path that runs everywhere, with the reason in explain.
``REDIST_TEST_PES=K`` runs it on K workers (NVSHMEM PEs) per GPU. Commands: docs/fft.md
("Testing the GPU path").
"""

from __future__ import annotations

import os

import conftest
import dask
import dask.array as da
import numpy as np
import pytest
from conftest import scheduler_history
from fft_helpers import NUMPY, OURS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_redist
import dask_redist.fft as F
from dask_redist.engines import loaded_engines

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_client():
    """``REDIST_TEST_GPUS`` GPUs with ``REDIST_TEST_PES`` workers (NVSHMEM PEs) each (`conftest.gpu_client`)."""
    yield from conftest.gpu_client()


@pytest.fixture
def fft_gpu():
    with dask.config.set({"redist.fft.gpu": True}):
        yield


def cupy_array(a, chunks):
    import cupy

    meta = cupy.empty((0,) * a.ndim, dtype=a.dtype)
    return da.from_array(a, chunks=chunks).map_blocks(cupy.asarray, meta=meta, dtype=a.dtype)


def _path(y) -> dict:
    return {e.path: e for e in dask_redist.explain(y).ffts}


def _fft_runs(client, before: int) -> list[dict]:
    return [h for h in scheduler_history(client)[before:] if h.get("outcome") == "done"]


def _chunking(draw, n: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 3)))) if n > 1 else []
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


def hermitian(real: np.ndarray, axes) -> np.ndarray:
    """An ``irfftn`` input whose result is defined: the ``rfftn`` of a real array (cuFFT's C2R of
    anything else is undefined, and need not agree with NumPy's)."""
    return np.fft.rfftn(real, axes=axes)


@st.composite
def gpu_cases(draw, nworkers: int):
    """(kind, input, chunks, s, axes, norm): C2C, R2C and C2R, 2-D and 3-D, with or without a
    batch axis, uneven chunks, single and double precision, every norm; C2R of an even or an
    odd last axis (``s`` given for the odd one, as NumPy needs)."""
    kind = draw(st.sampled_from(sorted(NUMPY)))
    k = draw(st.sampled_from([2, 3]))
    batch = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 1))))
    # (at least 2 per GPU: rfft2's last axis, n // 2 + 1 long after it, must be at least the GPUs too)
    shape = batch + tuple(draw(st.integers(2 * nworkers, 2 * nworkers + 10)) for _ in range(k))
    axes = tuple(range(len(shape) - k, len(shape)))
    single = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    real = rng.standard_normal(shape)
    s = None
    if kind[0] == "c2r":  # shape: the result's; the input is its half spectrum
        a = hermitian(real, axes)
        s = shape[-k:] if shape[-1] % 2 else None
    elif kind[0] == "r2c":
        a = real
    else:
        a = real + 1j * rng.standard_normal(shape)
    dtype = {"f": ("float32", "float64"), "c": ("complex64", "complex128")}[a.dtype.kind][not single]
    norm = draw(st.sampled_from([None, "ortho", "forward"]))
    return kind, a.astype(dtype), tuple(_chunking(draw, n) for n in a.shape), s, axes, norm


@settings(
    max_examples=int(os.environ.get("REDIST_TEST_EXAMPLES", "10")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_the_gpu_path_equals_numpy(gpu_client, fft_gpu, data):
    n = len(gpu_client.scheduler_info()["workers"])
    kind, a, chunks, s, axes, norm = data.draw(gpu_cases(n))
    expected = NUMPY[kind](a, s=s, axes=axes, norm=norm)
    before = len(scheduler_history(gpu_client))
    y = OURS[kind](cupy_array(a, chunks), s=s, axes=axes, norm=norm)
    assert "gpu" in _path(y), dask_redist.explain(y)
    got = y.compute().get()
    runs = _fft_runs(gpu_client, before)
    assert any(r["engine"] == "cufftmp" for r in runs), runs
    single = expected.dtype in (np.complex64, np.float32)
    tol = 1e-4 if single else 1e-10
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol * (float(np.abs(expected).max()) or 1.0))


def test_forward_and_inverse_return_the_input(gpu_client, fft_gpu):
    a = np.random.default_rng(3).standard_normal((64, 48, 40)) + 0j
    x = cupy_array(a, (16, 48, 40))
    back = F.ifftn(F.fftn(x)).compute().get()
    assert np.abs(back - a).max() / np.abs(a).max() < 1e-12
    paths = gpu_client.run(lambda: loaded_engines()["cufftmp"].stats()["last fft's path"])
    # one PE: chunks that split only the first axis are transformed where they are; more PEs: C2C
    # without batches saves the copy into the operand
    expected = (
        "one PE: cuFFT from the input chunks" if len(paths) == 1 else "cuFFTMp, the leg in into its operand"
    )
    assert set(paths.values()) == {expected}, paths
    r = np.random.default_rng(4).standard_normal((2, 48, 40))
    back = (
        F.irfftn(F.rfftn(cupy_array(r, (1, 8, 40)), axes=(1, 2)), s=r.shape[1:], axes=(1, 2)).compute().get()
    )
    assert np.abs(back - r).max() / np.abs(r).max() < 1e-12
    odd = np.random.default_rng(5).standard_normal((24, 33))  # 2-D: R2C in X slabs, C2R in Y slabs
    y = F.rfft2(cupy_array(odd, (5, 33)))
    assert "gpu" in _path(y)
    back = F.irfft2(y, s=odd.shape)
    assert "gpu" in _path(back)
    assert np.abs(back.compute().get() - odd).max() / np.abs(odd).max() < 1e-12


def test_a_persisted_input_is_staged_by_one_task_per_worker(gpu_client, fft_gpu):
    """A persisted input's transform has one stage task per worker holding its chunks (as a
    rechunk's has), and forward + inverse of it on the GPU path return it; with one PE the
    output chunk is the output slab (the leg out moves nothing)."""
    from distributed import wait

    from dask_redist.core.spec import STAGE_PREFIX

    a = np.random.default_rng(7).standard_normal((32, 24, 16)) + 1j
    x = cupy_array(a, (4, 6, 16)).persist()
    wait(x)
    y = F.fftn(x)
    layer = y.dask.layers[y.name]  # (its collective form: a local scheduler gets Dask's tasks)
    stages = [k for k in getattr(layer, "mapping", layer) if k[0].startswith(STAGE_PREFIX)]
    holders = {min(w) for w in gpu_client.who_has(x).values()}
    assert len(stages) == len(holders) < x.npartitions, (len(stages), holders)
    before = len(scheduler_history(gpu_client))
    got = y.persist()
    np.testing.assert_allclose(got.compute().get(), np.fft.fftn(a), rtol=1e-10, atol=1e-8)
    assert any(r["engine"] == "cufftmp" for r in _fft_runs(gpu_client, before))
    back = F.ifftn(got).compute().get()
    assert np.abs(back - a).max() / np.abs(a).max() < 1e-12


def test_chunks_asked_for(gpu_client, fft_gpu):
    """Chunks asked for come straight out of the run, split along the last axis too; more chunks
    along it than the input's length (an irfftn's) take a rechunk after it."""
    a = np.random.default_rng(5).standard_normal((32, 24, 16)) + 0j
    x = cupy_array(a, (8, 24, 16))
    y = F.fftn(x, chunks=(4, 24, 16))
    z = F.fftn(x, chunks=(32, 24, 4))
    for arr in (y, z):
        assert "gpu" in _path(arr), dask_redist.explain(arr)  # (failed once at 4 PEs: why, next time)
        assert len(_path(arr)["gpu"].steps) == 1
        np.testing.assert_allclose(arr.compute().get(), np.fft.fftn(a), rtol=1e-10, atol=1e-8)
    assert y.chunks[0] == (4,) * 8 and z.chunks[2] == (4,) * 4
    real = np.random.default_rng(6).standard_normal((32, 24, 8))
    spectrum = hermitian(real, (0, 1, 2))  # (32, 24, 5)
    w = F.irfftn(cupy_array(spectrum, (8, 24, 5)), chunks=(32, 24, 1))
    assert "more than the input's length (5)" in _path(w)["gpu"].steps[-1]
    np.testing.assert_allclose(w.compute().get(), real, rtol=1e-10, atol=1e-10)


def test_a_transform_refused_at_the_barrier_leaves_the_world_usable(gpu_client, fft_gpu):
    """A run cuFFTMp cannot do (here C2C of float64 chunks, which the API never builds) is refused
    by the scheduler before it starts, with the reason; the next transform runs on cufftmp."""
    from dask_redist.errors import RedistError
    from dask_redist.fft import gpu
    from dask_redist.fft.plan import normalize

    a = np.random.default_rng(7).standard_normal((16, 12, 10))
    x = cupy_array(a, (4, 12, 10))
    with pytest.raises(RedistError, match="C2C takes complex64 or complex128"):
        gpu.build(x, normalize(x.shape, "c2c", False), None).compute()
    assert not any(r.get("broken") for r in dask_redist.status(gpu_client)["engines"]["records"].values())
    before = len(scheduler_history(gpu_client))
    y = F.fftn(x.astype(complex))
    np.testing.assert_allclose(y.compute().get(), np.fft.fftn(a), rtol=1e-10, atol=1e-8)
    assert any(r["engine"] == "cufftmp" for r in _fft_runs(gpu_client, before))


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda f, x: f.fft(x, axis=0), "1-D transform"),
        (lambda f, x: f.fftn(x, s=(40, 24, 16), axes=(0, 1, 2)), "pads or crops"),
        (lambda f, x: f.fftn(x, axes=(0, 1)), "not the last 2 axes"),
    ],
)
def test_what_cufftmp_cannot_run_falls_back(gpu_client, fft_gpu, call, why):
    a = np.random.default_rng(6).standard_normal((32, 24, 16)) + 0j
    y = call(F, cupy_array(a, (8, 24, 16)))
    entry = _path(y)["local"]
    assert why in entry.reason and "cupy.fft" in entry.reason
    np.testing.assert_allclose(y.compute().get(), call(np.fft, a), rtol=1e-10, atol=1e-8)


def test_on_by_default_and_off_when_asked(gpu_client):
    a = np.ones((16, 16, 16), dtype=complex)
    assert "gpu" in _path(F.fftn(cupy_array(a, (4, 16, 16))))
    with dask.config.set({"redist.fft.gpu": False}):
        y = F.fftn(cupy_array(a, (4, 16, 16)))
    assert "redist.fft.gpu: false" in _path(y)["local"].reason
    np.testing.assert_allclose(y.compute().get(), np.fft.fftn(a), atol=1e-9)


def test_an_fft_too_large_for_the_heap_is_refused_and_the_world_stays_usable(fft_gpu):
    """A transform whose operand does not fit NVSHMEM's symmetric heap fails its setup alike on
    every GPU before any data moved: the run fails with that reason, no engine is marked broken,
    and the next transform runs on cufftmp (before, any failed FFT run broke the world: every
    later transform fell back).

    Where CUDA's virtual memory management is on (NVSHMEM's default on x86) the heap grows on
    demand past ``NVSHMEM_SYMMETRIC_SIZE`` (on one H200, 2026-12-02: a 5.3 GB operand was set
    up on a 4 GiB heap at 1 PE, and 5.4 GB per PE at 4 PEs), so only the GPU's memory bounds
    it; this test's own workers fix their heap (``NVSHMEM_DISABLE_CUDA_VMM=1``) to reach the
    refusal with an input of a few GiB."""
    import contextlib

    import cupy

    from dask_redist.compat import worker_info
    from dask_redist.engines.cufftmp.nvshmem import parse_symmetric_size
    from dask_redist.errors import RedistError

    env = {"NVSHMEM_DISABLE_CUDA_VMM": "1", "NVSHMEM_SYMMETRIC_SIZE": "2G"}
    with contextlib.contextmanager(conftest.gpu_client)(env=env) as client:
        nranks = len(worker_info(client))
        if nranks == 1:
            pytest.skip("one PE transforms with cuFFT, off the symmetric heap (engines.cufftmp.one_pe)")
        heap = parse_symmetric_size(env["NVSHMEM_SYMMETRIC_SIZE"])
        n = int(round((1.25 * heap * nranks / 8) ** (1 / 3))) + 1  # complex64: each rank's slab over the heap
        meta = cupy.empty((0, 0, 0), dtype=np.complex64)
        x = da.zeros((n, n, n), dtype=np.complex64, chunks=(max(1, n // 8), n, n)).map_blocks(
            lambda b: cupy.zeros(b.shape, b.dtype), meta=meta
        )
        y = F.fftn(x)
        assert "gpu" in _path(y), dask_redist.explain(y)
        with pytest.raises(RedistError, match="failed alike on every GPU before any data moved"):
            y.sum().compute()
        assert not any(r.get("broken") for r in dask_redist.status(client)["engines"]["records"].values())
        a = np.random.default_rng(8).standard_normal((16, 12, 10)) + 0j
        before = len(scheduler_history(client))
        z = F.fftn(cupy_array(a, (4, 12, 10)))
        assert "gpu" in _path(z), dask_redist.explain(z)
        np.testing.assert_allclose(z.compute().get(), np.fft.fftn(a), rtol=1e-10, atol=1e-8)
        assert any(r["engine"] == "cufftmp" for r in _fft_runs(client, before))


def test_a_transform_between_other_steps_is_fused_and_equals_numpy(gpu_client, fft_gpu):
    """Under enable(), a blockwise producer runs in the transform's stage tasks, its consumer in its
    unpack tasks (`graph.fuse`, for collectives built on the client too): numpy.fft's values."""
    import collections

    from dask.utils import key_split
    from distributed import wait

    a = np.random.default_rng(9).standard_normal((32, 24, 16)) + 1j
    x = cupy_array(a, (4, 24, 16)).persist()
    wait(x)
    before = len(scheduler_history(gpu_client))
    with dask_redist.enable():  # (the graph rewrite, which fuses, is enable()'s)
        y = (F.fftn(2 * x) * 3).persist()
        wait(y)
    held = gpu_client.run_on_scheduler(
        lambda dask_scheduler: dict(collections.Counter(key_split(k) for k in dask_scheduler.tasks))
    )
    np.testing.assert_allclose(y.compute().get(), np.fft.fftn(2 * a) * 3, rtol=1e-10, atol=1e-8)
    assert any(r["engine"] == "cufftmp" for r in _fft_runs(gpu_client, before))
    assert held.pop("mul") == y.npartitions and held.pop("redist-barrier") == 1, held
    assert held.pop("redist-stage") <= len(gpu_client.nthreads()), held
