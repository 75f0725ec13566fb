"""The benchmark harness: every rechunk method on the same placed input, results checked.

Every repetition builds a fresh input (new keys, so nothing is cached) and times

    y = x.rechunk(new).persist(); wait(y)

(with CuPy chunks, until every worker's GPU has finished too: `computed`) for each method,
after one untimed warm-up; then checks the result on the workers
(`dask_redist.bench.cases.check`). Results render as Markdown and JSON with the
command, the machine and the date beside every figure.
"""

from __future__ import annotations

import math
import platform
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone

import dask
import numpy as np
from dask.utils import format_bytes

from dask_redist.bench.cases import METHODS, Case, check, contiguous, placed_array, worker_addresses
from dask_redist.bench.floor import floor_row
from dask_redist.bench.gpu_state import added_text, gpu_memory_of, gpus_idle
from dask_redist.compat import worker_info


@dataclass
class Result:
    case: str
    method: str
    nbytes: int
    nchunks_in: int
    nchunks_out: int
    times: list[float] = field(default_factory=list)
    correct: bool | None = None
    error: str | None = None
    peak_gpu_bytes: dict | None = None  # per worker: GPU memory the warm-up run added
    gpu_cached_bytes: dict | None = None  # per worker: of that, free blocks CuPy's pool kept after it
    gpu_array_peak_bytes: dict | None = None  # per worker: the most its CuPy arrays held at once, input aside
    ceiling_s: float | None = None  # the case's bytes crossing GPUs at the peer-copy rate
    engine_stats: dict | None = (
        None  # the engine's statistics per worker (cufftmp: the last run's stage/reshape/unstage ms)
    )
    timeline: list | None = None  # collective: (ms since submit, event) of the last timed run
    note: str | None = None
    floor_s: float | None = None  # the median of Dask's floor for the case's chunk count (`relate_to_floor`)

    def _engine_note(self) -> str:
        if not self.engine_stats:
            return ""
        last = [s["last"] for s in self.engine_stats.values() if s.get("last")]
        if not last:
            return ""
        keys = ("stage ms", "reshape ms", "unstage ms", "host queuing ms", "host waiting ms")
        worst = {k: max(x[k] for x in last) for k in keys if all(k in x for x in last)}
        arena = f", arena {format_bytes(last[0]['arena bytes'])}" if last[0].get("arena bytes") else ""
        steps = ""
        if all("mapped MiB" in x for x in last):  # (CUDA IPC maps a chunk's whole allocation)
            steps = f"; mapped up to {max(x['mapped MiB'] for x in last):.0f} MiB of peers' memory"
        if all("steps ms" in x for x in last):  # (PEs on one GPU: `engines.cufftmp.peers`)
            slowest = {k: max(x["steps ms"].get(k, 0.0) for x in last) for k in last[0]["steps ms"]}
            through = f" (all-gathers through {last[0]['all-gathers']})" if "all-gathers" in last[0] else ""
            steps += f"; slowest rank's steps ms{through}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in slowest.items()
            )
        routes = ""
        if all("bytes by ipc" in x for x in last):  # (the routes of pieces per pair of workers)
            ipc, comms = (sum(x[f"bytes by {k}"] for x in last) for k in ("ipc", "comms"))
            routes = f"; {format_bytes(ipc)} through CUDA IPC, {format_bytes(comms)} over comms"
        times = "; " + ", ".join(f"{k} {v:.2f}" for k, v in worst.items()) if worst else ""
        return f"{last[0]['layout']}, {last[0].get('rounds', 1)} round(s){arena}{times}{steps}{routes}"

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    def row(self) -> dict:
        t = sorted(self.times)
        return {
            "case": self.case,
            "method": self.method,
            "median": _seconds(self.median) if self.times else "unsupported" if self.error else "-",
            "min .. max": f"{_seconds(t[0])} .. {_seconds(t[-1])}" if t else "",
            "runs": len(t),
            "GB/s": f"{self.nbytes / self.median / 1e9:.2f}" if self.times and self.method != "floor" else "",
            "x floor": f"{self.median / self.floor_s:.2f}" if self.times and self.floor_s else "",
            "checked": {True: "equal", False: "WRONG", None: "-"}[self.correct],
            "of ceiling": f"{self.ceiling_s / self.median:.0%}" if self.times and self.ceiling_s else "",
            "GPU mem +": added_text(self.peak_gpu_bytes, self.gpu_cached_bytes, self.gpu_array_peak_bytes),
            "note": (self.error or self.note or self._engine_note())[:160],
        }


def _seconds(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def _method_context(method: str):
    """(context manager, dask's rechunk method) for a method name; ``-ucx`` only names the cluster.

    ``redist-*`` rows time the collective itself, also where ``redist.min-bytes: auto`` (the
    default) would leave the rechunk to Dask: ``min_bytes=0``. ``enabled`` times what a user's
    ``dask_redist.enable()`` does: the cost model chooses between the two.
    """
    import dask_redist

    method = method.removesuffix("-ucx")
    if method == "enabled":
        return dask_redist.enable(), None
    if method.startswith("redist-"):
        return dask_redist.enable(engine=method.split("-", 1)[1], min_bytes=0), None
    return nullcontext(), method


def crossing_bytes(case: Case, nworkers: int, placement=contiguous) -> int:
    """Bytes that the collective's plan moves from one worker to another, in the busiest direction."""
    from dask_redist.planning import RechunkSpec, make_plan

    n = math.prod(map(len, case.old))
    in_ranks = [placement(i, n, nworkers) for i in range(n)]
    traffic = make_plan(
        RechunkSpec(case.old, case.new, np.dtype(case.dtype).itemsize), in_ranks, nworkers
    ).traffic
    np.fill_diagonal(traffic, 0)
    return int(traffic.max(initial=0))


def computed(client, y, kind: str) -> None:
    """``wait(y)``, and for CuPy chunks until every worker's GPU has finished them too: a task
    returns its chunk while the kernels computing it may still run (Dask's blockwise steps queue
    theirs and return; the collective waits for its inputs), so a timer stopped at ``wait`` alone
    would leave some methods' GPU work out of their time and count it in others'. Raises the
    first failed chunk's error (``wait`` does not): a failed run is no time."""
    from distributed import futures_of, wait

    futures = futures_of(y)
    wait(futures)
    if failed := next((f for f in futures if f.status == "error"), None):
        failed.result()
    gpus_idle(client, kind)


def run_case(
    client,
    case: Case,
    methods=METHODS,
    reps: int = 3,
    kind: str = "numpy",
    ceiling: dict | None = None,
    interleave: bool = False,
) -> list[Result]:
    """Time every method on the case: one warm-up, then ``reps`` timed runs on fresh inputs.

    ``ceiling`` is `dask_redist.bench.baselines.link_ceiling`'s measurement; with it every
    row gets the fraction of the physical ceiling it reached. ``interleave``: the methods take
    turns, one run each (A B A B ...), so that a machine whose speed drifts slows them alike.
    """
    nworkers = len(worker_addresses(client))
    ceiling_s = crossing = None
    if ceiling and "peer GB/s per direction" in ceiling:
        crossing = crossing_bytes(case, nworkers)
        ceiling_s = crossing / (ceiling["peer GB/s per direction"] * 1e9)
    results, timed = [], []
    for method in methods:
        r = Result(
            case.name, method, case.nbytes, math.prod(map(len, case.old)), math.prod(map(len, case.new))
        )
        r.ceiling_s = ceiling_s
        results.append(r)
        if not _measured_apart(client, case, r, reps, kind, nworkers, ceiling, crossing):
            timed.append(r)
    order = (
        [(rep, r) for rep in range(reps + 1) for r in timed]
        if interleave
        else [(rep, r) for r in timed for rep in range(reps + 1)]
    )
    for rep, r in order:
        if r.error is None:
            _timed_run(client, case, r, rep, kind)
    for r in timed:
        if r.method.startswith("redist-") and r.times:
            r.engine_stats = engine_stats(client, r.method.removesuffix("-ucx").split("-", 1)[1]) or None
    return results


def _note_choice(r: Result, ran: str) -> None:
    """Say in ``r``'s note what ``enable()`` ran (under ``redist.min-bytes: auto``, the cost model's
    choice); both, where the runs differed."""
    r.note = f"enable() ran {ran}" if not r.note or ran in r.note else "enable() ran both, run by run"


def _measured_apart(
    client, case: Case, r: Result, reps: int, kind: str, nworkers: int, ceiling, crossing
) -> bool:
    """Fill the rows that are not a timed rechunk (ceiling, nvmath, floor); False for the others."""
    if r.method == "ceiling":
        if r.ceiling_s is None:
            r.error = "no ceiling measured (needs two GPUs in the benchmark process)"
        else:
            r.times = [r.ceiling_s]
            r.note = (
                f"{format_bytes(crossing)} cross per direction at "
                f"{ceiling['peer GB/s per direction']:.0f} GB/s (peer copy, both directions busy)"
            )
    elif r.method == "nvmath" and kind != "cupy":
        r.error = "the raw Redistribute is timed on CuPy chunks only"
    elif r.method == "nvmath":
        _raw(case, r, reps, nworkers)
    elif r.method == "floor":
        floor_row(client, case, r, reps, kind)
    else:
        return False
    return True


def _timed_run(client, case: Case, r: Result, rep: int, kind: str) -> None:
    """One run of ``r``'s method (rep 0: the warm-up, not timed), checked; a failure goes in ``r.error``."""
    seed = rep + 1
    x = y = None
    ctx, dask_method = _method_context(r.method)
    try:
        x = placed_array(client, case, seed, kind)  # (a failure here fails this row, not the bench)
        gpus_idle(client, kind)  # the input's kernels are done before the timer starts
        # GPU memory is measured on the warm-up run: freeing CuPy's cached blocks
        # first would make the timed runs pay for fresh allocations
        held = math.prod(map(len, case.old)) if kind == "cupy" and rep == 0 else None  # (the input)
        with ctx, gpu_memory_of(client, r, held):
            start = time.perf_counter()
            y = x.rechunk(case.new, method=dask_method).persist()
            computed(client, y, kind)
            elapsed = time.perf_counter() - start
        if r.method.startswith("redist-") or r.method == "enabled":  # (marks before start: an earlier run's)
            r.timeline = [m for m in timeline(client, start) if m[0] >= 0] or None
        if r.method == "enabled":
            _note_choice(r, "the collective" if r.timeline else "Dask's rechunk")
        ok = check(y, case, seed)
    except Exception as e:
        r.error = f"{type(e).__name__}: {e}".splitlines()[0]
        r.peak_gpu_bytes = r.gpu_cached_bytes = r.gpu_array_peak_bytes = None  # (not comparable)
        return
    finally:
        del x, y
    r.correct = ok if r.correct is None else r.correct and ok
    if rep:  # rep 0 is the warm-up
        r.times.append(elapsed)


def _raw(case: Case, r: Result, reps: int, nworkers: int) -> None:
    """nvmath's own Redistribute of the case's data (slab cases: one box per GPU)."""
    from dask_redist.bench.baselines import raw_redistribute

    if not case.name.startswith("slab"):
        r.error = "raw Redistribute is timed on slab cases only (one box per GPU)"
        return
    try:
        r.times, r.correct = raw_redistribute(case.shape, case.dtype, seed=7, reps=reps, nranks=nworkers)
    except Exception as e:
        r.error = f"{type(e).__name__}: {e}".splitlines()[0]


def timeline(client, start: float) -> list[tuple[float, str]]:
    """Marks of the latest collective run, in ms since ``start`` (a perf_counter reading), and
    where one ran since ``start``, of the graphs the scheduler took since (`_graphs_since`)."""
    from dask_redist import status

    offset = time.time() - time.perf_counter()  # perf_counter -> wall clock, same process
    now = status(client)
    events = [(t, f"scheduler: {e}") for e, t in now["timeline"].items()]
    for i, (_, worker) in enumerate(sorted(now["workers"].items())):
        events += [(t, f"worker {i}: {e}") for e, t in worker["timeline"].items()]
    if any(t >= start + offset for t, _ in events):  # (else no collective ran: callers tell by that)
        events += client.run_on_scheduler(_graphs_since, start + offset)
    return sorted((round((t - start - offset) * 1e3, 2), e) for t, e in events)


def _graphs_since(since: float, dask_scheduler=None) -> list[tuple[float, str]]:
    """When each graph submitted since ``since`` (wall clock) reached the scheduler and when its
    tasks were created: distributed's own ``update-graph`` events."""
    marks = []
    for t, msg in reversed(dask_scheduler.get_events("scheduler")):
        if t < since:
            break
        if isinstance(msg, dict) and msg.get("action") == "update-graph" and msg.get("status") == "OK":
            metrics = msg.get("metrics", {})
            if "start_timestamp_seconds" in metrics:
                received = metrics["start_timestamp_seconds"]
                marks += [(received, "scheduler: graph in")]
                marks += [(received + metrics.get("duration_seconds", 0.0), "scheduler: tasks created")]
    return marks


def engine_stats(client, engine: str) -> dict:
    """Every worker's statistics of ``engine`` (workers that never ran it, or where it keeps none, are left out)."""
    from dask_redist import status

    workers = status(client)["workers"].items()
    return {w: s["engines"][engine]["stats"] for w, s in workers if s["engines"].get(engine, {}).get("stats")}


def environment(client) -> dict:
    import distributed

    workers = worker_info(client)
    env = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "machine": f"{platform.machine()}, {_cpus()} CPUs",
        "workers": len(workers),
        "threads per worker": sorted({w["nthreads"] for w in workers.values()}),
        "python": platform.python_version(),
        "dask": dask.__version__,
        "distributed": distributed.__version__,
        "numpy": np.__version__,
    }
    for module in ("cupy", "dask_cuda", "nvmath"):
        try:
            env[module] = __import__(module).__version__
        except Exception:
            pass
    return env


def _cpus():
    import os

    return os.cpu_count()
