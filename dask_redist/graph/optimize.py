"""Find the rechunks in a dask array graph and swap them for the collective.

Dask builds ``x.rechunk(...)`` as one or more ``rechunk-merge-*`` layers (the
``tasks`` method, possibly a multi-step chain) or a ``rechunk-p2p-*`` layer
after a ``rechunk-merge-*`` pre-chunking layer. Whatever was picked, a chain of
such layers between an input layer and the last rechunk layer becomes one
collective layer whose unpack tasks carry the last layer's keys, so every
downstream task still finds its inputs.

Installed as dask's ``array_optimize`` by `dask_redist.enable`; under
distributed that hook runs on the scheduler while the graph is materialized.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

import numpy as np
from dask.base import tokenize
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from dask_redist.compat import P2P_PREFIX, RECHUNK_PREFIXES, DataNode, GraphNode, Task
from dask_redist.config import Settings
from dask_redist.core.spec import BARRIER_PREFIX, CollectiveSpec
from dask_redist.graph.layer import collective_tasks
from dask_redist.runtime import ordering
from dask_redist.planning import PlanError, RechunkSpec
from dask_redist.planning.cost import beyond_memory, dask_is_faster, estimate, pause_fraction

def is_rechunk_layer(name: str) -> bool:
    return isinstance(name, str) and name.startswith(RECHUNK_PREFIXES)


@dataclass(frozen=True)
class RechunkChain:
    """The rechunk layers, first to last, between ``source`` and the output layer."""

    source: str
    layers: tuple[str, ...]

    @property
    def output(self) -> str:
        return self.layers[-1]


@dataclass(frozen=True)
class Decision:
    """What happens to one rechunk, and why."""

    chain: RechunkChain
    spec: CollectiveSpec | None
    reason: str
    method: str  # what dask had planned: "tasks" (n steps) or "p2p"

    @property
    def collective(self) -> bool:
        return self.spec is not None


def find_rechunks(hlg: HighLevelGraph, requested: set[str] = frozenset()) -> list[RechunkChain]:
    """Maximal chains of rechunk layers; a layer someone else needs ends a chain."""
    dependents = hlg.dependents
    deps = hlg.dependencies

    def absorbed(name):  # an intermediate step of a longer chain
        after = dependents.get(name, set())
        return (
            len(after) == 1
            and is_rechunk_layer(next(iter(after)))
            and name not in requested
            and bool(deps.get(name))  # (a layer of data, e.g. a persisted rechunk's, is a source)
        )

    chains = []
    for name in hlg.layers:
        if not is_rechunk_layer(name) or absorbed(name):
            continue
        chain, current = [name], name
        while len(deps.get(current, ())) == 1:
            (previous,) = deps[current]
            if is_rechunk_layer(previous) and absorbed(previous):
                chain.insert(0, previous)
                current = previous
            else:
                chains.append(RechunkChain(previous, tuple(chain)))
                break
    return chains


def _method(chain: RechunkChain) -> str:
    if chain.output.startswith(P2P_PREFIX):
        return "p2p"
    return f"tasks ({len(chain.layers)} step{'s' * (len(chain.layers) > 1)})"


def collective_spec(
    input_name: str, output_name: str, old, new, dtype, chunk_type: str, settings: Settings,
    workers: int | None = None,
) -> tuple[CollectiveSpec | None, str]:
    """The collective for rechunking ``input_name`` into ``output_name``, or None and why not.

    Shared by the graph rewrite and by expression mode (`dask_redist.graph.expr`). ``workers``:
    how many the cluster has, where known (the cost model measured nearest is used).
    """  # fmt: skip
    if old is None or new is None or dtype is None:
        return None, "the rechunk's input carries no array metadata"
    if any(isinstance(c, float) and math.isnan(c) for axis in tuple(old) + tuple(new) for c in axis):
        return None, "chunk sizes are unknown (NaN); call compute_chunk_sizes() first"
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        return None, f"dtype {dtype} holds Python objects"
    kind = "cupy" if chunk_type.startswith("cupy") else "numpy" if chunk_type == "numpy.ndarray" else chunk_type
    if kind not in settings.chunk_types:
        return None, f"chunk type {chunk_type or 'unknown'} is not in redist.chunk-types {list(settings.chunk_types)}"
    if len(old) == 0:
        return None, "0-d arrays have nothing to rechunk"
    converts = settings.output_type not in ("same", kind)
    kind = kind if settings.output_type == "same" else settings.output_type  # what the run moves
    try:
        rechunk = RechunkSpec(old, new, dtype.itemsize)
    except PlanError as e:
        return None, f"inconsistent chunks: {e}"
    estimated = ""
    if settings.min_bytes == "auto":
        if faster := dask_is_faster(rechunk, kind, settings.cost_model, workers):
            return None, faster
        estimated = estimate(rechunk, kind, settings.cost_model, workers)
    elif rechunk.nbytes < settings.min_bytes:
        return None, f"{rechunk.nbytes} bytes is below redist.min-bytes ({settings.min_bytes})"
    spec = CollectiveSpec(tokenize(output_name), input_name, output_name, rechunk, dtype, settings, kind)
    reason = f"eligible; chunks converted to {kind} when staged (redist.output-type)" if converts else "eligible"
    return spec, f"{reason} ({estimated})" if estimated else reason


def input_chunks(hlg: HighLevelGraph, chain: RechunkChain):
    """The chunks of the chain's input, or None if the graph does not know them.

    A p2p layer first in the chain records them as its input had them. Otherwise only the
    input layer's annotation holds them, which dask writes when the layer is built: an array
    whose sizes ``compute_chunk_sizes()`` filled in later keeps the old ones there.
    """
    first = hlg.layers.get(chain.layers[0])
    given = getattr(first, "chunks_input", None)
    if given is not None:
        return tuple(map(tuple, given))
    return (getattr(hlg.layers.get(chain.source), "collection_annotations", None) or {}).get("chunks")


def stale_chunks(old, new) -> str | None:
    """Why ``old`` chunks cannot be the input of a rechunk to ``new`` chunks, or None."""
    if old is None or new is None or any(isinstance(c, float) for axis in tuple(old) + tuple(new) for c in axis):
        return None  # (collective_spec names missing metadata and unknown sizes)
    if len(old) == len(new) and all(sum(a) == sum(b) for a, b in zip(old, new)):
        return None
    return (
        f"the graph records the input's chunks as of shape {tuple(sum(a) for a in old)}, not the rechunk's "
        f"{tuple(sum(b) for b in new)} (dask keeps the chunks a layer was built with: compute_chunk_sizes() "
        "updates the array only); persist the input first, or use dask_redist.rechunk(x, chunks)"
    )


def decide(hlg: HighLevelGraph, chain: RechunkChain, settings: Settings, old=None, memory=None) -> Decision:
    """Turn a chain into a `CollectiveSpec`, or say why it keeps dask's rechunk.

    ``old``: the input's chunks where the caller knows them (from the array itself); else
    from the graph (`input_chunks`). ``memory``: the workers' memory limits and pause
    fraction, where known (`planning.cost.beyond_memory`; their number picks the cost model).
    """
    method = _method(chain)
    source = hlg.layers.get(chain.source)
    out_ann = hlg.layers[chain.output].collection_annotations or {}
    old = input_chunks(hlg, chain) if old is None else old
    if stale := stale_chunks(old, out_ann.get("chunks")):
        return Decision(chain, None, stale, method)
    spec, reason = collective_spec(
        chain.source, chain.output, old, out_ann.get("chunks"),
        out_ann.get("dtype"), str(out_ann.get("chunk_type", "")), settings, len(memory[0]) if memory else None,
    )  # fmt: skip
    if spec is not None and (chain.source,) + (0,) * spec.rechunk.ndim not in source.get_output_keys():
        spec, reason = None, f"input keys of layer {chain.source} are not ({chain.source}, i, j, ...)"
    if spec is not None and memory is not None and spec.kind == "numpy":
        if too_big := beyond_memory(spec.rechunk.nbytes, *memory):
            spec, reason = None, too_big
    return Decision(chain, spec, reason, method)


def memory_limits(limits) -> tuple[list[int], float]:
    """(the workers' memory ``limits``, None read as 0: none, distributed's pause fraction), for `decide`."""
    return [int(m or 0) for m in limits], pause_fraction()


def rewrite(
    hlg: HighLevelGraph, keys=(), settings: Settings | None = None, *, only: list[Decision] | None = None
) -> tuple[HighLevelGraph, list[Decision]]:
    """Replace every eligible rechunk chain in ``hlg`` (or the ``only`` ones) by a collective layer."""
    requested: set = set()
    if only is not None:
        decisions = only
    else:
        settings = settings or Settings.from_config()
        requested = {k[0] if isinstance(k, tuple) else k for k in flatten(keys)} if keys else set()
        scheduler = _scheduler_in_process()
        memory = memory_limits(ws.memory_limit for ws in scheduler.workers.values()) if scheduler else None
        decisions = [decide(hlg, c, settings, memory=memory) for c in find_rechunks(hlg, requested)]
    if not any(d.collective for d in decisions):
        return hlg, decisions
    layers, deps = dict(hlg.layers), {k: set(v) for k, v in hlg.dependencies.items()}
    for d in decisions:
        if not d.collective:
            continue
        for name in d.chain.layers[:-1]:
            del layers[name]
            del deps[name]
        out, source = d.chain.output, d.chain.source
        def inline(force: bool, chain=d.chain, grid=d.spec.rechunk.old_grid):
            return None if only is not None else inlined_inputs(hlg, chain, requested, grid, force=force)

        spec, groups, inputs = stage_grouping(d.spec, inline)
        layers[out] = MaterializedLayer(
            collective_tasks(spec, groups, inputs[0] if inputs else None),
            collection_annotations=hlg.layers[out].collection_annotations,
        )
        deps[out] = {source} | (deps[source] if inputs else set())
        if inputs and inputs[2]:  # nothing else needs the input chunks: their tasks leave the layer
            if inputs[1]:  # (what they depend on inside it stays)
                annotations = hlg.layers[source].collection_annotations
                layers[source] = MaterializedLayer(inputs[1], collection_annotations=annotations)
            else:
                del layers[source]
                deps[out] = deps.pop(source)
    return HighLevelGraph(layers, deps), decisions


def _is_array(value) -> bool:
    return not isinstance(value, GraphNode) and hasattr(value, "shape") and hasattr(value, "dtype")


def inlined_inputs(
    hlg: HighLevelGraph, chain: RechunkChain, requested: set, grid, force: bool = False
) -> tuple[dict, dict, bool] | None:
    """The tasks of the chain's input chunks, for its stage tasks to run themselves, the rest of
    their layer, and whether nothing else needs them; None where something else needs them
    (unless ``force``: an earlier submission of these keys inlined them), they are Futures
    or aliases, or their layer is annotated. Chunks that are data (``da.from_array`` of a
    NumPy array embeds them) are carried by their stage tasks.

    A stage task after each input task is one more task per input chunk, and at a few
    thousand small chunks dask's cost per task is the rechunk's cost (2000 chunks on 2 workers
    of the CPU machine: 4.7 s for the same graph shape in plain dask, 2.7 s for p2p, whose
    transfer tasks fuse with their inputs). Dask's own fusion would keep the stage keys as
    aliases, one task each again, so the rewrite inlines them itself.
    """
    name = chain.source
    exclusive = name not in requested and hlg.dependents.get(name) == {chain.layers[0]}
    if not (exclusive or force) or hlg.layers[name].annotations:
        return None  # (wanted by something else, or annotated: workers, resources, retries... stay its own)
    rest = dict(hlg.layers[name])
    chunks = {}
    for idx in np.ndindex(*grid):
        key = (name, *idx)
        task = rest.pop(key, None)
        if _is_array(task):  # (embedded by from_array: the stage task carries it)
            task = DataNode(key, task)
        if isinstance(task, Task) and task.block_fusion or not isinstance(task, (Task, DataNode)):
            return None  # (an alias, a Future, another collective's output)
        chunks[key] = task
    if any(set(t.dependencies) & chunks.keys() for t in rest.values() if isinstance(t, GraphNode)):
        return None
    return chunks, rest, exclusive


def _scheduler_in_process():
    """The scheduler building this graph, or None where that is unclear. Several can run in one
    process (two LocalClusters in a notebook); the one building a graph counts it in
    ``_active_graph_updates`` (distributed's, private: missing, and only a lone scheduler is
    taken)."""
    try:
        from distributed import Scheduler
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    running = [s for s in list(Scheduler._instances) if s.status.name == "running"]
    if len(running) > 1:  # (several in one process: the one whose graph is being built now)
        running = [s for s in running if getattr(s, "_active_graph_updates", 0) > 0]
    return running[0] if len(running) == 1 else None


#: The stage grouping each rechunk (by its plain token) got last on this scheduler, and
#: whether its stage tasks ran their input chunks' tasks.
_GROUPINGS: dict[str, tuple[str, list | None, bool]] = {}
GROUPINGS_KEPT = 10_000


def stage_grouping(spec: CollectiveSpec, inline=lambda force: None) -> tuple[CollectiveSpec, list | None, tuple | None]:
    """The spec, stage groups and inlined inputs (``inline(force)``: `inlined_inputs`) of a
    rechunk's graph; same keys always mean the same tasks.

    Grouping depends on where the input is, which changes (a worker died, the input was
    persisted again): a grouped graph gets a token of its own, so its stage and barrier keys
    are its own. While the tasks of an earlier submission are still known to the scheduler,
    the same rechunk gets that graph again, inlined inputs as before included, so that its
    keys keep their tasks (distributed warns about a key resubmitted with other dependencies,
    and keeps the old).
    """
    scheduler = _scheduler_in_process()
    earlier = _GROUPINGS.get(spec.token)
    if earlier is not None and scheduler is not None and BARRIER_PREFIX + earlier[0] in scheduler.tasks:
        token, groups, inlined = earlier
        inputs = inline(True) if inlined else None
        if inlined and inputs is None:  # (cannot be built as before: keys of its own)
            token = tokenize(token, "inputs not inlined")
    else:
        groups = persisted_groups(spec)
        inputs = inline(False) if groups is None else None
        token = spec.token if groups is None else tokenize(spec.token, group_of_chunks(groups, spec.rechunk.old_grid))
        _GROUPINGS.pop(spec.token, None)
        _GROUPINGS[spec.token] = (token, groups, inputs is not None)
        while len(_GROUPINGS) > GROUPINGS_KEPT:
            del _GROUPINGS[next(iter(_GROUPINGS))]
    return (spec if token == spec.token else replace(spec, token=token)), groups, inputs


def group_of_chunks(groups: list[list[tuple[int, ...]]], grid) -> np.ndarray:
    """Each input chunk's group number, by flat index: the grouping as one array, which dask
    tokenizes by its bytes (the groups as lists of index tuples took 0.53 s at 4096 chunks)."""
    out = np.empty(math.prod(grid), dtype=np.int64)
    for g, group in enumerate(groups):
        out[np.ravel_multi_index(tuple(np.asarray(group).T), grid)] = g
    return out


def persisted_groups(spec: CollectiveSpec) -> list[list[tuple[int, ...]]] | None:
    """Input chunk indices grouped by the worker holding them, if all are in memory already.

    Then one stage task per worker does: far fewer tasks than one per chunk. Read
    from the scheduler's state (this runs on the scheduler while the graph is
    materialized); anything unclear, and the plan stays one stage task per chunk.
    """
    scheduler = _scheduler_in_process()
    if scheduler is None:
        return None
    groups: dict[str, list] = {}
    try:
        for idx in np.ndindex(*spec.rechunk.old_grid):
            ts = scheduler.tasks.get((spec.input_name, *idx))
            if ts is None or ts.state != "memory" or not ts.who_has:
                return None
            groups.setdefault(min(ws.address for ws in ts.who_has), []).append(idx)
    except RuntimeError:  # state changed under us (another thread): no grouping
        return None
    if len(groups) >= math.prod(spec.rechunk.old_grid):
        return None
    return [groups[w] for w in sorted(groups)]


def running_on_scheduler() -> bool:
    """Is this hook materializing a graph inside a distributed scheduler?

    Under distributed the scheduler runs ``array_optimize`` in its offload thread;
    without a distributed scheduler the graph runs on a local one, where the
    collective cannot work, so dask's own rechunk is kept.
    """
    try:
        from distributed import Scheduler
    except ImportError:  # pragma: no cover - distributed is a dependency
        return False
    if not any(s.status.name == "running" for s in list(Scheduler._instances)):
        return False
    return threading.current_thread().name.startswith("Dask-Offload")


class CollectiveOptimizer:
    """dask's ``array_optimize`` hook: the collective rewrite, then the previous optimizer.

    Pickling snapshots the ``redist.*`` settings, so the scheduler acts on the
    client's config at the time the graph was submitted.
    """

    def __init__(self, chain=None, settings: Settings | None = None):
        self.chain = chain
        self.settings = settings

    def __reduce__(self):
        return (CollectiveOptimizer, (self.chain, self.settings or Settings.from_config()))

    def __call__(self, dsk, keys, **kwargs):
        if isinstance(dsk, HighLevelGraph) and running_on_scheduler():
            dsk, decisions = rewrite(dsk, keys, self.settings or Settings.from_config())
            if any(d.collective for d in decisions):
                ordering.install()  # before the scheduler orders this very graph
        if self.chain is not None:
            return self.chain(dsk, keys, **kwargs)
        from dask.array.optimization import optimize

        return optimize(dsk, keys, **kwargs)
