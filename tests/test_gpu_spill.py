"""Inputs that dask-cuda spilled to host memory (marker ``gpu``; skipped without GPUs).

A GPU cluster (`conftest.gpu_client`: a LocalCUDACluster, or at ``REDIST_TEST_PES`` > 1
``dask cuda worker`` processes sharing each GPU) whose workers may each keep a quarter of
their share of the input on the device, so that most input chunks sit in the workers' host
buffers when the rechunk starts, at any number of workers. Both engines must give
the right values. What is not promised yet: that the run unspills only a round at a time
(today the stage tasks receive every chunk unspilled; docs/reliability.md, "Not covered
yet"). dask-cuda's JIT-unspill (proxies) was removed in RAPIDS 26.06 and has no test.
"""

from __future__ import annotations

import math

import dask.array as da
import pytest
import conftest
from conftest import scheduler_history
from distributed import wait

import dask_redist
from dask_redist.bench import Case, check, placed_array

pytestmark = pytest.mark.gpu


#: The input: 1 GiB of float64 in 16 slabs of 64 MiB.
SHAPE, SLAB = (512, 512, 512), 32


def device_memory_limit(workers: int) -> str:
    """A quarter of each worker's share of the input (a fixed 256 MiB spilled nothing at 4 PEs,
    where a worker's share is 256 MiB): 12 or more of the 16 chunks spilled, at any count."""
    return f"{(8 * math.prod(SHAPE)) // workers // 4 // 2**20}MiB"


@pytest.fixture(scope="module")
def spilling_client():
    gpus, pes = conftest.gpu_layout()
    yield from conftest.gpu_client(device_memory_limit=device_memory_limit(gpus * pes))


def _held(dask_worker) -> tuple[int, int]:
    data = dask_worker.data
    return len(data.device_buffer), len(data.host_buffer)


@pytest.mark.parametrize("engine", ["cufftmp", "dask"])
def test_spilled_inputs_give_the_right_values(spilling_client, engine):
    client = spilling_client
    normalize = da.core.normalize_chunks
    old, new = normalize((SLAB, 512, 512), SHAPE), normalize((512, SLAB, 512), SHAPE)
    case = Case("spilled", SHAPE, "float64", old, new)
    x = placed_array(client, case, 3, kind="cupy")
    held = client.run(_held)
    on_host = sum(host for _, host in held.values())
    assert on_host >= 8, f"expected most of the 16 input chunks spilled to host, {on_host} were: {held}"
    before = len(scheduler_history(client))
    with dask_redist.enable(engine=engine):
        y = x.rechunk(case.new).persist()
        wait(y)
    assert check(y, case, 3)
    runs = scheduler_history(client)[before:]
    assert runs and runs[-1]["engine"] == engine and runs[-1]["outcome"] == "done", runs
