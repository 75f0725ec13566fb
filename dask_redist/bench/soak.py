"""The soak: a session's worth of rechunks, with cancels, re-submits, two clients at once,
workers killed now and then and rechunks between other steps (fused with them); every invariant
checked after every step.

A user's cancel or re-run must never cost the workers (issue 15). Single tests check one
fault each; the soak draws a seeded sequence of steps (every kind in each cycle, in a
random order) over random geometries and dtypes, as a long notebook session would, and
after each step checks what the user would notice:

* the result equals the formula its input was generated from (checked on the workers);
* no worker left the cluster except the one the step killed (with CuPy chunks, also its
  GPU peers, which exit by design when left inside a reshape: counted, not a problem);
* no new error in the scheduler's or any worker's log (``Traceback``, ``Exception``, ...);
* nothing staged, no run and no early piece left on any worker.

Each worker's memory after every step is reported, and how much each kind of step grew
the workers by on average, not checked: a flat line is a judgment over a long run, not an
assertion a short CI soak could make reliably.

Every step reports one line as it ends (``progress``): what ran, on which engines, how long,
its problems; so a stall shows where it stopped. A step still running ``redist.timeouts.collective``
+ 30 s after it began is a problem of its own, reported at once with every worker's thread
stacks (dumped by `faulthandler` on a signal the worker's nanny sends, so a worker whose
interpreter is held inside a native call dumps them too). Every question the soak puts to the
cluster has a timeout. On GPUs a kill leaves the survivors stranded in an NVSHMEM world that
lost a PE; the step then does what a user is told to do, ``bootstrap(restart_broken=True)``, and
counts the restarted survivors as exited by design.

``tests/test_soak.py`` runs a short version on CPU; ``dask-redist soak`` runs one for
minutes, with CuPy chunks on a GPU cluster (``--gpu``), and exits 1 on any violation.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from typing import Callable

import numpy as np

from dask_redist.bench import kills
from dask_redist.bench.cases import Case, check, flags, generated, random_case
from dask_redist.bench.soak_report import SoakReport, Step
from dask_redist.bench.watch import StackDumps, stacks, within
from dask_redist.compat import worker_info

STEPS = ("rechunk", "cancel", "again", "clients", "kill", "pipeline")
#: Words in a worker's log that a user would take for a failure.
PROBLEMS = ("Traceback", "Exception", "Compute Failed", "KeyError")
#: Seconds any one wait of a step may take before the step counts as hung.
WAIT_S = 120.0
#: Seconds a question to the cluster (status, logs, stacks) may take.
ASK_S = 60.0
#: Seconds a step may run past ``redist.timeouts.collective`` before it is reported as stalled.
STALL_GRACE_S = 30.0


class Soak:
    """Steps on ``client``'s cluster; ``options`` go to `dask_redist.enable` for every rechunk.

    ``gpu``: the workers run the cufftmp engine (a kill strands its NVSHMEM peers); ``progress``
    is called with one line per step as it ends, and with the stacks of a stalled step.
    """

    def __init__(
        self,
        client,
        seed: int = 0,
        kind: str = "numpy",
        max_bytes: int = 2**20,
        steps=STEPS,
        gpu: bool = False,
        progress: Callable[[str], None] | None = None,
        stall_grace: float = STALL_GRACE_S,
        **options,
    ):
        if unknown := set(steps) - set(STEPS):
            raise ValueError(f"unknown soak steps {sorted(unknown)}; choose from {STEPS}")
        # every rechunk through the collective, also those `redist.min-bytes: auto` leaves to Dask
        self.client, self.kind, self.max_bytes, self.options = (
            client,
            kind,
            max_bytes,
            {"min_bytes": 0, **options},
        )
        self.kinds = tuple(steps)
        self.gpu = gpu
        self.progress = progress or (lambda line: None)
        self.stall_grace = stall_grace
        self.rng = np.random.default_rng(seed)
        self.report = SoakReport(seed)
        self._log_seen: dict[str, set[str]] = {}
        self._runs_seen: set = set()  # the scheduler's history entries counted by earlier steps
        self._second = None  # the other client of "clients" steps, made once
        self._memory: dict[str, int] = {}  # each worker's process memory after the last step

    def run(self, steps: int | None = None, minutes: float | None = None) -> SoakReport:
        """``steps`` steps, or as many as fit in ``minutes`` (whole cycles of every kind)."""
        deadline = time.monotonic() + 60 * minutes if minutes else math.inf
        self._logs_now()  # what the logs held before: not this soak's
        self._runs_now()
        within(ASK_S, self.client.register_plugin, StackDumps())
        order: list[str] = []
        try:
            while (steps is None or len(self.report.steps) < steps) and time.monotonic() < deadline:
                order = order or list(self.rng.permutation(self.kinds))
                self.step(order.pop(0))
        finally:
            if self._second is not None:
                self._second.close()
            with contextlib.suppress(Exception):
                within(ASK_S, self.client.unregister_worker_plugin, StackDumps.name)
        return self.report

    def step(self, kind: str) -> Step:
        import dask_redist

        case = random_case(self.rng, self.max_bytes)
        step = Step(len(self.report.steps), kind, case.name)
        self.report.steps.append(step)
        before = set(worker_info(self.client))
        start = time.perf_counter()
        with dask_redist.enable(**self.options):
            limit = self._stall_after()
            stall = threading.Timer(limit, self._stalled, args=(step, limit))
            stall.daemon = True
            stall.start()
            try:
                getattr(self, "_" + kind)(case, step)
            except Exception as e:
                step.problems.append(f"{type(e).__name__}: {e}".splitlines()[0][:300])
            finally:
                stall.cancel()
                stall.join()  # (a stall being reported: its stacks before the next step kills a worker)
        step.seconds = time.perf_counter() - start
        self._invariants(step, before, set(step.killed) | set(step.exited))
        self.progress(step.line())
        return step

    def _stall_after(self) -> float:
        """Seconds a step may take before it counts as stalled (under the soak's settings)."""
        from dask_redist.config import Settings

        return Settings.from_config().collective_timeout + self.stall_grace

    def _stalled(self, step: Step, limit: float) -> None:
        """The step made no progress past the collective timeout: say so now, with every worker's stacks."""
        step.problems.append(
            f"still running after {limit:g}s (redist.timeouts.collective + {self.stall_grace:g}s)"
        )
        stacks = self._stacks()
        self.progress(f"step {step.index} ({step.kind}, {step.case}) still running after {limit:g}s; stacks:")
        for worker, text in stacks.items():
            self.progress(f"--- {worker}\n{text}")

    def _stacks(self) -> dict[str, str]:
        """Every worker's thread stacks, dumped on a signal from its nanny (`dask_redist.bench.watch`)."""
        try:
            return stacks(self.client, ASK_S)
        except Exception as e:
            return {"(no worker)": f"stacks not collected: {type(e).__name__}: {e}"}

    # -- the steps (a kill records its victims in the step) ------------------------------

    def _rechunk(self, case: Case, step: Step) -> None:
        self._persist_and_check(case, step, seed=int(self.rng.integers(1 << 16)))

    def _cancel(self, case: Case, step: Step) -> None:
        """Persist, cancel after a random moment, persist the same again (same keys)."""
        self._drop_then_again(case, step, cancel=True)

    def _again(self, case: Case, step: Step) -> None:
        """The same rechunk submitted again while the last one is being released."""
        self._drop_then_again(case, step, cancel=False)

    def _drop_then_again(self, case: Case, step: Step, cancel: bool) -> None:
        seed = int(self.rng.integers(1 << 16))
        x = generated(case, seed, self.kind)
        y = x.rechunk(case.new).persist()
        time.sleep(float(self.rng.uniform(0, 0.05)))
        if cancel:
            self.client.cancel(y)
        del y
        self._persist_and_check(case, step, seed, x)

    def _clients(self, case: Case, step: Step) -> None:
        """Two clients rechunk at once (the second its own geometry)."""
        from distributed import Client

        if self._second is None:
            self._second = Client(self.client.scheduler.address, set_as_default=False)
        other = random_case(self.rng, self.max_bytes)
        seeds = [int(s) for s in self.rng.integers(1 << 16, size=2)]
        errors: list[str] = []

        def theirs():
            try:
                with self._second.as_current():
                    x = generated(other, seeds[1], self.kind)
                    y = x.rechunk(other.new).persist()
                    self._second.gather(self._second.futures_of(y), errors="raise")
                    if not check(y, other, seeds[1]):
                        errors.append(f"second client: values differ ({other.name})")
            except Exception as e:
                errors.append(f"second client: {type(e).__name__}: {e}".splitlines()[0][:300])

        t = threading.Thread(target=theirs, daemon=True)
        t.start()
        self._persist_and_check(case, step, seeds[0])
        t.join(WAIT_S)
        step.problems += errors + (["second client hung"] if t.is_alive() else [])

    def _kill(self, case: Case, step: Step) -> None:
        """A worker killed (SIGKILL, its nanny starts another) at a random moment of a rechunk."""
        seed = int(self.rng.integers(1 << 16))
        y = generated(case, seed, self.kind).rechunk(case.new).persist()
        with self._a_kill_during(y, step):
            self._wait_and_check(y, case, step, seed)

    def _pipeline(self, case: Case, step: Step) -> None:
        """A blockwise step, the rechunk and a blockwise step after it (the check) in one graph,
        so that the collective runs them in its stage and unpack tasks (issue 40); where the soak
        kills, in every other such step a worker is killed at a random moment (the restarted run
        reruns them)."""
        seed = int(self.rng.integers(1 << 16))
        x = generated(case, seed, self.kind)
        same = x.map_blocks(_same, dtype=x.dtype, meta=x._meta)
        every = flags(same.rechunk(case.new), case, seed).all()
        result = self.client.compute(every)
        kill = "kill" in self.kinds and self.rng.random() < 0.5
        with self._a_kill_during(result, step) if kill else contextlib.nullcontext():
            if not result.result(timeout=WAIT_S):
                step.problems.append("values differ")

    @contextlib.contextmanager
    def _a_kill_during(self, y, step: Step):
        """Kill a worker once the scheduler holds the graph of ``y``, after a random moment; on
        the way out, wait for its replacement (also where the body failed: the next steps need
        the cluster and, on GPUs, its world back)."""
        workers = sorted(worker_info(self.client))
        if len(workers) < 2:
            step.problems.append("a kill needs two workers")
            yield
            return
        victim = workers[int(self.rng.integers(len(workers)))]
        late = kills.until_submitted(self.client, y, WAIT_S)
        time.sleep(float(self.rng.uniform(0, 0.3)))
        kills.kill(self.client, victim)
        step.killed.append(victim)
        try:
            yield
        finally:
            lost = kills.wait_for_replacement(self.client, victim, len(workers), 3 * WAIT_S)
            step.problems += [p for p in (late, lost) if p]
            if self.gpu:
                step.exited += kills.reform_world(self.client, ASK_S)

    # -- checks ------------------------------------------------------------------------

    def _persist_and_check(self, case: Case, step: Step, seed: int, x=None) -> None:
        """Persist the rechunk and check it; again if Dask cancelled the keys resubmitted right
        after a cancel (counted in the step, not a problem).

        That is the client's doing, with or without the collective: the cancel's report can
        reach the client after the re-submit and cancel the new futures, and while a cancelled
        future of those keys lives, every new one shares its cancelled state, until a submission
        of them finishes on the scheduler. A slow first run would lose its tries, so they go on
        for `WAIT_S` (docs/benchmarks.md)."""
        from distributed.client import FuturesCancelledError

        x = generated(case, seed, self.kind) if x is None else x
        deadline, pause = time.monotonic() + WAIT_S, 0.05
        while time.monotonic() < deadline:
            y = x.rechunk(case.new).persist()
            try:
                self._wait_and_check(y, case, step, seed)
                return
            except FuturesCancelledError:
                step.cancelled_by_dask += 1
                del y
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
        step.problems.append(
            f"Dask cancelled the re-submitted rechunk for {WAIT_S:g}s ({step.cancelled_by_dask} tries)"
        )

    def _wait_and_check(self, y, case: Case, step: Step, seed: int) -> None:
        from distributed import wait

        wait(y, timeout=WAIT_S)
        if not check(y, case, seed):
            step.problems.append("values differ")

    def _invariants(self, step: Step, before: set[str], killed: set[str]) -> None:
        from dask_redist.cluster import status

        now = set(worker_info(self.client))
        lost = sorted(before - now - killed)
        if lost and killed and self.gpu:
            # a GPU peer of the killed worker may be left inside a reshape that can never finish:
            # it exits by design (redist.nvshmem.exit-when-stuck) and its nanny starts a new one
            step.exited, lost = step.exited + lost, []
            killed = killed | set(step.exited)
        if lost:
            step.problems.append(f"workers left that were not killed: {lost}")
        deadline = time.monotonic() + 10
        while (left := _leftovers(state := status(self.client))) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            step.problems.append(f"left behind: {left}")
        if state["unanswered"]:
            step.problems.append(f"workers gave no status: {state['unanswered']}")
        step.engines = [r.get("engine", "-") for r in self._runs_now(state["history"])]
        # distributed's own errors about the worker a step killed (its peers' comms to it broke)
        # are what any Dask computation logs when a worker dies: not the collective's
        try:
            step.problems += [
                f"log: {line[:300]}" for line in self._logs_now() if not any(k in line for k in killed)
            ]
        except TimeoutError as e:
            step.problems.append(f"logs not read: {e}")
        now = {w: int(i.get("metrics", {}).get("memory", 0)) for w, i in worker_info(self.client).items()}
        for w, nbytes in now.items():
            self.report.memory.setdefault(w, []).append(nbytes)
        step.memory_delta = sum(nbytes - self._memory[w] for w, nbytes in now.items() if w in self._memory)
        self._memory = now

    def _runs_now(self, history: list[dict] | None = None) -> list[dict]:
        """The scheduler's history entries (runs ended) not seen by an earlier call."""
        if history is None:
            from dask_redist.cluster import status

            history = status(self.client)["history"]
        new = [r for r in history if (r.get("token"), r.get("run"), r.get("outcome")) not in self._runs_seen]
        self._runs_seen.update((r.get("token"), r.get("run"), r.get("outcome")) for r in new)
        return new

    def _logs_now(self) -> list[str]:
        """Problem lines that reached the scheduler's and workers' logs since the last call
        (lines carry their time, so a line seen once is not counted again)."""
        logs = {"scheduler": within(ASK_S, self.client.get_scheduler_logs, n=10_000)}
        logs.update(within(ASK_S, self.client.get_worker_logs, n=10_000))
        new = []
        for source, lines in logs.items():
            seen = self._log_seen.setdefault(source, set())
            new += [f"{source}: {m}" for _, m in lines if m not in seen and any(p in m for p in PROBLEMS)]
            seen.update(m for _, m in lines)
        return new


def _same(block):
    """A blockwise step that keeps the values (a copy: a new chunk, as a user's step makes)."""
    return block.copy()


HELD = ("staged chunks", "stage keys", "early pieces", "stage events")  # (counts in a worker's status)


def _leftovers(state: dict) -> dict:
    held = {}
    for w, s in state["workers"].items():
        if n := len(s["runs"]) + sum(s.get(k, 0) for k in HELD):
            held[w] = n
    return held
