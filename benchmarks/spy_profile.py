"""Where a collective rechunk's time goes, sampled: py-spy on the scheduler and on every worker.

On a LocalCluster (its scheduler runs in this process), the slab case of ``--size`` at
``--chunks`` chunks is rechunked ``--reps`` times after a warm-up (``redist-dask``, as the
bench times it); during the last run ``py-spy record`` samples this process and every worker
(``client.run(os.getpid)``) into ``<out>/<tag>-{sched,w0,w1,...}.txt`` (py-spy's raw format:
one collapsed stack and its sample count a line), and the run's timeline is printed.

    python benchmarks/spy_profile.py --chunks 4096 --workers 2 --out /tmp/spy

py-spy (``pip install py-spy``) needs to be allowed to read other processes (ptrace).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import time

from dask.utils import parse_bytes
from distributed import Client, LocalCluster, wait

import dask_redist
from dask_redist.bench import placed_array, slab_case
from dask_redist.bench.harness import timeline


def spies(pids: dict[str, int], out: str, tag: str, rate: int) -> list[subprocess.Popen]:
    spy = shutil.which("py-spy") or "py-spy"
    return [
        subprocess.Popen(
            [spy, "record", "-p", str(pid), "-r", str(rate), "-f", "raw", "--nonblocking"]
            + ["-o", os.path.join(out, f"{tag}-{name}.txt")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="64MiB")
    p.add_argument("--chunks", type=int, default=1024)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--rate", type=int, default=200, help="samples per second")
    p.add_argument("--out", default=".")
    p.add_argument("--tag", default="spy")
    a = p.parse_args()
    case = slab_case(parse_bytes(a.size), a.chunks)
    with (
        LocalCluster(n_workers=a.workers, threads_per_worker=1, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        workers = client.run(os.getpid)
        pids = {"sched": os.getpid(), **{f"w{i}": pid for i, pid in enumerate(workers.values())}}
        for rep in range(a.reps + 1):
            x = placed_array(client, case, rep + 1, "numpy")
            procs = spies(pids, a.out, a.tag, a.rate) if rep == a.reps else []
            time.sleep(1.0 if procs else 0)  # (py-spy attaching)
            start = time.perf_counter()
            with dask_redist.enable(engine="dask", min_bytes=0):
                y = x.rechunk(case.new).persist()
                wait(y)
            elapsed = time.perf_counter() - start
            marks = timeline(client, start)
            for proc in procs:
                proc.send_signal(2)  # (SIGINT: py-spy writes its file)
            for proc in procs:
                proc.wait(timeout=60)
            print(f"run {rep}{' (warm-up)' if rep == 0 else ''}: {elapsed * 1e3:.0f} ms")
            del x, y
        for ms, event in marks:
            print(f"  {ms:9.1f} ms  {event}")


if __name__ == "__main__":
    main()
