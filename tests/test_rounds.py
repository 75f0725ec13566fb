"""Aborted runs are completed, dry, by every rank (`dask_redist.engines.rounds`).

Ranks are threads sharing a stand-in for NVSHMEM (`Fabric`): a round's reshape completes
on every rank once every rank has queued it, and never if one rank does not. What must
hold, wherever each rank sees the abort: every rank queues every round, none is left
stuck, and each raises the abort's error (or its own) once all rounds are done; only a
rank that is gone leaves the others stuck, after the drain.
"""

from __future__ import annotations

import threading
import time

import pytest

from dask_redist.core.run import WorkerRun
from dask_redist.engines import rounds as module
from dask_redist.engines.rounds import Rounds
from dask_redist.errors import RedistError

ROUNDS = 40


class Fabric:
    """Round k completes once all ``nranks`` ranks queued it (as an NVSHMEM reshape does)."""

    def __init__(self, nranks: int):
        self.nranks = nranks
        self.queued: dict[int, set[int]] = {}
        self.lock = threading.Lock()

    def queue(self, rank: int, k: int) -> "Done":
        with self.lock:
            self.queued.setdefault(k, set()).add(rank)
        return Done(lambda: len(self.queued[k]) == self.nranks)

    def last(self, rank: int) -> "Done":
        """After everything ``rank`` queued so far (a stream's order)."""
        with self.lock:
            mine = [k for k, ranks in self.queued.items() if rank in ranks]
        return Done(lambda: all(len(self.queued[k]) == self.nranks for k in mine))


class Done:
    def __init__(self, test):
        self._test = test

    @property
    def done(self) -> bool:
        return self._test()


class Run:
    """What `Rounds` reads of a `WorkerRun` (its ``must_stop`` is the real one)."""

    must_stop = WorkerRun.must_stop
    failure = WorkerRun.failure

    def __init__(self, rank: int):
        self.rank, self.state, self.error, self.gone = rank, "running", None, ()
        self.completes_when_aborted, self.timeout = True, 30.0

    def name(self) -> str:
        return f"run 1 rank {self.rank}"

    def fail(self, error, gone=()):
        self.gone = tuple(gone)
        self.state, self.error = "failed", error


def rank_thread(fabric: Fabric, run: Run, outcome: dict, on_round=None):
    """A rank executing ``ROUNDS`` rounds as the cufftmp engine does; ``outcome[rank]``: what
    happened (the error raised, the rounds whose copies ran, whether the device is stuck)."""
    rounds = Rounds(lambda: fabric.last(run.rank))
    copied = []

    def exchange(k):
        rounds.queued(fabric.queue(run.rank, k))

    def work(k, go):
        if on_round:
            on_round(run, k)
        copied.append(k)
        time.sleep(0.001 * (run.rank + 1))  # ranks at different speeds: they see an abort at different rounds
        go()

    def body():
        error = None
        try:
            rounds.run(run, ROUNDS, exchange, work)
            rounds.wait(run)
        except Exception as e:
            error = e
        outcome[run.rank] = {
            "error": error,
            "copied": copied,
            "stuck": rounds.stuck,
            "in flight": rounds.in_flight_since,
        }

    return threading.Thread(target=body, daemon=True)


def run_ranks(fabric, runs, on_round=None, timeout=20) -> dict:
    outcome = {}
    threads = [rank_thread(fabric, r, outcome, on_round) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank never returned"
    return outcome


def test_ranks_that_see_an_abort_at_different_rounds_all_complete_it():
    fabric = Fabric(3)
    runs = [Run(r) for r in range(3)]
    abort_at = {0: 5, 1: 17, 2: 29}  # the same abort, seen by each rank after a different round

    def on_round(run, k):
        if k == abort_at[run.rank]:
            run.fail(RedistError("cancelled"))

    outcome = run_ranks(fabric, runs, on_round)
    for rank, got in outcome.items():
        assert isinstance(got["error"], RedistError) and "cancelled" in str(got["error"]), got
        assert not got["stuck"]
        assert got["copied"] == list(range(abort_at[rank] + 1))  # copies stop at the abort
        assert got["in flight"] is None  # nothing left queued
    assert all(fabric.queued[k] == {0, 1, 2} for k in range(ROUNDS))  # every reshape queued by all


def test_a_run_aborted_before_a_rank_started_is_completed_by_that_rank_too():
    fabric = Fabric(2)
    runs = [Run(0), Run(1)]
    runs[1].fail(RedistError("released"))  # rank 1 got the abort before its first round
    outcome = run_ranks(fabric, runs, lambda run, k: k == 3 and run.fail(RedistError("released")))
    assert outcome[1]["copied"] == [] and outcome[0]["copied"] == [0, 1, 2, 3]
    assert not outcome[0]["stuck"] and not outcome[1]["stuck"]
    assert all(fabric.queued[k] == {0, 1} for k in range(ROUNDS))


def test_a_rank_whose_own_work_fails_completes_the_rounds_then_raises_its_error():
    fabric = Fabric(2)
    runs = [Run(0), Run(1)]

    def on_round(run, k):
        if run.rank == 0 and k == 7:
            raise ValueError("a copy failed")

    outcome = run_ranks(fabric, runs, on_round)
    assert isinstance(outcome[0]["error"], ValueError) and outcome[0]["copied"] == list(range(7))
    assert outcome[1]["error"] is None and outcome[1]["copied"] == list(range(ROUNDS))
    assert not outcome[0]["stuck"] and not outcome[1]["stuck"]


@pytest.mark.parametrize("peer_comes_back", [False, True])
def test_with_a_rank_gone_the_queued_rounds_drain_then_the_device_is_stuck(monkeypatch, peer_comes_back):
    """Rank 1 stops queuing (its process died); rank 0's run is aborted naming it gone: rank 0
    does not complete the run (nothing would), drains what it queued for `DRAIN_S`, and is
    stuck unless those rounds complete meanwhile."""
    monkeypatch.setattr(module, "DRAIN_S", 0.5)
    fabric = Fabric(2)
    run = Run(0)
    died_at = 3

    def on_round(run, k):
        if k == died_at + 2:
            run.fail(RedistError("workers ['tcp://b'] left"), gone=["tcp://b"])

    for k in range(died_at):
        fabric.queue(1, k)
    if peer_comes_back:  # (its last rounds got queued after all, say by a driver finishing them)
        threading.Timer(0.2, lambda: [fabric.queue(1, k) for k in range(died_at, ROUNDS)]).start()
    start = time.monotonic()
    outcome = run_ranks(fabric, [run], on_round)
    got = outcome[0]
    assert isinstance(got["error"], RedistError) and "left" in str(got["error"])
    assert got["stuck"] is not peer_comes_back
    assert max(k for k, ranks in fabric.queued.items() if 0 in ranks) < ROUNDS - 1  # not completed
    assert time.monotonic() - start < 5  # the drain, not the collective timeout


def test_a_worker_run_must_stop_only_when_aborted_and_not_completable():
    run = Run(0)
    assert not run.must_stop()
    run.fail(RedistError("cancelled"))
    assert not run.must_stop()
    run.completes_when_aborted = False  # e.g. the dask engine: nothing to complete
    assert run.must_stop()
    run.completes_when_aborted = True
    run.fail(RedistError("left"), gone=["tcp://b"])
    assert run.must_stop()


def test_the_time_waiting_for_a_place_in_the_queue_is_counted_per_run():
    """`Rounds.ahead_s`: what the engine reports as the host's waiting (its statistics' "host
    waiting ms"), counted from `next_round` until the oldest round is done, reset by each run."""
    released, done_at = threading.Event(), []
    rounds = Rounds(lambda: Done(released.is_set))
    for _ in range(module.ROUNDS_AHEAD):  # the queue full
        rounds.queued(Done(released.is_set))

    def release():
        time.sleep(0.05)
        done_at.append(time.monotonic())
        released.set()

    threading.Thread(target=release, daemon=True).start()
    called = time.monotonic()
    assert rounds.next_round(Run(0)) is True
    assert rounds.ahead_s >= done_at[0] - called > 0
    rounds.reset()
    assert rounds.ahead_s == 0.0
