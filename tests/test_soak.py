"""The soak, short: every kind of step (a plain rechunk, a cancel then the same again, a re-submit
while the last one is released, two clients at once, a worker killed mid-rechunk, a rechunk fused
with the steps around it, a worker killed in half of those) over random
geometries and dtypes, with the invariants of `dask_redist.bench.soak` checked after each step.

A cluster of its own: steps kill workers. ``REDIST_SOAK_STEPS`` and ``REDIST_SOAK_SEED`` make it
longer or another sequence; a failure names the seed and the step.
"""

from __future__ import annotations

import os

import pytest

from conftest import local_cluster

from dask_redist.bench.soak import STEPS, Soak


def test_soak_every_step_keeps_every_invariant():
    from distributed import Client

    seed = int(os.environ.get("REDIST_SOAK_SEED", "20261201"))
    steps = int(os.environ.get("REDIST_SOAK_STEPS", str(2 * len(STEPS))))
    with local_cluster(3, threads_per_worker=2) as cluster, Client(cluster) as client:
        client.wait_for_workers(3)
        report = Soak(client, seed=seed).run(steps=steps)
    assert {s.kind for s in report.steps} == set(STEPS)  # every kind ran
    assert len(report.steps) == steps
    assert report.problems == [], f"seed {seed}: " + "\n".join(report.problems)


def test_soak_command_reports_and_exits_zero(capsys):
    from dask_redist.cli import main

    assert main(["soak", "--steps", "4", "--workers", "2", "--seed", "7", "--kinds", "rechunk", "again"]) == 0
    out = capsys.readouterr().out
    assert "0 problems" in out and "again" in out and "rechunk" in out
    # one line per step as it goes, naming the engine that ran
    assert [line.split()[1] for line in out.splitlines() if line.startswith("step ")] == ["0", "1", "2", "3"]
    assert "engines dask" in out


@pytest.mark.parametrize("engine", ["engines:SleepingEngine", "engines:BrieflySleepingEngine"])
def test_a_stalled_step_is_reported_with_the_workers_stacks(engine):
    """A step still running past redist.timeouts.collective (+ the grace) is a problem at once, with
    every worker's thread stacks, also of a rank that no abort reaches (here asleep in its engine);
    a step that ends while its stacks are taken waits for them (the next step may kill a worker)."""
    from distributed import Client

    lines = []
    with local_cluster(2, threads_per_worker=2) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        soak = Soak(
            client,
            seed=3,
            steps=("rechunk",),
            progress=lines.append,
            stall_grace=1.0,
            engine=engine,
            timeouts={"collective": "1s"},
        )
        report = soak.run(steps=1)
    assert any("still running after 2s" in p for p in report.problems), report.problems
    dumped = "\n".join(lines)
    assert "Thread" in dumped and "engines.py" in dumped and "in execute" in dumped, dumped[-3000:]
    assert lines[-1].startswith("step    0 rechunk"), lines[-1]


def test_soak_refuses_unknown_step_kinds():
    with pytest.raises(ValueError, match="unknown soak steps"):
        Soak(client=None, steps=("rechunk", "explode"))


def test_a_kill_where_no_world_lost_a_member_reforms_nothing():
    """Found at 2 pseudo-hosts on one H200 (issue 44): the soak's kill steps on GPUs re-formed the
    NVSHMEM world after every kill (`kills.reform_world`), also where the runs took an engine
    without one (hybrid across hosts no world spans): the bootstrap was refused, a problem per
    kill. With no world stranded there is nothing to re-form."""
    from distributed import Client

    with local_cluster(2, threads_per_worker=1) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        report = Soak(client, seed=44, steps=("kill",), gpu=True, engine="dask").run(steps=2)
    assert [s.kind for s in report.steps] == ["kill", "kill"] and all(s.killed for s in report.steps)
    assert report.problems == [], "\n".join(report.problems)
    assert not any(s.exited for s in report.steps)  # (no worker restarted by a bootstrap)
