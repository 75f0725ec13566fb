"""The soak (`dask_redist.bench.soak.Soak`) with the `hybrid` engine on CPU worker processes of two
pseudo-hosts: the test suite's stand-in for GPUs (tests/hybrid_cpu.py: shared memory for GPU
memory and CUDA IPC), the engine's own all-gathers, routes and faults. Where the GPU soak across
pseudo-hosts (`tools/gpu/pseudo-hosts.sh soak`) finds a problem, this brings it to a CPU machine.

    PYTHONPATH=tests python benchmarks/hybrid_cpu_soak.py [--steps 150] [--seed 1]
        [--kinds cancel again]   # default: every kind

`redist.timeouts.collective` 10 s and `redist.timeouts.bootstrap` 20 s, so that a stall shows
as a step of 20 s or more (the soak reports it, with every worker's stacks); one line per step,
then the problems. Found the `hybrid` engine's stall after a cancel between two all-gathers
(docs/scale.md).
"""

from __future__ import annotations

import argparse
import sys
import time

import dask
from conftest import pseudo_hosts_cluster
from distributed import Client

from dask_redist.bench.soak import STEPS, Soak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kinds", nargs="+", default=list(STEPS), choices=STEPS)
    args = p.parse_args()
    settings = {
        "redist.timeouts.collective": "10s",
        "redist.timeouts.bootstrap": "20s",
        # (a nanny whose worker was killed must be left to start another: see dask_redist.cli.clusters)
        "distributed.deploy.lost-worker-timeout": "1h",
    }
    with dask.config.set(settings):
        with pseudo_hosts_cluster(("hostA", "hostA", "hostB", "hostB")) as cluster, Client(cluster) as client:
            client.wait_for_workers(4)
            soak = Soak(
                client,
                seed=args.seed,
                steps=tuple(args.kinds),
                progress=lambda line: print(line, flush=True),
                stall_grace=5,
                engine="hybrid_cpu:CpuHybridEngine",
            )
            start = time.monotonic()
            report = soak.run(steps=args.steps)
    problems = [p for s in report.steps for p in s.problems]
    print(f"{len(problems)} problems in {len(report.steps)} steps, {time.monotonic() - start:.1f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
