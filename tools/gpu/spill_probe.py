"""On the GPU node: what a rechunk does with inputs dask-cuda has spilled (issue 16).

One LocalCUDACluster worker per GPU with a device memory limit well below the input, so most
input chunks sit in host memory when the rechunk starts (dask-cuda's DeviceHostFile; its
JIT-unspill was removed in RAPIDS 26.06). Reports engine and outcome, values, wall time, and the
peak of GPU memory in use on each worker during the rechunk (memGetInfo polled every 2 ms on the
worker), against the input's size.

    python3 tools/gpu/spill_probe.py [--size 4GiB] [--chunks 32] [--limit 1GiB] [--workers 1]
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import dask
import dask.array as da
from dask.utils import format_bytes, parse_bytes
from distributed import Client, wait

import dask_redist
from dask_redist.bench import Case, check, placed_array


def _start_poll(dask_worker):
    import cupy

    stop = threading.Event()
    peak = [0]

    def loop():
        while not stop.is_set():
            free, total = cupy.cuda.runtime.memGetInfo()
            peak[0] = max(peak[0], total - free)
            time.sleep(0.002)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    dask_worker._redist_probe = stop, peak, t  # (client.run ships this module's functions by value)


def _stop_poll(dask_worker) -> int:
    stop, peak, thread = dask_worker._redist_probe
    stop.set()
    thread.join()
    return int(peak[0])


def _used() -> int:
    import cupy

    cupy.cuda.Device().synchronize()
    cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    return int(total - free)


def _spilled(dask_worker) -> str:
    data = dask_worker.data
    host = getattr(data, "host_buffer", None)
    device = getattr(data, "device_buffer", None)
    return f"{len(device) if device is not None else '?'} on device, {len(host) if host is not None else '?'} on host"


def one(args) -> dict:
    from dask_cuda import LocalCUDACluster

    size = parse_bytes(args.size)
    n = args.chunks
    side = int(round((size / 8) ** (1 / 3) / n)) * n
    shape = (side, side, side)
    normalize = da.core.normalize_chunks
    case = Case(
        "spill",
        shape,
        "float64",
        normalize((side // n, side, side), shape),
        normalize((side, side // n, side), shape),
    )
    row = {"input": format_bytes(8 * side**3), "chunks": n, "limit": args.limit, "engine": args.engine}
    with (
        LocalCUDACluster(
            n_workers=args.workers, device_memory_limit=args.limit, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        warm = Case("warm-up", (64, 64), "float64", ((32, 32), (64,)), ((64,), (32, 32)))
        with dask_redist.enable(engine=args.engine):  # the first rechunk bootstraps NVSHMEM: not timed
            wait(placed_array(client, warm, 1, kind="cupy").rechunk(warm.new).persist())
        x = placed_array(client, case, 1, kind="cupy")
        row["GPU in use before"] = format_bytes(max(client.run(_used).values()))
        row["spilled before"] = client.run(_spilled)
        client.run(_start_poll)
        start = time.perf_counter()
        try:
            with dask_redist.enable(engine=args.engine):
                y = x.rechunk(case.new).persist()
                wait(y)
            row["time"] = f"{time.perf_counter() - start:.3f} s"
            row["peak GPU"] = format_bytes(max(client.run(_stop_poll).values()))
            row["correct"] = check(y, case, 1)
            row["runs"] = [(h["engine"], h["outcome"]) for h in dask_redist.status(client)["history"]][-3:]
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            try:
                row["peak GPU"] = format_bytes(max(client.run(_stop_poll).values()))
            except Exception:
                pass
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="4GiB")
    p.add_argument("--chunks", type=int, default=32)
    p.add_argument("--limit", default="1GiB")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--engine", default="auto")
    args = p.parse_args()
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "4G")
    dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"})
    print(one(args), flush=True)


if __name__ == "__main__":
    main()
