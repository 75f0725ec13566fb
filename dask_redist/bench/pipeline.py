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

import dask.array as da
from dask.utils import format_bytes, parse_bytes
from distributed.diagnostics.plugin import SchedulerPlugin

from dask_redist.bench.cases import Case, _even, check, placed_array, slab_case
from dask_redist.bench.fft import fft_case, pencils, whole_fftn_on_a_worker
from dask_redist.bench.floor import floor_row
from dask_redist.bench.harness import Result, computed, engine_stats, gpus_idle, timeline
from dask_redist.bench.pipeline_checks import _xp, check_output
from dask_redist.bench.pipeline_report import markdown, summary, to_json, write

__all__ = ["PIPELINES", "build", "markdown", "run_pipeline", "summary", "to_json", "weather_case", "write"]

PIPELINES = ("elementwise", "fft", "reduction", "generated", "weather", "fftn")
#: rows of every pipeline (``bare`` and ``floor``: once per input case; ``whole``: fftn's)
METHODS = ("without", "with", "bare", "floor", "tasks", "whole")


def weather_case(nbytes: int | str, nchunks: int) -> Case:
    """(time, lat, lon) float32: ``nchunks`` time steps, one a chunk, lat x lon (about 1:2) of
    ``nbytes`` in all, rechunked to ``nchunks`` long time series (``pencils(nchunks)`` blocks of
    lat x lon). ``--size 36.4GB --chunks 8760``: (8760, 721, 1440), a year of hourly ERA5 at 0.25 degrees."""
    nbytes = parse_bytes(nbytes) if isinstance(nbytes, str) else nbytes
    per_step = max(2, nbytes // 4 // nchunks)
    lat = max(1, round(math.sqrt(per_step / 2)))
    lon = max(1, per_step // lat)
    a, b = pencils(nchunks)
    shape = (nchunks, lat, lon)
    old = ((1,) * nchunks, (lat,), (lon,))
    new = ((nchunks,), _even(lat, a), _even(lon, b))
    size = format_bytes(math.prod(shape) * 4)
    name = f"weather {size} ({nchunks}, {lat}, {lon}) {nchunks}->{len(new[1])}x{len(new[2])} float32"
    return Case(name, shape, "float32", old, new)


def pipeline_case(pipeline: str, size: str, nchunks: int) -> Case:
    """The input case of a pipeline (its old and new chunks: the rechunk's)."""
    if pipeline == "weather":
        return weather_case(size, nchunks)
    if pipeline == "fftn":
        return fftn_case(size, nchunks)
    return slab_case(size, nchunks, "complex128" if pipeline == "fft" else "float64")


def fftn_case(size: str, nchunks: int) -> Case:
    """Issue 40's 3-D FFT (`fft.fft_case`'s slabs: ``(2n, 2n, n)`` complex128, ``n`` a length
    without large prime factors), ``nchunks`` slabs along axis 0 (``new``: along axis 1, where
    ``tasks`` rechunks them)."""
    shape = fft_case(size, nchunks, slabs=True)[1]
    old = (_even(shape[0], nchunks), shape[1:2], shape[2:])
    new = (shape[:1], _even(shape[1], nchunks), shape[2:])
    size = format_bytes(math.prod(shape) * 16)
    name = f"fftn of slab {size} {shape} {len(old[0])}->{len(new[1])} complex128"  # (its own bare row)
    return Case(name, shape, "complex128", old, new)


# -- the pipelines -------------------------------------------------------------------------


def _fft2(block):
    return _xp(block).fft.fft2(block, axes=(1, 2))


def _fft0(block):
    return _xp(block).fft.fft(block, axis=0)


def _fft1(block):
    return _xp(block).fft.fft(block, axis=1)


def _rechunked(y, case: Case, rechunk: bool, method: str | None):
    return y.rechunk(case.new, method=method) if rechunk else y


def generated_input(case: Case, seed: int, kind: str) -> da.Array:
    """Random numbers in the case's input chunks, made by the graph (not persisted)."""
    if kind == "cupy":
        import cupy

        state = da.random.RandomState(seed, RandomState=cupy.random.RandomState)
    else:
        state = da.random.RandomState(seed)
    return state.random_sample(case.shape, chunks=case.old)


def build(pipeline: str, case: Case, x, token: int, rechunk: bool, method: str | None = None) -> da.Array:
    """The pipeline's output (not computed); ``x``: the placed input, or for ``generated`` the
    seed's random array; ``method``: the rechunk's (None: Dask's choice, or the collective)."""
    if pipeline == "elementwise":
        return _rechunked(2 * x + token, case, rechunk, method) ** 2
    if pipeline == "fft":
        y = _rechunked(x.map_blocks(_fft2, dtype=x.dtype, meta=x._meta), case, rechunk, method)
        return y.map_blocks(_fft0 if rechunk else _fft1, dtype=x.dtype, meta=x._meta)
    if pipeline == "reduction":
        return _rechunked(x, case, rechunk, method).mean(axis=0)
    if pipeline == "generated":
        return _rechunked(x, case, rechunk, method)
    if pipeline == "weather":
        z = _rechunked(0.5 * x + token, case, rechunk, method)
        return z - z.mean(axis=0)
    if pipeline == "fftn":
        y = 2 * x
        if method == "tasks":  # the 3-D FFT by hand, with Dask's rechunk
            y = y.map_blocks(_fft2, dtype=x.dtype, meta=x._meta).rechunk(case.new, method="tasks")
            y = y.map_blocks(_fft0, dtype=x.dtype, meta=x._meta)
        elif rechunk:
            y = bare("fftn", case, y)
        return y / 2
    raise ValueError(f"no pipeline {pipeline!r}; there are {', '.join(PIPELINES)}")


def bare(pipeline: str, case: Case, x) -> da.Array:
    """What the pipeline's collective step is alone: the rechunk, or for ``fftn`` the transform."""
    if pipeline == "fftn":
        from dask_redist.fft import fftn

        return fftn(x)
    return x.rechunk(case.new)


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

    def enabled(self):
        import dask_redist

        return dask_redist.enable(**({"engine": self.engine} if self.engine else {}))


_tokens = count(1)


def _one_run(client, pipeline: str, case: Case, method: str, r: Result, opts: Options, timed: bool) -> None:
    """One run of ``method`` (``without``, ``with``, ``tasks``, ``bare``), checked; its time kept
    where ``timed``; a failure goes in ``r.error``."""
    from contextlib import nullcontext

    token = next(_tokens)
    x = y = None
    try:
        if pipeline == "generated" and method != "bare":
            x = generated_input(case, token, opts.kind)
        else:
            x = placed_array(client, case, token, opts.kind)
            gpus_idle(client, opts.kind)
        context = nullcontext() if method == "tasks" else opts.enabled()
        client.run_on_scheduler(_count_tasks, reset=True)
        with context:
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
    n_in, n_out = math.prod(map(len, case.old)), math.prod(map(len, case.new))
    methods = ["without", "with"]
    if opts.tasks_up_to is None or nchunks <= opts.tasks_up_to:
        methods.append("tasks")
    rows = {m: PipelineResult(name, m, case.nbytes, n_in, n_out) for m in methods}
    order = [(rep, m) for rep in range(opts.reps + 1) for m in methods]
    if not opts.interleave:
        order = [(rep, m) for m in methods for rep in range(opts.reps + 1)]
    for rep, m in order:
        if rows[m].error is None:
            _one_run(client, pipeline, case, m, rows[m], opts, timed=rep > 0)
    for m in methods:
        say(f"{name}: {m} {_summary(rows[m])}")
    out = [rows[m] for m in methods]
    if case.name not in shared:
        bare = PipelineResult(case.name, "bare", case.nbytes, n_in, n_out)
        for rep in range(opts.reps + 1):
            if bare.error is None:
                _one_run(client, pipeline, case, "bare", bare, opts, timed=rep > 0)
        floor = PipelineResult(case.name, "floor", case.nbytes, n_in, n_out)
        floor_row(client, case, floor, opts.reps, opts.kind)
        shared[case.name] = [bare, floor] + ([_whole(client, case, opts)] if pipeline == "fftn" else [])
        for r in shared[case.name]:
            say(f"{case.name}: {r.method} {_summary(r)}")
        out += shared[case.name]
    return out


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
    opts = Options(args.engine, kind, args.reps, args.tasks_up_to, args.interleave)
    results, shared = [], {}
    stem = os.path.join(args.out, args.name) if args.out else None
    with connect(args) as client:
        env = environment(client)
        for size in args.size or ["1GiB"]:
            for n in args.chunks:
                for pipeline in args.pipelines or PIPELINES:
                    done = run_pipeline(
                        client, pipeline, size, n, opts, shared, lambda line: print(line, flush=True)
                    )
                    results += done
                    show(summary(results)[-1:], f"{pipeline}, {n} chunks")  # (with the shared bare, floor)
                    if stem:  # after every pipeline: a run cut short keeps what it measured
                        write(stem, results, env, command)
    show(summary(results), "pipelines")
    if stem:
        print(f"wrote {stem}.md and {stem}.json")
    return 0 if all(r.correct is not False and not r.error for r in results) else 1
