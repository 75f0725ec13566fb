"""The cluster a command runs on: a running scheduler's (``--scheduler``), or one started here."""

from __future__ import annotations

import argparse
import contextlib
import logging

from dask_redist.cli import arguments as types


#: How long a task that no worker of a cluster started here can run waits before it fails.
NO_WORKERS_TIMEOUT = "2 minutes"


@contextlib.contextmanager
def quiet_p2p_logs():
    """Dask's p2p rechunk logs every shuffle's start and end at WARNING on the scheduler (here, for a
    local cluster): silenced while the demo times it next to the collective."""
    logger = logging.getLogger("distributed.shuffle")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def client_for(args):
    """A Client to ``--scheduler``, or to a local cluster started here (CUDA with --gpu)."""
    import dask
    from distributed import Client, LocalCluster

    if args.scheduler:
        try:
            connected = Client(args.scheduler, timeout=args.wait_workers)
        except (OSError, ValueError) as e:  # (TimeoutError too; ValueError: an address it cannot read)
            raise SystemExit(
                f"dask-redist: could not reach a scheduler at {args.scheduler} within {args.wait_workers:g}s "
                f"({type(e).__name__}: {e}); check the address (e.g. tcp://host:8786) and that it is running"
            ) from None
        with connected as client:
            try:
                client.wait_for_workers(1, timeout=args.wait_workers)
            except TimeoutError:
                raise SystemExit(
                    f"dask-redist: no worker joined the scheduler at {args.scheduler} within {args.wait_workers:g}s; "
                    "start workers (`dask worker` / `dask cuda worker` with that address) or wait longer (--wait-workers)"
                ) from None
            forward_logs(client)
            yield client
        return
    if args.gpu:
        gpu_packages()
    workers = local_workers(args)
    # A worker killed (the soak's kills, a crash) is restarted by its nanny; on a loaded machine that
    # can take longer than the 15 s after which LocalCluster closes the nanny of a lost worker name
    # (distributed.deploy.lost-worker-timeout), shrinking the cluster for good. A task that no
    # worker can run (every worker gone, or the one it is pinned to) fails after
    # NO_WORKERS_TIMEOUT instead of waiting for good (2026-12-06: a bench waited 6 minutes for a
    # worker that had closed, until its command was killed).
    with dask.config.set(
        {
            "distributed.deploy.lost-worker-timeout": "1h",
            "distributed.scheduler.no-workers-timeout": NO_WORKERS_TIMEOUT,
        }
    ):
        if args.gpu and args.pes_per_gpu:
            from dask_redist.bench.gpu_cluster import SharedGPUCluster

            hosts = getattr(args, "pseudo_hosts", None) or 1
            with SharedGPUCluster(workers, args.pes_per_gpu, protocol=args.protocol, hosts=hosts) as shared:
                with Client(shared.scheduler_address) as client:
                    local_logs(client)
                    yield client
            return
        if args.gpu:
            from dask_cuda import LocalCUDACluster

            too_many_workers(workers)
            cluster = LocalCUDACluster(
                n_workers=workers,
                dashboard_address=":0",
                protocol=args.protocol,
                silence_logs=logging.CRITICAL,
            )
        else:
            cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=args.threads,
                processes=True,
                dashboard_address=":0",
                protocol=args.protocol,
                silence_logs=logging.CRITICAL,  # (the workers' records come to the log file instead)
            )
        with cluster, Client(cluster) as client:
            client.wait_for_workers(workers)
            local_logs(client)
            yield client


def forward_logs(client) -> None:
    """The workers' records of distributed and dask-redist (warnings and worse) come to this process,
    where the command's log file takes them (`cli.output.logs_to_file`); a worker that replaces a
    killed one too (a worker plugin)."""
    from dask_redist.cli.output import LOGGERS

    for name in LOGGERS:
        client.forward_logging(name, level=logging.WARNING)


def local_logs(client) -> None:
    """For a cluster started here: each worker appends its records (warnings and worse) to the
    command's log file itself (`cli.output.WorkerLogFile`), a worker that replaces a killed one too;
    without a log file, they are forwarded."""
    from dask_redist.cli.output import WorkerLogFile, current_log_file

    if path := current_log_file():
        client.register_plugin(WorkerLogFile(path))
    else:
        forward_logs(client)


def gpu_packages() -> None:
    """Refuse ``--gpu`` where CuPy or dask-cuda is not installed, saying how to get them."""
    import importlib.util

    if missing := [m for m in ("cupy", "dask_cuda") if importlib.util.find_spec(m) is None]:
        raise SystemExit(
            f"dask-redist: --gpu starts dask-cuda workers with CuPy chunks, and {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed here: pip install -e '.[gpu]' in the clone "
            "(CUDA 13; dask-redist is not on PyPI: docs/deployment.md#install), or leave out --gpu"
        )


def local_workers(args) -> int:
    """The local cluster's workers: ``--workers``, else one per visible GPU (``--pes-per-gpu``
    each) with ``--gpu``, else the command's own default."""
    if args.workers is not None:
        return args.workers
    if args.gpu:
        from dask_redist.bench.gpu_cluster import visible_gpus

        return len(visible_gpus()) * (args.pes_per_gpu or 1)
    return args.cpu_workers


def too_many_workers(workers: int) -> None:
    """Refuse, with what to do instead, more LocalCUDACluster workers than visible GPUs (dask-cuda
    says only "Can not scale beyond visible devices")."""
    from dask_redist.bench.gpu_cluster import unfit, visible_gpus

    if why := unfit(workers, 1, visible_gpus()):
        raise SystemExit(f"dask-redist: {why}")


def cluster_args(p: argparse.ArgumentParser, workers: int = 2):
    p.add_argument(
        "--scheduler",
        type=types.scheduler_address,
        help="address of a running scheduler, e.g. tcp://host:8786, or its scheduler file (dask scheduler --scheduler-file) (default: start a local cluster)",
    )
    p.add_argument(
        "--wait-workers",
        type=types.positive_float,
        default=60.0,
        metavar="SECONDS",
        help="with --scheduler: how long to wait for the scheduler, then for its first worker (default 60)",
    )
    p.add_argument(
        "--workers",
        type=types.at_least(1),
        help=f"workers of the local cluster (default {workers}; with --gpu, one per visible GPU, times --pes-per-gpu)",
    )
    p.set_defaults(cpu_workers=workers)
    p.add_argument(
        "--threads", type=types.at_least(1), default=1, help="threads per worker of the local CPU cluster"
    )
    p.add_argument("--gpu", action="store_true", help="LocalCUDACluster and CuPy chunks")
    p.add_argument(
        "--pes-per-gpu",
        type=types.at_least(1),
        metavar="N",
        help="with --gpu: start --workers `dask cuda worker` processes, N sharing each GPU (one NVSHMEM PE each): "
        "values, faults and restarts as on separate GPUs, but not their speed",
    )
    p.add_argument(
        "--pseudo-hosts",
        type=types.at_least(1),
        metavar="N",
        help="with --pes-per-gpu: split the workers into N pseudo-hosts in order (DASK_REDIST__HOST=hostA, "
        "hostB, ...): one machine taking the branches of N hosts (docs/scale.md)",
    )
    p.add_argument("--protocol", type=types.protocol, default="tcp", help="tcp or ucx (local cluster)")
    p.add_argument(
        "--log-file",
        metavar="PATH",
        help="where the logs of distributed and dask-redist go (default: a new file in the temporary "
        "directory, named when the command starts); the terminal shows the command's own output only",
    )
