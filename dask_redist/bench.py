"""Benchmark harness: every rechunk method on the same placed input, results checked.

Placement is controlled: input chunk ``i`` of ``n`` (C order) is created on
worker ``i * W // n`` of the ``W`` workers sorted by address (contiguous
blocks, the layout the design figures use), by a task pinned there. Every
repetition builds a fresh input (new keys, so nothing is cached) and times

    y = x.rechunk(new).persist(); wait(y)

for each method, after one untimed warm-up. Every result is then checked on
the workers against the formula that generated the input.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import dask
import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph
from dask.utils import format_bytes, parse_bytes

METHODS = ("redist-cufftmp", "redist-dask", "tasks", "p2p")  # also: tasks-ucx, p2p-ucx, nvmath, ceiling


@dataclass(frozen=True)
class Case:
    name: str
    shape: tuple[int, ...]
    dtype: str
    old: tuple
    new: tuple

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def _cube(nbytes: int | str, dtype: str) -> tuple[int, int]:
    """(bytes, side) of a cube of about ``nbytes`` of ``dtype``."""
    nbytes = parse_bytes(nbytes) if isinstance(nbytes, str) else nbytes
    return nbytes, round((nbytes / np.dtype(dtype).itemsize) ** (1 / 3))


def slab_case(nbytes: int | str, nchunks: int, dtype: str = "float64") -> Case:
    """A cube split into ``nchunks`` slabs along axis 0, rechunked to slabs along axis 1."""
    nbytes, n = _cube(nbytes, dtype)
    shape = (n, n, n)
    old = (da.core.normalize_chunks((math.ceil(n / nchunks), n, n), shape))
    new = (da.core.normalize_chunks((n, math.ceil(n / nchunks), n), shape))
    return Case(f"slab {format_bytes(nbytes)} {nchunks}->{nchunks} {dtype}", shape, dtype, old, new)


def pencil_case(nbytes: int | str, per_axis: int, dtype: str = "float64") -> Case:
    """Pencils along axis 2 (chunks on axes 0, 1) to pencils along axis 0 (chunks on 1, 2)."""
    nbytes, n = _cube(nbytes, dtype)
    shape, c = (n, n, n), math.ceil(n / per_axis)
    old = da.core.normalize_chunks((c, c, n), shape)
    new = da.core.normalize_chunks((n, c, c), shape)
    return Case(f"pencil {format_bytes(nbytes)} {per_axis}x{per_axis} {dtype}", shape, dtype, old, new)


def uneven_case(nbytes: int | str, dtype: str = "float64", seed: int = 0) -> Case:
    """A cube in 13 uneven slabs along axis 0 to 11 uneven slabs along axis 1, axis 2 cut in two."""
    nbytes, n = _cube(nbytes, dtype)
    rng = np.random.default_rng(seed)

    def split(length, parts):
        cuts = np.sort(rng.choice(np.arange(1, length), parts - 1, replace=False))
        return tuple(int(c) for c in np.diff(np.concatenate([[0], cuts, [length]])))

    old = (split(n, 13), (n,), (n,))
    new = ((n,), split(n, 11), (n - n // 3, n // 3))
    return Case(f"uneven {format_bytes(nbytes)} 13->22 {dtype}", (n, n, n), dtype, old, new)


def four_d_case(nbytes: int | str, nchunks: int, dtype: str = "float32") -> Case:
    """A 4-D array (n, n, n, 8n) in ``nchunks`` slabs along axis 0, rechunked to slabs along axis 3."""
    nbytes = parse_bytes(nbytes) if isinstance(nbytes, str) else nbytes
    n = round((nbytes / np.dtype(dtype).itemsize / 8) ** (1 / 4))
    shape = (n, n, n, 8 * n)
    old = da.core.normalize_chunks((math.ceil(n / nchunks), n, n, 8 * n), shape)
    new = da.core.normalize_chunks((n, n, n, math.ceil(8 * n / nchunks)), shape)
    return Case(f"4-D {format_bytes(nbytes)} {nchunks}->{nchunks} {dtype}", shape, dtype, old, new)


HEADLINE = ("redist-cufftmp", "redist-dask", "tasks", "tasks-ucx", "p2p", "ceiling")
FAST = ("redist-cufftmp", "tasks-ucx", "ceiling")


def gpu_suite() -> list[tuple[Case, tuple[str, ...]]]:
    """The GPU table: each case with the methods run on it (slow ones only where they tell something)."""
    # raw Redistribute moves the same slabs whatever the chunk count: timed once per size
    suite = [(slab_case("8GiB", n), HEADLINE + (("nvmath",) if n == 16 else ())) for n in (2, 16, 64, 256)]
    suite += [
        (slab_case("1GiB", 16), ("redist-cufftmp", "redist-dask", "tasks", "tasks-ucx", "nvmath", "ceiling")),
        # larger than a 16 GiB staging budget: runs in rounds (raw Redistribute would need 32 GiB more heap)
        (slab_case("32GiB", 16), ("redist-cufftmp", "tasks-ucx", "ceiling")),
        (slab_case("8GiB", 16, "float32"), FAST),
        (slab_case("8GiB", 16, "complex128"), FAST),
        (pencil_case("8GiB", 4), FAST),
        (uneven_case("8GiB"), FAST),
        (four_d_case("8GiB", 16), FAST),
    ]
    return suite


# -- data with a known value at every index ---------------------------------------------

_MODULUS = {"f2": 2039, "i1": 127, "b1": 2}


def expected_block(dtype: str, seed: int, shape, lower, global_shape, xp=np):
    """Value at every index: (linear index * 7 + seed) mod m, exact in any dtype."""
    dt = np.dtype(dtype)
    m = _MODULUS.get(dt.str[1:], 65521)
    idx = [xp.arange(lo, lo + s, dtype=xp.int64) for lo, s in zip(lower, shape)]
    lin = xp.zeros(tuple(shape), dtype=xp.int64)
    stride = 1
    for axis in range(len(shape) - 1, -1, -1):
        view = [1] * len(shape)
        view[axis] = shape[axis]
        lin = lin + idx[axis].reshape(view) * stride
        stride *= global_shape[axis]
    v = (lin * 7 + seed) % m
    if dt.kind == "c":
        return (v - 1j * v).astype(dt)
    return v.astype(dt)


def _make_block(dtype, seed, shape, lower, global_shape, kind):
    if kind == "cupy":
        import cupy

        return expected_block(dtype, seed, shape, lower, global_shape, xp=cupy)
    return expected_block(dtype, seed, shape, lower, global_shape)


def contiguous(i: int, n: int, nworkers: int) -> int:
    """The default placement: contiguous blocks, chunk i of n on worker i * W // n."""
    return i * nworkers // n


def placed_array(client, case: Case, seed: int, kind: str = "numpy", placement=contiguous) -> da.Array:
    """The case's input, chunk i of n created on worker ``placement(i, n, W)``."""
    from distributed import wait

    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    grid = [len(c) for c in case.old]
    n = math.prod(grid)
    name = f"bench-input-{seed}-{dask.base.tokenize(case, kind, placement)}"
    bounds = [np.concatenate([[0], np.cumsum(c)]) for c in case.old]
    futures = {}
    for i, idx in enumerate(np.ndindex(*grid)):
        shape = tuple(c[j] for c, j in zip(case.old, idx))
        lower = tuple(int(b[j]) for b, j in zip(bounds, idx))
        futures[(name, *idx)] = client.submit(
            _make_block, case.dtype, seed, shape, lower, case.shape, kind,
            key=(name, *idx), workers=[workers[placement(i, n, len(workers))]], allow_other_workers=False, pure=False,
        )  # fmt: skip
    wait(list(futures.values()))
    meta = np.empty((0,) * len(grid), dtype=case.dtype)
    if kind == "cupy":
        import cupy

        meta = cupy.empty((0,) * len(grid), dtype=case.dtype)
    graph = HighLevelGraph.from_collections(name, futures, dependencies=())
    return da.Array(graph, name, case.old, meta=meta)


def _check_block(block, dtype, seed, global_shape, block_info=None):
    lower = [lo for lo, _ in block_info[0]["array-location"]]
    xp = np
    if type(block).__module__.startswith("cupy"):
        import cupy as xp
    ok = bool((block == expected_block(dtype, seed, block.shape, lower, global_shape, xp=xp)).all())
    return np.array([ok]).reshape((1,) * block.ndim)


def check(y: da.Array, case: Case, seed: int) -> bool:
    flags = y.map_blocks(
        _check_block, case.dtype, seed, case.shape, dtype=bool, chunks=(1,) * y.ndim, meta=np.empty((0,) * y.ndim, bool)
    )
    return bool(flags.all().compute())


# -- running ---------------------------------------------------------------------------


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
    ceiling_s: float | None = None  # the case's bytes crossing GPUs at the peer-copy rate
    engine_stats: dict | None = None  # cufftmp: the last run's stage/reshape/unstage ms per worker
    timeline: list | None = None  # collective: (ms since submit, event) of the last timed run
    note: str | None = None

    def _engine_note(self) -> str:
        if not self.engine_stats:
            return ""
        last = [s["last"] for s in self.engine_stats.values() if s.get("last")]
        if not last:
            return ""
        worst = {k: max(x[k] for x in last) for k in ("stage ms", "reshape ms", "unstage ms")}
        arena = f", arena {format_bytes(last[0]['arena bytes'])}" if last[0].get("arena bytes") else ""
        return (
            f"{last[0]['layout']}, {last[0]['rounds']} round(s){arena}; "
            + ", ".join(f"{k} {v:.2f}" for k, v in worst.items())
        )

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
            "GB/s": f"{self.nbytes / self.median / 1e9:.2f}" if self.times else "",
            "checked": {True: "equal", False: "WRONG", None: "-"}[self.correct],
            "of ceiling": f"{self.ceiling_s / self.median:.0%}" if self.times and self.ceiling_s else "",
            "GPU mem +": format_bytes(max(self.peak_gpu_bytes.values())) if self.peak_gpu_bytes else "",
            "note": (self.error or self.note or self._engine_note())[:160],
        }


def _seconds(t: float) -> str:
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def _method_context(method: str):
    """(context manager, dask's rechunk method) for a method name; ``-ucx`` only names the cluster."""
    import dask_redist

    method = method.removesuffix("-ucx")
    if method.startswith("redist-"):
        return dask_redist.enable(engine=method.split("-", 1)[1]), None
    return nullcontext(), method


def crossing_bytes(case: Case, nworkers: int, placement=contiguous) -> int:
    """Bytes that the collective's plan moves from one worker to another, in the busiest direction."""
    from dask_redist.planning import RechunkSpec, make_plan

    n = math.prod(map(len, case.old))
    in_ranks = [placement(i, n, nworkers) for i in range(n)]
    traffic = make_plan(RechunkSpec(case.old, case.new, np.dtype(case.dtype).itemsize), in_ranks, nworkers).traffic
    np.fill_diagonal(traffic, 0)
    return int(traffic.max(initial=0))


def _settle(client, keys: int, timeout: float = 10) -> None:
    """Wait until the scheduler holds only ``keys`` tasks: earlier results are released everywhere."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_task_count) > keys and time.monotonic() < deadline:
        time.sleep(0.05)


def _task_count(dask_scheduler) -> int:
    return len(dask_scheduler.tasks)


def _gpu_used(reset: bool = False) -> int:
    """Bytes in use on this worker's GPU; ``reset`` first hands CuPy's cached free blocks back."""
    import cupy

    if reset:
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
    free, total = cupy.cuda.runtime.memGetInfo()
    return int(total - free)


def run_case(
    client, case: Case, methods=METHODS, reps: int = 3, kind: str = "numpy", ceiling: dict | None = None
) -> list[Result]:
    """Time every method on the case: one warm-up, then ``reps`` timed runs on fresh inputs.

    ``ceiling`` is `dask_redist.baselines.link_ceiling`'s measurement; with it every
    row gets the fraction of the physical ceiling it reached.
    """
    from distributed import wait

    nworkers = len(client.scheduler_info(n_workers=-1)["workers"])
    ceiling_s = crossing = None
    if ceiling:
        crossing = crossing_bytes(case, nworkers)
        ceiling_s = crossing / (ceiling["peer GB/s per direction"] * 1e9)
    results = []
    for method in methods:
        r = Result(case.name, method, case.nbytes, math.prod(map(len, case.old)), math.prod(map(len, case.new)))
        r.ceiling_s = ceiling_s
        results.append(r)
        if method == "ceiling":
            if ceiling_s is None:
                r.error = "no ceiling measured (needs two GPUs in the benchmark process)"
            else:
                r.times = [ceiling_s]
                r.note = (
                    f"{format_bytes(crossing)} cross per direction at "
                    f"{ceiling['peer GB/s per direction']:.0f} GB/s (peer copy, both directions busy)"
                )
            continue
        if method in ("redist-cufftmp", "nvmath") and kind != "cupy":
            r.error = f"{method} moves CuPy chunks only"
            continue
        if method == "nvmath":
            _raw(case, r, reps, nworkers)
            continue
        for rep in range(reps + 1):
            seed = rep + 1
            x = placed_array(client, case, seed, kind)
            ctx, dask_method = _method_context(method)
            try:
                # GPU memory is measured on the warm-up run: freeing CuPy's cached blocks
                # first would make the timed runs pay for fresh allocations
                before = None
                if kind == "cupy" and rep == 0:
                    _settle(client, math.prod(map(len, case.old)))  # only this input left: a clean reading
                    before = client.run(_gpu_used, True)
                with ctx:
                    start = time.perf_counter()
                    y = x.rechunk(case.new, method=dask_method).persist()
                    wait(y)
                    elapsed = time.perf_counter() - start
                if before is not None:
                    after = client.run(_gpu_used)
                    r.peak_gpu_bytes = {w: after[w] - before[w] for w in after}
                if method.startswith("redist-"):
                    r.timeline = timeline(client, start)
                ok = check(y, case, seed)
            except Exception as e:
                r.error = f"{type(e).__name__}: {e}".splitlines()[0]
                r.peak_gpu_bytes = None  # of a run that failed: not comparable
                break
            finally:
                del x
            r.correct = ok if r.correct is None else r.correct and ok
            if rep:  # rep 0 is the warm-up
                r.times.append(elapsed)
            del y
        if method == "redist-cufftmp" and r.times:
            r.engine_stats = client.run(cufftmp_stats)
    return results


def _raw(case: Case, r: Result, reps: int, nworkers: int) -> None:
    """nvmath's own Redistribute of the case's data (slab cases: one box per GPU)."""
    from dask_redist.baselines import raw_redistribute

    if not case.name.startswith("slab"):
        r.error = "raw Redistribute is timed on slab cases only (one box per GPU)"
        return
    try:
        r.times, r.correct = raw_redistribute(case.shape, case.dtype, seed=7, reps=reps, nranks=nworkers)
    except Exception as e:
        r.error = f"{type(e).__name__}: {e}".splitlines()[0]


def _worker_timeline(dask_worker):
    from dask_redist._worker import get_state

    return dict(get_state(dask_worker).timeline)


def _scheduler_timeline(dask_scheduler):
    plugin = dask_scheduler.plugins.get("redist")
    return dict(plugin.timeline) if plugin else {}


def timeline(client, start: float) -> list[tuple[float, str]]:
    """Marks of the latest collective run, in ms since ``start`` (a perf_counter reading)."""
    offset = time.time() - time.perf_counter()  # perf_counter -> wall clock, same process
    events = [(t, f"scheduler: {e}") for e, t in client.run_on_scheduler(_scheduler_timeline).items()]
    for i, (_, marks) in enumerate(sorted(client.run(_worker_timeline).items())):
        events += [(t, f"worker {i}: {e}") for e, t in marks.items()]
    return sorted((round((t - start - offset) * 1e3, 2), e) for t, e in events)


def cufftmp_stats() -> dict:
    """This worker's cufftmp engine statistics (run it with ``client.run``)."""
    from dask_redist.engines import get_engine

    return dict(get_engine("cufftmp").stats)


def environment(client) -> dict:
    import distributed

    info = client.scheduler_info(n_workers=-1)
    env = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "machine": f"{platform.machine()}, {_cpus()} CPUs",
        "workers": len(info["workers"]),
        "threads per worker": sorted({w["nthreads"] for w in info["workers"].values()}),
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


def load_json(path: str) -> tuple[list[Result], str]:
    """The results and the command of a file written by `to_json`."""
    with open(path) as f:
        data = json.load(f)
    names = {f.name for f in dataclasses.fields(Result)}
    return [Result(**{k: v for k, v in r.items() if k in names}) for r in data["results"]], data["command"]


def markdown(results: list[Result], env: dict, command: str) -> str:
    rows = [r.row() for r in results]
    head = list(rows[0])
    lines = [
        f"Command: `{command}`  ",
        f"Date: {env['date']}; machine: {env['machine']}; {env['workers']} workers; "
        + ", ".join(f"{k} {env[k]}" for k in ("dask", "distributed", "numpy", "cupy", "dask_cuda", "nvmath") if k in env),
    ]
    if "ceiling" in env:
        c = env["ceiling"]
        lines[-1] += "  "
        lines.append(
            f"Physical ceiling, measured in the benchmark process: peer copy {c['peer GB/s per direction']:.0f} GB/s "
            f"per direction with both directions busy, local copy {c['local copy GB/s (read + write)']:.0f} GB/s "
            "(read + write). \"of ceiling\": the bytes the collective's plan moves in the busiest direction at the "
            "peer rate, over the median. \"GPU mem +\": the most GPU memory one worker had in use more after the "
            "warm-up run than before it, CuPy's cached blocks freed first (the pool keeps freed blocks, so "
            "temporaries count; the NVSHMEM symmetric heap, reserved once, does not)."
        )
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def to_json(results: list[Result], env: dict, command: str) -> str:
    return json.dumps(
        {"command": command, "environment": env, "results": [asdict(r) | {"median": r.median} for r in results]},
        indent=1,
        default=str,
    )


# -- micro benchmarks ----------------------------------------------------------------------


def rewrite_time(nchunks: int = 10_000, reps: int = 3) -> dict:
    """Seconds to rewrite (and then optimize) the graph of an ``nchunks``-chunk rechunk."""
    from dask.array.optimization import optimize

    from dask_redist.optimize import rewrite

    x = da.ones((nchunks, 100), chunks=(1, 100))
    y = x.rechunk((nchunks, 1), method="tasks")
    keys = y.__dask_keys__()
    rewrite_s, total_s = [], []
    for _ in range(reps):
        graph = y.__dask_graph__()
        t0 = time.perf_counter()
        new, _ = rewrite(graph, [keys])
        t1 = time.perf_counter()
        optimize(new, [keys])
        t2 = time.perf_counter()
        rewrite_s.append(t1 - t0)
        total_s.append(t2 - t0)
    return {"chunks": nchunks, "rewrite": statistics.median(rewrite_s), "rewrite + dask optimize": statistics.median(total_s)}


def fixed_cost(client, reps: int = 20) -> dict:
    """End-to-end seconds of a tiny rechunk (2 -> 2 chunks of 16x16 float64), fresh keys each time."""
    from distributed import wait

    import dask_redist

    labels = {"collective (dask engine)": lambda: dask_redist.enable(engine="dask"), "dask tasks": nullcontext}
    times = {k: [] for k in labels}
    for i in range(reps + 2):
        for j, (label, ctx) in enumerate(labels.items()):
            a = da.from_array(np.full((16, 16), float(i * 10 + j)), chunks=(8, 16)).persist()
            wait(a)
            with ctx():
                t0 = time.perf_counter()
                y = a.rechunk((16, 8), method="tasks").persist()
                wait(y)
                if i >= 2:
                    times[label].append(time.perf_counter() - t0)
            del a, y
    return {k: statistics.median(v) for k, v in times.items()}
