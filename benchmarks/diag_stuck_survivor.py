"""Diagnostic (temporary): what becomes of a survivor whose GPU was left inside an NVSHMEM
collective when its peer was SIGKILLed mid-run? Kills it and watches the process."""

import os
import signal
import subprocess
import threading
import time

import cupy
import dask.array as da
import numpy as np
from dask_cuda import LocalCUDACluster
from distributed import Client, wait

import dask_redist


def state(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            st = [line.strip() for line in f if line.startswith(("State", "Threads"))]
        with open(f"/proc/{pid}/wchan") as f:
            st.append("wchan=" + f.read())
        return " ".join(st)
    except FileNotFoundError:
        return "gone"


def thread_states(pid):
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        try:
            s = open(f"/proc/{pid}/task/{tid}/stat").read().split(") ")[1].split()[0]
            w = open(f"/proc/{pid}/task/{tid}/wchan").read()
            c = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            if s != "S" or w not in ("0", "do_epoll_wait", "futex_wait_queue"):
                out.append(f"{tid}:{c}:{s}:{w}")
        except OSError:
            pass
    return out


def main():
    os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", "4G")
    with LocalCUDACluster(n_workers=2, dashboard_address=None) as cluster, Client(cluster) as client:
        shape = (256, 256, 512)
        x = da.arange(np.prod(shape), chunks=256 * 512 * 32, dtype="float64").reshape(shape)
        x = x.rechunk((32, 256, 512)).map_blocks(cupy.asarray).persist()
        wait(x)
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        survivor = sorted(pids)[1]

        def active(dask_scheduler):
            plugin = dask_scheduler.plugins.get("redist")
            return [r.spec.engine for r in plugin.active.values()] if plugin else []

        def killer():
            deadline = time.monotonic() + 60
            while "cufftmp" not in client.run_on_scheduler(active) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)
            os.kill(pids[victim], signal.SIGKILL)
            print("killed", victim, flush=True)

        t = threading.Thread(target=killer)
        with dask_redist.enable(engine="auto", memory_budget="1MiB", timeouts={"collective": "20s"}):
            t.start()
            y = x.rechunk((256, 32, 512)).persist()
            wait(y, timeout=120)
            t.join()
        print("rechunk finished; survivor", survivor, "pid", pids[survivor], state(pids[survivor]), flush=True)
        print("broken:", client.run(lambda: __import__("dask_redist").engines.get_engine("cufftmp").broken), flush=True)
        print("survivor threads:", thread_states(pids[survivor]), flush=True)
        print(subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                             capture_output=True, text=True).stdout, flush=True)
        os.kill(pids[survivor], signal.SIGKILL)
        start = time.monotonic()
        while time.monotonic() - start < 100:
            s = state(pids[survivor])
            print(f"{time.monotonic() - start:6.1f}s after SIGKILL: {s}", flush=True)
            if s == "gone" or s.startswith("State:\tZ") or "zombie" in s:
                break
            time.sleep(5)
        print(subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv"],
                             capture_output=True, text=True).stdout, flush=True)
        deadline = time.monotonic() + 60
        while len(client.scheduler_info()["workers"]) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        print("workers after:", len(client.scheduler_info()["workers"]), flush=True)


if __name__ == "__main__":
    main()
