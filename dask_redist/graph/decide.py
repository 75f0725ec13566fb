"""Which rechunks of a graph the collective takes, and why: chains of Dask's rechunk layers,
each decided (`decide`) into a `CollectiveSpec` or the reason it keeps Dask's rechunk. Pure:
`graph.optimize` rewrites the graph, ``explain`` reports the same decisions."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from dask_redist.compat import (
    CONFIG_METHOD,
    METHOD_ANNOTATION,
    METHOD_FROM_ANNOTATION,
    P2P_PREFIX,
    RECHUNK_PREFIXES,
)
from dask_redist.config import Settings
from dask_redist.core.spec import CollectiveSpec, CollectiveTask
from dask_redist.graph.layer import CollectiveLayer
from dask_redist.graph.lazy import ClonedRechunkStep
from dask_redist.graph.names import is_own
from dask_redist.planning import PlanError, RechunkSpec
from dask_redist.planning.cost import verdict
from dask_redist.planning.memory import beyond_memory, pause_fraction


#: What the reason of a rechunk asked for by `dask_redist.rechunk` says where ``redist.min-bytes``
#: would have kept Dask's.
EXPLICIT = "asked for by dask_redist.rechunk"


def is_rechunk_layer(name: str, layer=None) -> bool:
    """Is ``name`` a layer of Dask's rechunk: by its name, or a clone of one (``layer``, a
    `ClonedRechunkStep`: ``clone_key`` names a p2p rechunk's clone ``rechunk-<token>``)?"""
    return isinstance(name, str) and (
        name.startswith(RECHUNK_PREFIXES) or isinstance(layer, ClonedRechunkStep)
    )


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
    """Maximal chains of rechunk layers; a layer someone else needs ends a chain. A step only
    rechunks need (Dask's p2p pre-chunking of two rechunks of one array) is in each of their
    chains: each is one collective from its source, not one more for the step."""
    dependents = hlg.dependents
    deps = hlg.dependencies

    def rechunk(name) -> bool:
        return is_rechunk_layer(name, hlg.layers.get(name))

    def step(name) -> bool:  # a rechunk layer whose chain goes on through its one input
        return (
            rechunk(name)
            and len(deps.get(name, ())) == 1
            and not isinstance(hlg.layers[name], CollectiveLayer)
        )

    def absorbed(name):  # an intermediate step of a longer chain (or of several)
        after = dependents.get(name, set())
        return (
            (len(after) == 1 and rechunk(next(iter(after))) or len(after) > 1 and all(map(step, after)))
            and name not in requested
            and bool(deps.get(name))  # (a layer of data, e.g. a persisted rechunk's, is a source)
        )

    chains = []
    for name, layer in hlg.layers.items():
        if not rechunk(name) or absorbed(name) or isinstance(layer, CollectiveLayer):
            continue  # (a collective already: dask_redist.rechunk's output keeps its rechunk name)
        chain, current = [name], name
        while len(deps.get(current, ())) == 1:
            (previous,) = deps[current]
            if rechunk(previous) and absorbed(previous):
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


def kept_for_method(method: str | None, chosen_by: str | None = "method=") -> str | None:
    """Why a rechunk whose caller chose its method (``redist.respect-method`` when it was called,
    `compat.record_explicit_methods`) keeps Dask's rechunk; None: no method chosen. ``chosen_by``:
    ``"method="``, `compat.CONFIG_METHOD`, or None where unknown (expression mode)."""
    if method is None:
        return None
    how = {
        "method=": f"method={method!r} was passed to rechunk",
        CONFIG_METHOD: f"dask config sets {CONFIG_METHOD}: {method!r}",
    }.get(chosen_by, f"method={method!r} was passed to rechunk, or set as {CONFIG_METHOD}")
    return (
        f"{how}: Dask's own {method} rechunk runs (redist.respect-method; without a method chosen, "
        "or with dask_redist.rechunk(x, chunks), the collective)"
    )


def collective_spec(
    input_name: str,
    output_name: str,
    old,
    new,
    dtype,
    meta_type: str,
    settings: Settings,
    workers: int | None = None,
    dask_method: str = "tasks",
    explicit: bool = False,
) -> tuple[CollectiveSpec | None, str]:
    """The collective for rechunking ``input_name`` into ``output_name``, or None and why not.

    Shared by the graph rewrite and by expression mode (`dask_redist.graph.expr`). ``workers``:
    how many the cluster has, where known (the cost model measured nearest is used).
    ``dask_method``: what dask planned, ``tasks`` or ``p2p``. Dask's p2p rechunk cannot move CuPy
    chunks (distributed's shuffle reads its shards on the host and fails), so the collective never
    leaves it a rechunk of CuPy chunks for being small or cheap. ``explicit``: asked for by
    `dask_redist.rechunk`, which runs whatever ``redist.min-bytes`` would say (the reason says it).
    """
    if old is None or new is None or dtype is None:
        return None, "the rechunk's input carries no array metadata"
    if any(isinstance(c, float) and math.isnan(c) for axis in tuple(old) + tuple(new) for c in axis):
        return None, "chunk sizes are unknown (NaN); call compute_chunk_sizes() first"
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        return None, f"dtype {dtype} holds Python objects"
    chunk_type = (
        "cupy" if meta_type.startswith("cupy") else "numpy" if meta_type == "numpy.ndarray" else meta_type
    )
    if chunk_type not in settings.chunk_types:
        return (
            None,
            f"chunk type {meta_type or 'unknown'} is not in redist.chunk-types {list(settings.chunk_types)}",
        )
    if len(old) == 0:
        return None, "0-d arrays have nothing to rechunk"
    converts = settings.output_type not in ("same", chunk_type)
    chunk_type = chunk_type if settings.output_type == "same" else settings.output_type  # what the run moves
    try:
        rechunk = RechunkSpec(old, new, dtype.itemsize)
    except PlanError as e:
        return None, f"inconsistent chunks: {e}"
    estimated = ""
    if dask_method == "p2p" and chunk_type == "cupy":
        estimated = "Dask's p2p rechunk cannot move CuPy chunks"
    elif settings.min_bytes == "auto":
        faster, estimated = verdict(rechunk, chunk_type, settings.cost_model, workers)
        if faster:
            if not explicit:
                return None, faster
            estimated = f"{EXPLICIT}; without it the cost model would have kept Dask's rechunk: {faster}"
    elif rechunk.nbytes < settings.min_bytes:
        below = f"{rechunk.nbytes} bytes is below redist.min-bytes ({settings.min_bytes})"
        if not explicit:
            return None, below
        estimated = f"{EXPLICIT}; without it Dask's rechunk would run: {below}"
    # (other settings, or another input (w = x.rechunk(a).rechunk(b), then w beside x.rechunk(a)):
    # other stage and barrier keys, a fresh run)
    token = tokenize(output_name, input_name, rechunk.old, settings)
    spec = CollectiveSpec(token, input_name, output_name, rechunk, dtype, settings, chunk_type)
    reason = (
        f"eligible; chunks converted to {chunk_type} when staged (redist.output-type)"
        if converts
        else "eligible"
    )
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
    if (
        old is None
        or new is None
        or any(isinstance(c, float) for axis in tuple(old) + tuple(new) for c in axis)
    ):
        return None  # (collective_spec names missing metadata and unknown sizes)
    if len(old) == len(new) and all(sum(a) == sum(b) for a, b in zip(old, new)):
        return None
    return (
        f"the graph records the input's chunks as of shape {tuple(sum(a) for a in old)}, not the rechunk's "
        f"{tuple(sum(b) for b in new)} (dask keeps the chunks a layer was built with: compute_chunk_sizes() "
        "updates the array only); persist the input first, or use dask_redist.rechunk(x, chunks)"
    )


def decide(
    hlg: HighLevelGraph,
    chain: RechunkChain,
    settings: Settings,
    old=None,
    memory=None,
    explicit: bool = False,
) -> Decision:
    """Turn a chain into a `CollectiveSpec`, or say why it keeps dask's rechunk.

    ``old``: the input's chunks where the caller knows them (from the array itself); else
    from the graph (`input_chunks`). ``memory``: the workers' memory limits and pause
    fraction, where known (`planning.memory.beyond_memory`; their number picks the cost model).
    ``explicit``: `dask_redist.rechunk` asks (`collective_spec`).
    """
    method = _method(chain)
    source = hlg.layers.get(chain.source)
    out_ann = hlg.layers[chain.output].collection_annotations or {}
    if kept := kept_for_method(
        out_ann.get(METHOD_ANNOTATION), out_ann.get(METHOD_FROM_ANNOTATION, "method=")
    ):
        return Decision(chain, None, kept, method)
    old = input_chunks(hlg, chain) if old is None else old
    if stale := stale_chunks(old, out_ann.get("chunks")):
        return Decision(chain, None, stale, method)
    spec, reason = collective_spec(
        chain.source,
        chain.output,
        old,
        out_ann.get("chunks"),
        out_ann.get("dtype"),
        str(out_ann.get("chunk_type", "")),
        settings,
        len(memory[0]) if memory else None,
        method,
        explicit,
    )
    if spec is not None and (chain.source,) + (0,) * spec.rechunk.ndim not in source.get_output_keys():
        spec, reason = None, f"input keys of layer {chain.source} are not ({chain.source}, i, j, ...)"
    if spec is not None and memory is not None and spec.chunk_type == "numpy":
        if too_big := beyond_memory(spec.rechunk.nbytes, *memory):
            spec, reason = None, too_big
    return Decision(chain, spec, reason, method)


#: Why a rechunk whose output keys the scheduler holds with Dask's tasks behind them stays Dask's.
HELD_BY_DASK = (
    "the scheduler holds this rechunk's output keys with Dask's tasks behind them (it was built before "
    "enable() and run by Dask): the same keys with the collective's tasks would clash, so Dask's rechunk "
    "runs; build the rechunk after enable() for the collective (its keys are then its own)"
)


def held_by_dask(scheduler, d: Decision) -> Decision:
    """``d``, or Dask's rechunk where the output keys of a collective ``d`` are Dask's names
    (`graph.names`: built before `dask_redist.enable`) and ``scheduler`` holds them with another
    task behind them: one key with two tasks makes distributed warn of a different ``run_spec``
    and reuse what it holds."""
    if scheduler is None or not d.collective or is_own(d.chain.output):
        return d
    ts = scheduler.tasks.get((d.chain.output,) + (0,) * d.spec.rechunk.ndim)
    if ts is None or isinstance(ts.run_spec, CollectiveTask):
        return d
    return Decision(d.chain, None, HELD_BY_DASK, d.method)


def held_in_memory(scheduler, d: Decision) -> bool:
    """Does ``scheduler`` hold every output chunk of a collective ``d`` in memory (persisted, or
    held by another computation)? Then the rewrite fuses no consumer into its unpack tasks, so
    that the consumers are computed from those chunks, as Dask does, not by running the rechunk
    again (its unpack tasks would compute a fused consumer from scratch)."""
    if scheduler is None or not d.collective:
        return False
    group = scheduler.task_groups.get(d.chain.output)
    return group is not None and group.states.get("memory", 0) == math.prod(d.spec.rechunk.new_grid)


def memory_limits(limits) -> tuple[list[int], float]:
    """(the workers' memory ``limits``, None read as 0: none, distributed's pause fraction), for `decide`."""
    return [int(m or 0) for m in limits], pause_fraction()
