"""The GPU path: one collective step per transform, through cuFFTMp on the workers' NVSHMEM world.

The transform becomes one collective layer, as a rechunk does (stage tasks where the input
chunks are, one barrier, unpack tasks under the output keys), whose `CollectiveSpec`
carries the transform (`dask_redist.planning.fft.DistributedFFT`); the cufftmp engine
executes it on the collective thread, in the global order of runs
(`dask_redist.engines.cufftmp.fft`). The result comes in the output slabs (cuFFTMp's natural
output: Y slabs, X slabs for ``irfftn``) or straight in the chunks asked for, unless those
cut the last axis in more chunks than the input's length (then a rechunk follows).

On by default (``redist.fft.gpu``; where it was tested: docs/fft.md). The
graph also holds the local path's tasks, which a scheduler other than the distributed one
runs (`dask_redist.graph.anywhere`).
`problem` says why a transform takes the path that runs everywhere instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import dask
import numpy as np
from dask.base import tokenize

from dask_redist.compat import is_expression
from dask_redist.config import ConfigError, Settings
from dask_redist.fft.plan import FFTOp
from dask_redist.planning.fft import DTYPES

KEY = "redist.fft.gpu"


def enabled() -> bool:
    value = dask.config.get(KEY, True)
    if not isinstance(value, bool):
        raise ConfigError(f"{KEY} must be true or false, got {value!r}")
    return value


def transform_problem(op: FFTOp, dtype, nworkers: int) -> str | None:
    """Why cuFFTMp cannot run ``op`` on ``dtype`` over ``nworkers`` GPUs, or None (no cluster
    asked): what NumPy's arguments ask that cuFFTMp does not do, then cuFFTMp's own rules
    (`dask_redist.planning.fft.DistributedFFT.problem`), all known before any graph runs."""
    ndim = len(op.shape)
    if len(op.axes) not in (2, 3):
        return f"a {len(op.axes)}-D transform: cuFFTMp does 2-D and 3-D ones"
    if op.axes != tuple(range(ndim - len(op.axes), ndim)):
        return f"axes {list(op.axes)} are not the last {len(op.axes)} axes in order, which cuFFTMp transforms"
    natural = tuple(op.shape[a] for a in op.axes)
    if op.kind == "c2r":
        m = op.shape[op.axes[-1]]
        ok = op.s[:-1] == natural[:-1] and op.s[-1] in (2 * (m - 1), 2 * (m - 1) + 1) and op.s[-1] > 0
    else:
        ok = op.s == natural
    if not ok:
        return f"s={list(op.s)} pads or crops the input, which cuFFTMp does not"
    if np.dtype(dtype).name not in DTYPES[op.kind]:
        return f"dtype {np.dtype(dtype)}: cuFFTMp's {op.kind.upper()} takes {' or '.join(DTYPES[op.kind])}"
    geometry = distributed(op, dtype, None)
    return geometry.problem(nworkers)


def distributed(op: FFTOp, dtype, chunks):
    """The run's `DistributedFFT` (``chunks``: the result's; None: none yet)."""
    from dask_redist.fft.local import result_dtype
    from dask_redist.planning.fft import DistributedFFT

    out_dtype = result_dtype(op.function, dtype)
    return DistributedFFT(
        op.kind, op.inverse, op.norm, op.shape, op.out_shape, len(op.axes), chunks, np.dtype(dtype), out_dtype
    )


@dataclass(frozen=True)
class Placement:
    """Where the GPU path runs: the workers, and the input's chunk indices grouped by the worker
    holding them where it is persisted (one stage task per worker), else None (one per chunk)."""

    workers: list[str]
    groups: list | None = None


def problem(x, op: FFTOp) -> str | None:
    """Why ``op`` on ``x`` takes the path that runs everywhere, or None for the GPU path."""
    return where(x, op)[0]


def where(x, op: FFTOp) -> tuple[str | None, Placement | None]:
    """(`problem`, where the GPU path runs: None where it does not)."""
    cupy = type(x._meta).__module__.startswith("cupy")
    rest = f"collective rechunks and {'cupy' if cupy else 'numpy'}.fft on every chunk"
    if not cupy:
        return f"NumPy chunks: {rest}", None
    if is_expression(x):  # (its graph is built from layers)
        return f"dask's expression mode (array.query-planning: True): {rest}", None
    if not enabled():
        return f"the GPU path is off ({KEY}: false): {rest}", None
    from dask_redist.compat import default_client

    client = default_client()
    if client is None:
        return f"no distributed Client: {rest}", None
    settings = Settings.from_config()
    state, placement = _placement(client, x, settings)
    workers = placement.workers
    why = (
        transform_problem(op, x.dtype, len(workers))
        or _engine_problem(client, settings, state)
        or heap_problem(distributed(op, x.dtype, None), len(workers), settings, _symmetric_size(settings))
    )
    return (f"{why}: {rest}", None) if why else (None, placement)


def _placement(client, x, settings: Settings):
    """(`cluster.engines_state` for ``settings`` under ``redist.engine: auto``, `Placement` of ``x``):
    the workers, their engines and, where ``x`` is persisted, its holders, from one question to the
    scheduler."""
    from dask_redist.cluster import engines_state

    keys = _persisted_keys(x)
    state = engines_state(client, replace(settings, engine="auto"), keys)
    groups = _groups(x, dict(zip(keys, state.holders))) if keys else None
    return state, Placement(state.workers, groups)


def _engine_problem(client, settings: Settings, state) -> str | None:
    """Why the engine ``auto`` would choose for CuPy chunks runs no FFT, from ``state``
    (`cluster.engines_state` for ``settings`` with ``auto``), or None."""
    from dask_redist.cluster import engine_for
    from dask_redist.engines import Request
    from dask_redist.engines.choice import fft_engines

    ffts = [name for name, kinds in fft_engines(settings).items() if "cupy" in kinds]
    if settings.engine != "auto" and settings.engine not in ffts:
        return f"redist.engine is {settings.engine}"
    engine, why, _ = engine_for(client, Request("cupy", replace(settings, engine="auto")), state)
    return None if engine in ffts else why


def _symmetric_size(settings: Settings) -> int | None:
    """``redist.nvshmem.symmetric-size`` as the FFT's engine reads it (None: unset, or no such engine)."""
    from dask_redist.engines import engine_settings
    from dask_redist.engines.choice import fft_engines

    names = [name for name, kinds in fft_engines(settings).items() if "cupy" in kinds]
    return getattr(engine_settings(names[0], settings), "symmetric_size", None) if names else None


def heap_problem(geometry, nworkers: int, settings: Settings, symmetric_size: int | None) -> str | None:
    """Why one transform's slab (operand and about as much workspace) and the arena do not fit
    the symmetric heap of ``symmetric_size`` bytes (``redist.nvshmem.symmetric-size``; None: not
    checked here). One worker's transform takes none (`dask_redist.engines.cufftmp.one_pe`)."""
    if symmetric_size is None or nworkers == 1:
        return None
    slab = max(_slab_bytes(geometry, nworkers))
    need = 2 * slab + settings.memory_budget * 5 // 4
    if need > symmetric_size:
        return (
            f"one transform needs about {need} bytes of symmetric heap per GPU with the arena, over "
            f"redist.nvshmem.symmetric-size ({symmetric_size})"
        )
    return None


def _slab_bytes(geometry, nworkers: int) -> list[int]:
    first = geometry.first
    ins = [c[0] for c in geometry.in_slabs(nworkers)[first:]]
    outs = [c[0] for c in geometry.out_slabs(nworkers)[first:]]
    return [int(np.prod(ins)) * geometry.in_dtype.itemsize, int(np.prod(outs)) * geometry.out_dtype.itemsize]


def _persisted_keys(x) -> list:
    """The keys of ``x``'s chunks where ``x`` is persisted (every chunk's future finished), else []."""
    from dask.core import flatten
    from distributed import futures_of

    if len(getattr(x.__dask_graph__(), "layers", ())) != 1:
        return []  # (a graph still to compute: looking for futures in it would materialize it)
    futures = futures_of(x)
    if len(futures) != x.npartitions or any(f.status != "finished" for f in futures):
        return []
    return list(flatten(x.__dask_keys__()))


def _groups(x, holders: dict):
    """``x``'s chunk indices grouped by the worker holding them (``holders``: key -> the workers
    holding it): one stage task per worker, as the rechunk's graph rewrite gives a persisted
    input (`dask_redist.graph.stages`); None where a chunk is not held (one stage task per chunk)."""
    from dask_redist.graph.stages import groups_by_holder

    return groups_by_holder(lambda idx: holders.get((x.name, *idx)), x.numblocks)


def _local_form(x, op: FFTOp, chunks):
    """The local path's form of the transform, for a scheduler other than distributed's."""
    from dask_redist.fft import local

    return local.build(x, op, chunks, "computed on a local scheduler")[0]


def build(x, op: FFTOp, chunks, placement: Placement | None = None):
    """The collective layer of ``op`` on ``x`` (`problem` said None) over ``placement`` (`where`'s;
    None: the default Client's workers and the input's holders, asked again), rechunked to
    ``chunks`` after it where cuFFTMp's output cannot be them directly."""
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph

    from dask_redist.compat import default_client
    from dask_redist.core.spec import CollectiveSpec
    from dask_redist.fft import local
    from dask_redist.graph.anywhere import collective_or_dask
    from dask_redist.graph.layer import CollectiveLayer, collective_tasks
    from dask_redist.graph.stages import group_of_chunks
    from dask_redist.planning import RechunkSpec

    config = Settings.from_config()
    if placement is None:
        placement = _placement(default_client(), x, config)[1]
    workers, groups = placement.workers, placement.groups
    natural = distributed(op, x.dtype, None).out_slabs(len(workers))
    direct = chunks is not None and distributed(op, x.dtype, None).last_axis_problem(chunks) is None
    geometry = distributed(op, x.dtype, tuple(map(tuple, chunks if direct else natural)))
    settings = replace(config, output_type="same")
    rechunk = RechunkSpec(x.chunks, geometry.input_space(geometry.out_chunks), geometry.in_dtype.itemsize)
    grouping = None if groups is None else group_of_chunks(groups, x.numblocks)
    name = f"redist-fft-{op.function}-" + tokenize(x.name, op, geometry.out_chunks, grouping)
    spec = CollectiveSpec(
        tokenize(name), x.name, name, rechunk, geometry.in_dtype, settings, "cupy", fft=geometry
    )
    layer = CollectiveLayer(collective_tasks(spec, groups))
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    meta = (x._meta.real if geometry.out_dtype.kind == "f" else x._meta).astype(geometry.out_dtype)
    y = da.Array(graph, name, geometry.out_chunks, meta=meta)
    # (a graph built while a Client is the default may be computed elsewhere: the local path there)
    y = collective_or_dask(y, partial(_local_form, x, op, y.chunks))
    record = {
        "op": op.describe(),
        "path": "gpu",
        "why": "CuPy chunks, and every worker can run cuFFTMp",
        "steps": [],
    }
    record["steps"].append(
        f"one collective step over {len(workers)} GPUs: stage, cuFFTMp ({op.kind.upper()}), unpack"
    )
    local.annotate(y, record)
    if chunks is not None and not direct:
        y, moved = local.rechunk(y, chunks)
        why = geometry.last_axis_problem(chunks)
        record["steps"].append(f"to the chunks asked for ({why}): {moved}")
    return y
