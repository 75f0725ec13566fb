"""The soak: a session's worth of rechunks, with cancels, re-submits, two clients at once and
workers killed now and then; every invariant checked after every step.

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

``tests/test_soak.py`` runs a short version on CPU; ``dask-redist soak`` runs one for
minutes, with CuPy chunks on a GPU cluster (``--gpu``), and exits 1 on any violation.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field

import dask.array as da
import numpy as np

from dask_redist.bench.cases import Case, make_block, check

STEPS = ("rechunk", "cancel", "again", "clients", "kill")
DTYPES = ("float64", "float32", "int8", "complex128", "float16", "bool")
#: Words in a worker's log that a user would take for a failure.
PROBLEMS = ("Traceback", "Exception", "Compute Failed", "KeyError")
#: Seconds any one wait of a step may take before the step counts as hung.
WAIT_S = 120.0


@dataclass
class Step:
    index: int
    kind: str
    case: str
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    cancelled_by_dask: int = 0  # re-submits Dask cancelled right after a cancel (not a problem)
    memory_delta: int = 0  # bytes the workers alive before and after the step grew by, together
    exited: list[str] = field(default_factory=list)  # GPU peers of a killed worker that exited (by design)


@dataclass
class SoakReport:
    seed: int
    steps: list[Step] = field(default_factory=list)
    memory: dict[str, list[int]] = field(default_factory=dict)  # worker -> process memory after each step

    @property
    def problems(self) -> list[str]:
        return [f"step {s.index} ({s.kind}, {s.case}): {p}" for s in self.steps for p in s.problems]


def random_case(rng: np.random.Generator, max_bytes: int) -> Case:
    """A random geometry (1-3 axes, uneven chunks) of at most ``max_bytes``, old and new chunks differing."""
    dtype = str(rng.choice(DTYPES))
    ndim = int(rng.integers(1, 4))
    side = max(2, int((max_bytes / np.dtype(dtype).itemsize) ** (1 / ndim)))
    shape = tuple(int(rng.integers(2, side + 1)) for _ in range(ndim))

    def chunks():
        return tuple(_split(rng, n) for n in shape)

    old, new = chunks(), chunks()
    while new == old:
        new = chunks()
    return Case(f"{shape} {dtype} {tuple(map(len, old))}->{tuple(map(len, new))} chunks", shape, dtype, old, new)


def _split(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    parts = int(rng.integers(1, min(n, 8) + 1))
    cuts = np.sort(rng.choice(np.arange(1, n), parts - 1, replace=False)) if parts > 1 else np.array([], int)
    return tuple(int(c) for c in np.diff(np.concatenate([[0], cuts, [n]])))


def generated(case: Case, seed: int, kind: str) -> da.Array:
    """The case's input, persisted wherever Dask puts it (recomputable if its worker dies)."""
    meta = np.empty((0,) * len(case.shape), dtype=case.dtype)
    if kind == "cupy":
        import cupy

        meta = cupy.empty((0,) * len(case.shape), dtype=case.dtype)
    template = da.zeros(case.shape, chunks=case.old, dtype=np.int8)
    return template.map_blocks(_block, case.dtype, seed, case.shape, kind, dtype=case.dtype, meta=meta).persist()


def _block(template, dtype, seed, global_shape, kind, block_info=None):
    lower = [lo for lo, _ in block_info[0]["array-location"]]
    return make_block(dtype, seed, template.shape, lower, global_shape, kind)


class Soak:
    """Steps on ``client``'s cluster; ``options`` go to `dask_redist.enable` for every rechunk."""

    def __init__(self, client, seed: int = 0, kind: str = "numpy", max_bytes: int = 2**20, steps=STEPS, **options):
        if unknown := set(steps) - set(STEPS):
            raise ValueError(f"unknown soak steps {sorted(unknown)}; choose from {STEPS}")
        # every rechunk through the collective, also those `redist.min-bytes: auto` leaves to Dask
        self.client, self.kind, self.max_bytes, self.options = client, kind, max_bytes, {"min_bytes": 0, **options}
        self.kinds = tuple(steps)
        self.rng = np.random.default_rng(seed)
        self.report = SoakReport(seed)
        self._log_seen: dict[str, set[str]] = {}
        self._second = None  # the other client of "clients" steps, made once
        self._memory: dict[str, int] = {}  # each worker's process memory after the last step

    def run(self, steps: int | None = None, minutes: float | None = None) -> SoakReport:
        """``steps`` steps, or as many as fit in ``minutes`` (whole cycles of every kind)."""
        deadline = time.monotonic() + 60 * minutes if minutes else math.inf
        self._logs_now()  # what the logs held before: not this soak's
        order: list[str] = []
        try:
            while (steps is None or len(self.report.steps) < steps) and time.monotonic() < deadline:
                order = order or list(self.rng.permutation(self.kinds))
                self.step(order.pop(0))
        finally:
            if self._second is not None:
                self._second.close()
        return self.report

    def step(self, kind: str) -> Step:
        import dask_redist

        case = random_case(self.rng, self.max_bytes)
        step = Step(len(self.report.steps), kind, case.name)
        self.report.steps.append(step)
        before = set(self.client.scheduler_info(n_workers=-1)["workers"])
        start = time.perf_counter()
        killed: set[str] = set()
        try:
            with dask_redist.enable(**self.options):
                killed = getattr(self, "_" + kind)(case, step)
        except Exception as e:
            step.problems.append(f"{type(e).__name__}: {e}".splitlines()[0][:300])
        step.seconds = time.perf_counter() - start
        self._invariants(step, before, killed)
        return step

    # -- the steps: each returns the workers it killed ----------------------------------

    def _rechunk(self, case: Case, step: Step) -> set[str]:
        self._persist_and_check(case, step, seed=int(self.rng.integers(1 << 16)))
        return set()

    def _cancel(self, case: Case, step: Step) -> set[str]:
        """Persist, cancel after a random moment, persist the same again (same keys)."""
        return self._drop_then_again(case, step, cancel=True)

    def _again(self, case: Case, step: Step) -> set[str]:
        """The same rechunk submitted again while the last one is being released."""
        return self._drop_then_again(case, step, cancel=False)

    def _drop_then_again(self, case: Case, step: Step, cancel: bool) -> set[str]:
        seed = int(self.rng.integers(1 << 16))
        x = generated(case, seed, self.kind)
        y = x.rechunk(case.new).persist()
        time.sleep(float(self.rng.uniform(0, 0.05)))
        if cancel:
            self.client.cancel(y)
        del y
        self._persist_and_check(case, step, seed, x)
        return set()

    def _clients(self, case: Case, step: Step) -> set[str]:
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
        return set()

    def _kill(self, case: Case, step: Step) -> set[str]:
        """A worker killed (SIGKILL, its nanny starts another) at a random moment of a rechunk."""
        workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
        if len(workers) < 2:
            step.problems.append("a kill needs two workers")
            return set()
        victim = workers[int(self.rng.integers(len(workers)))]
        seed = int(self.rng.integers(1 << 16))
        x = generated(case, seed, self.kind)
        y = x.rechunk(case.new).persist()
        time.sleep(float(self.rng.uniform(0, 0.3)))
        self.client.run(_die, workers=[victim], wait=False)
        self._wait_and_check(y, case, step, seed)
        self.client.wait_for_workers(len(workers), timeout=WAIT_S)
        return {victim}

    # -- checks ------------------------------------------------------------------------

    def _persist_and_check(self, case: Case, step: Step, seed: int, x=None) -> None:
        """Persist the rechunk and check it; again if Dask cancelled the keys resubmitted right
        after a cancel (counted in the step, not a problem).

        That is the client's doing, with or without the collective (a CPU LocalCluster, plain
        Dask, 2026-12-01): the cancel's report can reach the client after the re-submit and
        cancel the new futures, and while a cancelled future of those keys lives, every new
        one shares its cancelled state, until a submission of them finishes on the scheduler.
        So a slow first run (the GPU soak's step 0, bootstrapping NVSHMEM) lost 50 tries in
        2.5 s; the tries now go on for `WAIT_S`."""
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
        step.problems.append(f"Dask cancelled the re-submitted rechunk for {WAIT_S:g}s ({step.cancelled_by_dask} tries)")

    def _wait_and_check(self, y, case: Case, step: Step, seed: int) -> None:
        from distributed import wait

        wait(y, timeout=WAIT_S)
        if not check(y, case, seed):
            step.problems.append("values differ")

    def _invariants(self, step: Step, before: set[str], killed: set[str]) -> None:
        from dask_redist.api import status

        now = set(self.client.scheduler_info(n_workers=-1)["workers"])
        lost = sorted(before - now - killed)
        if lost and killed and self.kind == "cupy":
            # a GPU peer of the killed worker may be left inside a reshape that can never finish:
            # it exits by design (redist.nvshmem.exit-when-stuck) and its nanny starts a new one
            step.exited, lost = lost, []
            killed = killed | set(step.exited)
        if lost:
            step.problems.append(f"workers left that were not killed: {lost}")
        deadline = time.monotonic() + 10
        while (left := _leftovers(status(self.client))) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            step.problems.append(f"left behind: {left}")
        # distributed's own errors about the worker a step killed (its peers' comms to it broke)
        # are what any Dask computation logs when a worker dies: not the collective's
        step.problems += [f"log: {line[:300]}" for line in self._logs_now() if not any(k in line for k in killed)]
        now = {w: int(i.get("metrics", {}).get("memory", 0)) for w, i in self.client.scheduler_info(n_workers=-1)["workers"].items()}
        for w, nbytes in now.items():
            self.report.memory.setdefault(w, []).append(nbytes)
        step.memory_delta = sum(nbytes - self._memory[w] for w, nbytes in now.items() if w in self._memory)
        self._memory = now

    def _logs_now(self) -> list[str]:
        """Problem lines that reached the scheduler's and workers' logs since the last call
        (lines carry their time, so a line seen once is not counted again)."""
        logs = {"scheduler": self.client.get_scheduler_logs(n=10_000)}
        logs.update(self.client.get_worker_logs(n=10_000))
        new = []
        for source, lines in logs.items():
            seen = self._log_seen.setdefault(source, set())
            new += [f"{source}: {m}" for _, m in lines if m not in seen and any(p in m for p in PROBLEMS)]
            seen.update(m for _, m in lines)
        return new


def _leftovers(state: dict) -> dict:
    held = {}
    for w, s in state["workers"].items():
        if n := s["staged chunks"] + s["stage keys"] + len(s["runs"]) + s["early pieces"]:
            held[w] = n
    return held


async def _die() -> None:  # a coroutine: Client.run(wait=False) takes only those
    os.kill(os.getpid(), signal.SIGKILL)
