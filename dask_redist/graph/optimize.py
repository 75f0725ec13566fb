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

import gc
import threading
from contextlib import contextmanager
from dataclasses import replace

from dask.base import tokenize
from dask.core import flatten
from dask.utils import ensure_dict
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

from dask_redist.compat import (
    running_schedulers,
)
from dask_redist.config import Settings
from dask_redist.graph.decide import (
    Decision,
    RechunkChain,
    decide,
    find_rechunks,
    held_by_dask,
    held_in_memory,
    memory_limits,
)
from dask_redist.graph.fuse import fusable_consumers, fuse_blockwise
from dask_redist.graph.layer import CollectiveLayer, collective_tasks
from dask_redist.graph.stages import inlined_inputs, scheduler_in_process, stage_grouping
from dask_redist.runtime import ordering, submitted


def fused_neighbours(hlg: HighLevelGraph, decisions: list[Decision], keys, held=frozenset()) -> list[str]:
    """What each collective of ``decisions`` runs besides the rechunk (`graph.fuse`), as `rewrite`
    fuses them in a graph asked for ``keys`` (the same layers kept apart; no consumer of an output
    of ``held``, in memory on the scheduler); "" where nothing."""
    fusing = [d.collective and d.spec.settings.fuse for d in decisions]
    if not any(fusing):
        return [""] * len(decisions)
    requested = {k[0] if isinstance(k, tuple) else k for k in flatten(keys)}
    hlg = fuse_blockwise(hlg, keys)
    taken = {d.chain.source for d in decisions if d.collective} | set(held)
    out = []
    for d, fuse in zip(decisions, fusing):
        parts = []
        if fuse and (inputs := inlined_inputs(hlg, d.chain, requested, d.spec.rechunk.old_grid, taken=taken)):
            taken.update(inputs[3])
            parts.append(f"stage tasks compute {', '.join((*inputs[3], d.chain.source))}")
        if fuse and (
            consumers := fusable_consumers(hlg, d.chain.output, d.spec.output_keys(), requested, taken)
        ):
            taken.update(consumers.names)
            parts.append(f"unpack tasks compute {', '.join(consumers.names)}")
        out.append("; ".join(parts))
    return out


#: `Decision.method` of a collective built before its graph reached the scheduler
BUILT = "built as a collective"


def built_collectives(hlg: HighLevelGraph) -> list[Decision]:
    """The collectives built on the client (`dask_redist.fft`'s transforms, `dask_redist.rechunk`)
    as decisions, so that `rewrite` fuses their neighbours as it fuses a rechunk's."""
    out = []
    for name, layer in hlg.layers.items():
        spec = layer.spec if isinstance(layer, CollectiveLayer) else None
        if spec is not None and not spec.consumer and spec.output_name == name:
            out.append(Decision(RechunkChain(spec.input_name, (name,)), spec, BUILT, BUILT))
    return out


def rewrite(
    hlg: HighLevelGraph, keys=(), settings: Settings | None = None, *, only: list[Decision] | None = None
) -> tuple[HighLevelGraph, list[Decision]]:
    """Replace every eligible rechunk chain in ``hlg`` (or the ``only`` ones) by a collective layer."""
    requested: set = set()
    held: set = set()  # (outputs the scheduler holds in memory: no consumer fused into them)
    if only is not None:
        decisions = only
    else:
        settings = settings or Settings.from_config()
        requested = {k[0] if isinstance(k, tuple) else k for k in flatten(keys)} if keys else set()
        scheduler = scheduler_in_process()
        memory = memory_limits(ws.memory_limit for ws in scheduler.workers.values()) if scheduler else None
        decisions = [decide(hlg, c, settings, memory=memory) for c in find_rechunks(hlg, requested)]
        decisions = [held_by_dask(scheduler, d) for d in decisions]
        if settings.fuse:
            decisions += built_collectives(hlg)
            held = {d.chain.output for d in decisions if held_in_memory(scheduler, d)}
    if not any(d.collective for d in decisions):
        return hlg, decisions
    if only is None and settings.fuse:
        hlg = fuse_blockwise(hlg, keys)
    layers, deps = dict(hlg.layers), {k: set(v) for k, v in hlg.dependencies.items()}
    # layers no unpack tasks may compute: another collective's input (its stage tasks run it), and
    # a consumer some collective's unpack tasks compute already (one of two rechunks it adds up)
    # and an output the scheduler holds in memory (then nothing is fused into its unpack tasks)
    taken = {d.chain.source for d in decisions if d.collective} | held
    kept = {name for d in decisions if not d.collective for name in d.chain.layers}  # (steps shared)
    for i, d in enumerate(decisions):
        if d.collective:
            fuse = only is None and settings.fuse
            decisions[i] = _replace_chain(
                hlg, layers, deps, d, requested, taken if fuse else None, only is not None, kept
            )
    return HighLevelGraph(layers, deps), decisions


def _replace_chain(
    hlg,
    layers: dict,
    deps: dict,
    d: Decision,
    requested: set,
    taken: set | None,
    explicit: bool = False,
    kept=frozenset(),
) -> Decision:
    """Put the collective of ``d`` in place of its chain in ``layers`` and ``deps`` (``hlg``'s, changed
    in place), fused with its neighbours unless ``taken`` is None (layers no unpack tasks may
    compute; the consumer it fuses is added); the decision, with the spec it ran. ``explicit``:
    `dask_redist.rechunk`'s, whose layer keeps its decision for ``explain``. ``kept``: steps of
    chains that keep Dask's rechunk (a step two chains share stays for the other)."""
    for name in set(d.chain.layers[:-1]) - set(kept):
        layers.pop(name, None)  # (a step shared with another collective's chain: gone already)
        deps.pop(name, None)
    out, source = d.chain.output, d.chain.source
    consumers = None if taken is None else fusable_consumers(hlg, out, d.spec.output_keys(), requested, taken)
    if consumers is not None:
        taken.update(consumers.names)
        fused = replace(
            d.spec,
            consumer=consumers.name,
            consumer_axes=consumers.axes,
            token=tokenize(d.spec.token, consumers.names),
        )
        d = replace(d, spec=fused)

    found: dict[bool, tuple | None] = {}  # (by force: asked below, then by stage_grouping)

    def inline(force: bool, chain=d.chain, grid=d.spec.rechunk.old_grid):
        if taken is not None and force not in found:
            found[force] = inlined_inputs(hlg, chain, requested, grid, force=force, taken=taken)
        return found.get(force)

    if d.method == BUILT and consumers is None and inline(False) is None:
        return d  # (nothing to fuse: the collective stays as it was built)
    spec, groups, inputs = stage_grouping(d.spec, inline)
    if inputs:  # (no other collective's tasks compute the layers its stage tasks run)
        taken.update(inputs[3])
    tasks = collective_tasks(spec, groups, inputs[0] if inputs else None, consumers and consumers.tasks)
    annotations = hlg.layers[out].collection_annotations
    if consumers is not None:  # the consumer's layer is the collective's: its dependents find it by name
        annotations = hlg.layers[consumers.name].collection_annotations
        del deps[out], layers[out]
        for name in consumers.names[:-1]:  # (the other layers fused: inside the last one's tasks)
            del layers[name]
            deps[consumers.name] |= deps.pop(name)
        out = consumers.name
        deps[out] -= {d.chain.output, *consumers.names}
    layers[out] = CollectiveLayer(tasks, collection_annotations=annotations, decision=d if explicit else None)
    deps[out] = (_inlined_away(hlg, layers, deps, source, inputs) if inputs else {source}) | (
        deps[out] if consumers else set()
    )
    return replace(d, spec=spec)


def _inlined_away(hlg, layers: dict, deps: dict, source: str, inputs: tuple) -> set:
    """The layers the stage tasks depend on where they run the input chunks' tasks and the layers
    producing them (``inputs``: `inlined_inputs`). Where nothing else needs those chunks, their
    tasks leave ``layers`` (``hlg``'s, changed in place, ``deps`` with them): the input layer keeps
    the rest of its tasks, if any, and the producing layers go (no task left needs them)."""
    chunks, rest, exclusive, feeders = inputs
    near = ({source} | deps[source]).union(*(deps[n] for n in feeders)) - set(feeders)
    if exclusive:
        for name in feeders:
            del layers[name], deps[name]
        if rest:  # (what they depend on inside it stays)
            annotations = hlg.layers[source].collection_annotations
            layers[source] = MaterializedLayer(rest, collection_annotations=annotations)
            deps[source] -= set(feeders)
        else:
            del layers[source], deps[source]
            near.discard(source)
    needed = set().union(*(t.dependencies for t in chunks.values()))
    return {n for n in near if not needed.isdisjoint(layers.get(n, hlg.layers[n]).get_output_keys())}


def running_on_scheduler() -> bool:
    """Is this hook materializing a graph inside a distributed scheduler?

    Under distributed the scheduler runs ``array_optimize`` in its offload thread;
    without a distributed scheduler the graph runs on a local one, where the
    collective cannot work, so dask's own rechunk is kept.
    """
    if not running_schedulers():
        return False
    return threading.current_thread().name.startswith("Dask-Offload")


@contextmanager
def gc_paused():
    """Python's automatic garbage collection held off (where it was on) while the rewrite builds
    its tasks. A pipeline's rewrite builds the tasks of the rechunk's neighbours (tens of
    thousands of objects at a thousand chunks, all kept: they go to the scheduler), and the
    collections their allocations trigger walked the scheduler's whole heap: about half the
    rewrite at 1024 chunks (docs/benchmarks.md, "Where the client's time went before the stages
    start"). Collection resumes after it, as it was."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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

    def __eq__(self, other):  # (dask groups collections by their hook: equal snapshots, one graph)
        return type(other) is CollectiveOptimizer and (self.chain, self.settings) == (
            other.chain,
            other.settings,
        )

    def __hash__(self):
        return hash((CollectiveOptimizer, self.chain, self.settings))

    def __call__(self, dsk, keys, **kwargs):
        decisions = []
        if isinstance(dsk, HighLevelGraph) and running_on_scheduler():
            if (scheduler := scheduler_in_process()) is not None:  # (the next graph's retries, seen)
                submitted.install(scheduler)
            with gc_paused():
                dsk, decisions = rewrite(dsk, keys, self.settings or Settings.from_config())
            if any(d.collective for d in decisions):
                ordering.install()  # before the scheduler orders this very graph
        if self.chain is not None:
            return self.chain(dsk, keys, **kwargs)
        if nothing_to_optimize(dsk, keys, decisions):
            return ensure_dict(dsk)
        from dask.array.optimization import optimize

        return optimize(dsk, keys, **kwargs)


def nothing_to_optimize(hlg, keys, decisions: list[Decision]) -> bool:
    """Would dask's array optimizations leave this rewritten graph as it is? True where it holds
    only collective layers and layers of Futures (a persisted input), and the keys asked for are
    every output of its collective layers: nothing to cull (every task is needed), nothing to fuse
    (the collective's tasks block fusion; Futures are no tasks). Dask's passes change nothing in
    such a graph, at a cost that grows with its chunks (docs/benchmarks.md, "Down to Dask's own
    floor"). A collective fused with its consumer has that consumer's layer name (`_replace_chain`)."""
    outputs = {d.spec.unpack_name for d in decisions if d.collective}
    if not outputs or not isinstance(hlg, HighLevelGraph):
        return False
    from distributed import Future

    for name, layer in hlg.layers.items():
        if name in outputs:
            continue
        if not isinstance(layer, MaterializedLayer) or not all(isinstance(v, Future) for v in layer.values()):
            return False
    wanted = {k for d in decisions if d.collective for k in d.spec.output_keys()}
    return set(flatten(keys)) == wanted
