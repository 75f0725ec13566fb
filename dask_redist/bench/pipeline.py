"""``dask-redist bench --pipeline``: a rechunk between other steps, against the same steps without it.

Every pipeline starts from an input like the bench's slabs (chunk ``i`` of ``n`` placed on worker
``i * W // n``, values by `cases.expected_block`), split along axis 0 and rechunked to slabs along
axis 1, except where said:

* ``elementwise``: ``((2*x + b).rechunk(c))**2`` (``b`` new in every run);
* ``fft``: ``fft2`` over axes (1, 2) of each slab, rechunk, ``fft`` along axis 0 (complex128 input,
  NumPy's or CuPy's FFT through ``map_blocks``): the 3-D FFT;
* ``reduction``: ``x.rechunk(c).mean(axis=0)``, the mean over the old split axis;
* ``generated``: random numbers made in the same graph (``da.random.RandomState``, CuPy's with
  ``--gpu``), not persisted, then rechunked;
* ``weather``: dask#11162's case, a (time, lat, lon) float32 field in daily spatial chunks
  ``(1, lat, lon)`` (time steps = the chunk count, lat x lon sized by ``--size``) to long time
  series ``(time, lat block, lon block)`` (as many blocks as chunks), then the anomaly
  ``z - z.mean(axis=0)`` of ``z = 0.5*x + b``;
* ``fftn``: ``dask_redist.fft.fftn(2*x) / 2`` of complex128 slabs of shape ``(2n, 2n, n)`` (issue
  40's 3-D FFT, `fftn_case`), the transform between two elementwise steps instead of a rechunk
  (its ``bare`` row: ``fftn(x)``; ``tasks``: the 3-D FFT by hand, ``fft2``, Dask's ``tasks``
  rechunk, ``fft`` along axis 0).

Each pipeline and chunk count gives these rows (each a `harness.Result`):

* ``without``: the same steps without the rechunk (the reductions: Dask's tree reduction over
  the old split axis; ``fft``: the last transform along axis 1, which each slab holds whole and
  which is as long as axis 0 (in every slab case): the same tasks and transforms as ``with``,
  not the 3-D FFT. Until 2026-12-05 it ran along axis 0 within each slab, a shorter transform
  (docs/benchmarks.md, "The `fft` row's baseline"); ``fftn``: ``2*x / 2``);
* ``with``: the pipeline, under ``dask_redist.enable()`` with the bench's ``--engine``, as users
  have it (the note says whether ``enable()`` ran the collective or left the rechunk to Dask);
* ``adds``: ``with`` - ``without`` (medians), in the summary table;
* ``bare``: ``x.rechunk(c).persist()`` of the persisted input under the same ``enable()`` (the
  bench's slab rows), once per input case;
* ``floor``: Dask's floor for the case's chunk counts (`bench.floor`), once per input case;
* ``tasks``: the pipeline with Dask's ``tasks`` rechunk forced (``method="tasks"``, outside
  ``enable()``), skipped above ``--tasks-up-to`` chunks;
* ``whole`` (``fftn`` only): ``fftn`` of a whole array of that shape in one call on one worker,
  no Dask (CuPy's with ``--gpu``): the transform's own time, once per input case.

Every run gets a token of its own (the input's seed and the constants), so nothing is reused
between runs; one untimed warm-up, then ``reps`` timed runs. What is timed is
``y = pipeline(x).persist(); wait(y)``, and with CuPy chunks until every worker's GPU has
finished (`harness.computed`: since 2026-12-05, as long as a blockwise step's kernels may
still run when its task returns). Each result is checked: sampled boxes against NumPy
computed here from the formula (the FFT: sampled frequencies against a direct DFT computed on
the workers; ``generated``: against the same numbers generated again without the rechunk), so a
wrong fused result fails its row. Each row also gives the tasks its graph put on the scheduler
(the sum of ``tasks`` over the scheduler's ``update_graph`` calls of the timed run).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import count

from distributed.diagnostics.plugin import SchedulerPlugin

from dask_redist.bench.cases import Case, check, placed_array, worker_addresses
from dask_redist.bench.fft import whole_fftn_on_a_worker
from dask_redist.bench.floor import floor_row
from dask_redist.bench.gpu_state import gpu_memory_of, gpus_idle
from dask_redist.bench.harness import Result, computed, engine_stats, timeline
from dask_redist.bench.pipeline_cases import (
    PIPELINES,
    bare,
    build,
    generated_input,
    pipeline_case,
    weather_case,
)
from dask_redist.bench.pipeline_checks import check_output
from dask_redist.bench.pipeline_report import markdown, summary, to_json, write

__all__ = ["PIPELINES", "build", "markdown", "run_pipeline", "summary", "to_json", "weather_case", "write"]

#: rows of every pipeline (``bare`` and ``floor``: once per input case; ``whole``: fftn's)
METHODS = ("without", "with", "bare", "floor", "tasks", "whole")


# -- tasks on the scheduler ---------------------------------------------------------------


class TaskCount(SchedulerPlugin):
    """Tasks new to the scheduler (not there at the last reset: a persisted input is not counted)
    that the graphs submitted since the last reset put on it."""

    name = "redist-bench-task-count"

    def __init__(self):
        self.tasks = 0
        self.before: set = set()

    def update_graph(self, scheduler, *, tasks=(), **kwargs):
        self.tasks += len(set(tasks) - self.before)


def _count_tasks(dask_scheduler, reset: bool = False) -> int:
    plugin = dask_scheduler.plugins.get(TaskCount.name)
    if plugin is None:
        plugin = TaskCount()
        dask_scheduler.add_plugin(plugin)
    n = plugin.tasks
    if reset:
        plugin.tasks, plugin.before = 0, set(dask_scheduler.tasks)
    return n


# -- the runs -------------------------------------------------------------------------------


@dataclass
class Options:
    """How the rows run: the ``enable()`` options (``--engine``), the chunk kind, repetitions."""

    engine: str | None = None
    kind: str = "numpy"
    reps: int = 3
    tasks_up_to: int | None = None  # chunk counts above it: no ``tasks`` row
    interleave: bool = False
    workers: int = 0  # the cluster's workers at the start (0: not checked before each run)

    def enabled(self):
        import dask_redist

        return dask_redist.enable(**({"engine": self.engine} if self.engine else {}))


_tokens = count(1)
#: Seconds a run waits for the cluster to have its workers again (a killed worker's nanny starts a
#: new one) before the bench stops with `ClusterLost`.
WORKERS_BACK_S = 120.0


class ClusterLost(RuntimeError):
    """The cluster has fewer workers than at the start, and they did not come back: the rows after
    it would wait for them (2026-12-06, one H100: a worker closed after the ``weather`` case's
    ``without`` run at 8760 chunks, and the bench waited until its command was killed). ``rows``:
    the rows of the pipeline it stopped, as far as they ran."""

    def __init__(self, message: str):
        super().__init__(message)
        self.rows: list = []


def _workers_there(client, opts: Options) -> None:
    """Return once the cluster has its ``opts.workers`` again; else raise `ClusterLost`."""
    if not opts.workers:
        return
    try:
        client.wait_for_workers(opts.workers, timeout=WORKERS_BACK_S)
    except TimeoutError:
        try:
            have = len(worker_addresses(client))
        except RuntimeError:
            have = 0
        raise ClusterLost(
            f"the cluster has {have} of the {opts.workers} workers it started with, {WORKERS_BACK_S:g}s "
            "after a run: the rows after it cannot run (the log file has the workers' records)"
        ) from None


def _one_run(client, pipeline: str, case: Case, method: str, r: Result, opts: Options, timed: bool) -> None:
    """One run of ``method`` (``without``, ``with``, ``tasks``, ``bare``), checked; its time kept
    where ``timed``; a failure goes in ``r.error``."""
    from contextlib import nullcontext

    _workers_there(client, opts)
    token = next(_tokens)
    x = y = None
    try:
        if pipeline == "generated" and method != "bare":
            x, held = generated_input(case, token, opts.kind), 0  # (made by the graph: nothing held)
        else:
            x = placed_array(client, case, token, opts.kind)
            held = x.npartitions
            gpus_idle(client, opts.kind)
        context = nullcontext() if method == "tasks" else opts.enabled()
        # the warm-up's GPU memory: what each method needs of the GPU
        measured = held if opts.kind == "cupy" and not timed else None
        client.run_on_scheduler(_count_tasks, reset=True)
        with context, gpu_memory_of(client, r, measured):
            start = time.perf_counter()
            if method == "bare":
                y = bare(pipeline, case, x).persist()
            else:
                y = build(
                    pipeline, case, x, token, method != "without", "tasks" if method == "tasks" else None
                )
                y = y.persist()
            computed(client, y, opts.kind)
            elapsed = time.perf_counter() - start
        tasks = client.run_on_scheduler(_count_tasks)
        if method in ("with", "bare"):  # the collective's marks of this run, if it ran
            marks = [m for m in timeline(client, start) if m[0] >= 0]
            r.timeline = marks or None
            ran = "the collective" if marks else "Dask's rechunk"
            r.note = f"enable() ran {ran}" if not r.note or ran in r.note else "enable() ran both, run by run"
            if marks and timed:
                r.engine_stats = _engine_stats(client) or None
        if method == "bare" and pipeline != "fftn":
            ok = check(y, case, token)
        else:
            again = generated_input(case, token, opts.kind) if pipeline == "generated" else None
            ok = check_output(pipeline, case, y, x, token, method != "without", again)
    except Exception as e:  # noqa: BLE001 - a failing row says so, the others go on
        r.error = f"{type(e).__name__}: {e}".splitlines()[0]
        return
    finally:
        del x, y
    r.correct = ok if r.correct is None else r.correct and ok
    if timed:
        r.times.append(elapsed)
        r.tasks = tasks


def run_pipeline(
    client, pipeline: str, size: str, nchunks: int, opts: Options, shared: dict, say=print
) -> list:
    """The rows of one pipeline at one chunk count; ``shared`` keeps the ``bare`` and ``floor``
    rows of each input case (measured once, shown with every pipeline of that input)."""
    case = pipeline_case(pipeline, size, nchunks)
    name = f"{pipeline}: {case.name}"
    methods = ["without", "with"]
    if opts.tasks_up_to is None or nchunks <= opts.tasks_up_to:
        methods.append("tasks")
    rows = {m: _row(case, name, m) for m in methods}
    order = [(rep, m) for rep in range(opts.reps + 1) for m in methods]
    if not opts.interleave:
        order = [(rep, m) for m in methods for rep in range(opts.reps + 1)]
    try:
        for rep, m in order:
            if rows[m].error is None:
                _one_run(client, pipeline, case, m, rows[m], opts, timed=rep > 0)
        for m in methods:
            say(f"{name}: {m} {_summary(rows[m])}")
        once = []  # (the input case's bare and floor rows, where no pipeline measured them yet)
        if case.name not in shared:
            once = shared[case.name] = _shared_rows(client, pipeline, case, opts)
            for r in once:
                say(f"{case.name}: {r.method} {_summary(r)}")
    except ClusterLost as e:
        e.rows = [r for r in rows.values() if r.times or r.error]  # (what was measured stays)
        raise
    return list(rows.values()) + once


def _row(case: Case, label: str, method: str) -> PipelineResult:
    """An empty row of ``method`` for ``case``, named ``label``."""
    n_in, n_out = math.prod(map(len, case.old)), math.prod(map(len, case.new))
    return PipelineResult(label, method, case.nbytes, n_in, n_out)


def _shared_rows(client, pipeline: str, case: Case, opts: Options) -> list:
    """The rows measured once per input case: ``bare``, ``floor`` (and ``fftn``'s ``whole``)."""
    alone = _row(case, case.name, "bare")
    for rep in range(opts.reps + 1):
        if alone.error is None:
            _one_run(client, pipeline, case, "bare", alone, opts, timed=rep > 0)
    floor = _row(case, case.name, "floor")
    _workers_there(client, opts)
    floor_row(client, case, floor, opts.reps, opts.kind)
    return [alone, floor] + ([_whole(client, case, opts)] if pipeline == "fftn" else [])


def _whole(client, case: Case, opts: Options) -> PipelineResult:
    """The ``whole`` row: ``fftn`` of a whole array of the case's shape in one call on one worker,
    no Dask (`fft.whole_fftn_on_a_worker`): on a GPU, the transform's own time, what issue 40 lets the
    ``fftn`` pipeline add beyond 20 ms."""
    r = PipelineResult(case.name, "whole", case.nbytes, 1, 1)
    try:
        r.times = whole_fftn_on_a_worker(client, case.shape, opts.reps, opts.kind)
    except Exception as e:  # noqa: BLE001 - (an array too large for one worker's GPU, say)
        r.error = f"{type(e).__name__}: {e}".splitlines()[0]
    r.note = "fftn of the whole array in one call on one worker, no Dask"
    return r


def _engine_stats(client) -> dict:
    """The statistics of the engine that ran last, per worker (`harness.engine_stats`), of the
    first engine that keeps any (cufftmp: stage, reshape, unstage ms on the GPU's clock)."""
    from dask_redist import status

    names = {e for w in status(client)["workers"].values() for e in w["engines"]}
    for name in sorted(names):
        if stats := engine_stats(client, name):
            return stats
    return {}


@dataclass
class PipelineResult(Result):
    tasks: int | None = None  # tasks the last timed run's graph put on the scheduler

    @property
    def gpu_ms(self) -> float | None:
        """The slowest worker's stage + reshape + unstage ms in the last timed run (cufftmp)."""
        last = [s["last"] for s in (self.engine_stats or {}).values() if s.get("last")]
        spent = [sum(x.get(k, 0.0) for k in ("stage ms", "reshape ms", "unstage ms")) for x in last]
        return max(spent) if spent else None

    def row(self) -> dict:
        row = super().row()
        note = "; ".join(p for p in (self.error or self.note, self._engine_note()) if p)
        return {**row, "note": note[:200], "tasks": "" if self.tasks is None else self.tasks}


def _summary(r: Result) -> str:
    if r.error:
        return f"failed: {r.error}"
    right = {True: ", right", False: ", WRONG", None: ""}[r.correct]
    return f"median {r.median:.3f} s of {len(r.times)}{right}" if r.times else f"untimed{right}"


def main(args, command: str, connect, show) -> int:
    """``dask-redist bench --pipeline`` (the CLI passes its cluster and table helpers)."""
    import os

    from dask_redist.bench.harness import environment

    kind = "cupy" if args.gpu and not args.numpy else "numpy"
    results, shared, lost = [], {}, None
    stem = os.path.join(args.out, args.name) if args.out else None
    with connect(args) as client:
        env = environment(client)
        workers = len(worker_addresses(client))
        opts = Options(args.engine, kind, args.reps, args.tasks_up_to, args.interleave, workers)
        cases = [
            (s, n, p) for s in args.size or ["1GiB"] for n in args.chunks for p in args.pipelines or PIPELINES
        ]
        for size, n, pipeline in cases:
            try:
                done = run_pipeline(
                    client, pipeline, size, n, opts, shared, lambda line: print(line, flush=True)
                )
            except ClusterLost as e:
                lost = f"dask-redist bench: stopped at {pipeline}, {n} chunks: {e}"
                done = e.rows
            results += done
            if done:
                show(summary(results)[-1:], f"{pipeline}, {n} chunks")  # (with the shared bare, floor)
            if stem and results:  # after every pipeline: a run cut short keeps what it measured
                write(stem, results, env, command)
            if lost:
                break
    if results:
        show(summary(results), "pipelines")
    if stem and results:
        print(f"wrote {stem}.md and {stem}.json")
    if lost:
        print(lost, flush=True)
        return 1
    return 0 if all(r.correct is not False and not r.error for r in results) else 1
