"""A local GPU cluster of N worker processes over fewer GPUs: several NVSHMEM PEs per GPU.

`LocalCUDACluster` gives each worker a GPU of its own and refuses a device twice ("Can not
scale beyond visible devices"). NVSHMEM itself lets several processes share a GPU, so a
scheduler and N ``dask cuda worker`` processes, each started with ``CUDA_VISIBLE_DEVICES`` set
to one GPU, form one NVSHMEM world of N PEs on fewer GPUs: what a user gets by starting the
workers by hand. On such a world values, aborts, restarts, stranded peers and memory per PE
behave as on separate GPUs; speed does not (the PEs share one GPU's bandwidth and time-slice).
The GPU tests (``REDIST_TEST_PES``) and ``dask-redist ... --gpu --pes-per-gpu N`` use it; with
``hosts`` (``REDIST_TEST_HOSTS``, ``--pseudo-hosts``) the workers are split into pseudo-hosts.

The workers are real ``dask cuda worker`` processes under their nannies (a worker killed is
restarted by its nanny, as in any deployment), in a process group of their own so that
closing the cluster ends every one of them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

#: NVSHMEM's symmetric heap per PE where nobody set one: room for N PEs on one 141 GB H200
#: next to their CuPy pools (8 GiB at up to 4 PEs per GPU, 4 GiB beyond).
HEAP_PER_PE = {4: "8G", 8: "4G"}


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries."""
    if visible := os.environ.get("CUDA_VISIBLE_DEVICES"):
        return [d.strip() for d in visible.split(",") if d.strip()]
    import cupy

    return [str(i) for i in range(cupy.cuda.runtime.getDeviceCount())]


def heap_per_pe(pes_per_gpu: int) -> str:
    """NVSHMEM_SYMMETRIC_SIZE for ``pes_per_gpu`` PEs sharing a GPU (the environment's, if set)."""
    if size := os.environ.get("NVSHMEM_SYMMETRIC_SIZE"):
        return size
    return next((size for most, size in sorted(HEAP_PER_PE.items()) if pes_per_gpu <= most), "2G")


def pseudo_host(i: int, workers: int, hosts: int) -> str | None:
    """``redist.host`` of worker ``i`` of ``workers`` split into ``hosts`` pseudo-hosts in order
    (hostA, hostB, ...: 4 workers on 2 hosts are A A B B), or None for one host (its own)."""
    if hosts <= 1:
        return None
    if hosts > min(workers, 26):
        raise ValueError(f"hosts ({hosts}) must be at most the workers ({workers}) and 26")
    return "host" + chr(ord("A") + i * hosts // workers)


def unfit(workers: int, pes_per_gpu: int, gpus: list[str]) -> str | None:
    """Why ``workers`` do not fit the visible ``gpus`` at ``pes_per_gpu`` on each, and what to ask
    instead, or None (LocalCUDACluster: one per GPU)."""
    if workers <= pes_per_gpu * len(gpus):
        return None
    return (
        f"--workers {workers} with --gpu start {pes_per_gpu} per GPU, and {len(gpus)} GPU(s) are visible; "
        f"use --workers {pes_per_gpu * len(gpus)}, or --pes-per-gpu {-(-workers // max(len(gpus), 1))} "
        "to start several workers (NVSHMEM PEs) on each GPU"
    )


class SharedGPUCluster:
    """A scheduler in this process and ``workers`` ``dask cuda worker`` processes, ``pes_per_gpu``
    on each GPU in turn (worker i on GPU i // pes_per_gpu). A context manager; ``scheduler_address``.

    ``env``: more environment for the workers (``redist.*`` settings as ``DASK_REDIST__...``);
    ``hosts``: pseudo-hosts, the workers split among them in order (`pseudo_host`: each worker's
    ``DASK_REDIST__HOST``), so that one machine takes the branches of several hosts;
    ``worker_options``: ``dask cuda worker`` options, e.g. ``device_memory_limit="256MiB"``.
    """

    def __init__(
        self,
        workers: int,
        pes_per_gpu: int,
        *,
        protocol: str = "tcp",
        env: dict | None = None,
        hosts: int = 1,
        timeout: float = 180.0,
        **worker_options,
    ):
        self.gpus = visible_gpus()
        if pes_per_gpu < 1 or workers < 1:
            raise ValueError(f"workers ({workers}) and pes_per_gpu ({pes_per_gpu}) must be at least 1")
        self.workers, self.pes_per_gpu, self.hosts = workers, pes_per_gpu, hosts
        self._device(workers - 1)  # (refuses more workers than the GPUs take)
        pseudo_host(0, workers, hosts)  # (refuses more hosts than workers)
        self.protocol = protocol
        self.env = {"NVSHMEM_SYMMETRIC_SIZE": heap_per_pe(pes_per_gpu), **(env or {})}
        self.options = [a for k, v in worker_options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
        self.timeout = timeout
        self.scheduler = None
        self.processes: list[subprocess.Popen] = []

    def _device(self, i: int) -> str:
        """The GPU of worker ``i``."""
        if why := unfit(i + 1, self.pes_per_gpu, self.gpus):
            raise ValueError(why)
        return self.gpus[i // self.pes_per_gpu]

    @property
    def scheduler_address(self) -> str:
        return self.scheduler.scheduler_address

    def __enter__(self) -> SharedGPUCluster:
        from distributed import LocalCluster

        self.scheduler = LocalCluster(n_workers=0, protocol=self.protocol, dashboard_address=None)
        try:
            self.scale(self.workers)
        except BaseException:
            self.close()
            raise
        return self

    def scale(self, workers: int) -> None:
        """Start worker processes until there are ``workers`` (never stops any); wait for them."""
        from distributed import Client

        new = range(len(self.processes), workers)
        self.processes += [self._start_worker(self._device(i), self._host(i)) for i in new]
        with Client(self.scheduler_address, set_as_default=False) as client:
            client.wait_for_workers(len(self.processes), timeout=self.timeout)

    def __exit__(self, *exc) -> None:
        self.close()

    def _host(self, i: int) -> str | None:
        """Worker ``i``'s pseudo-host (`pseudo_host`; a worker beyond ``workers`` joins the last)."""
        return pseudo_host(min(i, self.workers - 1), self.workers, self.hosts)

    def _start_worker(self, device: str, host: str | None = None) -> subprocess.Popen:
        dask = shutil.which("dask", path=os.path.dirname(sys.executable)) or shutil.which("dask")
        if dask is None:
            raise RuntimeError(
                "no `dask` command next to this Python: install distributed (and dask-cuda) here"
            )
        command = [
            dask,
            "cuda",
            "worker",
            self.scheduler_address,
            "--nthreads",
            "1",
            "--no-dashboard",
            "--death-timeout",
            "60",
            *self.options,
        ]
        env = {**os.environ, **self.env, "CUDA_VISIBLE_DEVICES": device}
        if host is not None:  # (read by the worker's own config: dask_redist.config.host)
            env["DASK_REDIST__HOST"] = host
        # a session of its own: closing the cluster signals the nanny and its worker together
        return subprocess.Popen(command, env=env, start_new_session=True)

    def close(self) -> None:
        for p in self.processes:
            _signal_group(p, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait(10)
        self.processes = []
        if self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
