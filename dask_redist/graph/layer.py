"""The collective rechunk as tasks in a dask graph.

For a rechunk with token ``T`` of the array ``in`` into output keys ``out``::

    (in, i)  ->  ("redist-stage-T", i)  --+
    (in, j)  ->  ("redist-stage-T", j)  --+->  "redist-barrier-T"  ->  (out, k) for every k
    ...                                   |

* a **stage** task per input chunk (or per worker, for a persisted input whose
  placement is known) runs where the chunks live, keeps them in the worker's
  collective state and returns tiny markers (where, how big, which chunk);
* one **barrier** task gathers the markers and asks the scheduler to start a
  run: the scheduler picks output owners, pins the unpack tasks to them and
  tells every worker, which executes runs one at a time in a global order;
* an **unpack** task per output chunk, pinned to its owner, waits for the run
  and returns the chunk under the original output key, so downstream tasks
  keep working.

All three block low-level fusion: the scheduler plugin finds them by key. The
functions they run are `dask_redist.runtime.tasks`; the key names and task
classes, `dask_redist.core.spec`. Stage tasks are told their chunks' flat indices:
the N-D tails of the keys are dask's, converted here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from dask.base import clone_key, tokenize
from dask.highlevelgraph import MaterializedLayer

from dask_redist.compat import DataNode, GraphNode, TaskRef
from dask_redist.core.spec import BarrierTask, CollectiveSpec, CollectiveTask
from dask_redist.errors import RedistError
from dask_redist.runtime.tasks import barrier, stage, unpack, unpack_into


class CollectiveLayer(MaterializedLayer):
    """The layer of a collective (a rewritten rechunk, a distributed FFT): never a rechunk to
    rewrite again, though it keeps the rechunk's layer name (`graph.decide.find_rechunks`).
    ``decision``: the rewrite's `graph.optimize.Decision` where it was made on the client
    (`dask_redist.rechunk`), for ``explain``."""

    def __init__(self, mapping, annotations=None, collection_annotations=None, decision=None):
        super().__init__(mapping, annotations=annotations, collection_annotations=collection_annotations)
        self.decision = decision

    @property
    def spec(self) -> CollectiveSpec | None:
        """The spec its barrier task carries (None if it has none)."""
        return next((t.spec for t in self.mapping.values() if isinstance(t, BarrierTask)), None)

    def clone(self, keys: set, seed, bind_to=None) -> tuple[CollectiveLayer, bool]:
        """``dask.graph_manipulation``'s clone (`clone_collective`)."""
        tasks = clone_collective(dict(self), keys, seed, bind_to)
        return CollectiveLayer(tasks, self.annotations, self.collection_annotations), False


def clone_collective(tasks: dict, keys, seed, bind_to=None) -> dict:
    """The collective of ``tasks`` cloned (``dask.graph_manipulation.clone``, ``bind``): a rechunk
    of its own (a new token: its runs are not the original's), its output keys and its input's,
    where ``keys`` lists them, under ``clone_key(key, seed)``. Dask's generic clone kept the
    original's token and input keys: the clone's unpack tasks waited on the original's run."""
    (old,) = [t.spec for t in tasks.values() if isinstance(t, BarrierTask)]
    stages = [t for t in tasks.values() if isinstance(t.key, tuple) and t.key[0] == old.stage_name]
    inputs = {dep for t in stages for dep in t.dependencies}
    if bind_to is not None and not inputs & set(keys):
        raise RedistError(
            f"{old.describe()}: bind() of a collective built by dask_redist.rechunk/fft to its own input "
            "(omit=) is not supported; bind the input instead, or rechunk with x.rechunk under enable()"
        )
    spec = dataclasses.replace(
        old,
        token=tokenize(old.token, seed),
        input_name=clone_key(old.input_name, seed) if inputs & set(keys) else old.input_name,
        output_name=clone_key(old.output_name, seed),
    )
    subs = {dep: clone_key(dep, seed) for dep in inputs if dep in keys}
    out = {}
    for task in stages:  # (args: token, tail, indices, shapes, output type, then the input chunks)
        tail, rest, chunks = task.args[1], task.args[2:5], task.args[5:]
        key = (spec.stage_name, *tail)
        out[key] = CollectiveTask(key, stage, spec.token, tail, *rest, *(_renamed(a, subs) for a in chunks))
    return {**out, **barrier_and_unpacks(spec, list(out))}


def _renamed(arg, subs: dict):
    if isinstance(arg, TaskRef):
        return TaskRef(subs.get(arg.key, arg.key))
    return arg.substitute(subs) if isinstance(arg, GraphNode) else arg


def collective_tasks(
    spec: CollectiveSpec,
    groups: list[list[tuple[int, ...]]] | None = None,
    inputs: dict | None = None,
    consumers: list | None = None,
) -> dict:
    """The stage, barrier and unpack tasks of one collective rechunk.

    Without ``groups`` there is one stage task per input chunk, keyed like the
    chunk. With ``groups`` (input chunk indices already known to sit together on
    one worker each) there is one stage task per group: far fewer tasks, so less
    scheduling overhead, when the input is persisted. ``inputs``: tasks of input
    chunks the stage tasks run themselves (by key; `graph.stages.inlined_inputs`).
    ``consumers``: the task each unpack task runs on its chunk, by output chunk, under the
    consumer's key (``spec.consumer``; `graph.fuse.fusable_consumers`).
    """
    inputs = inputs or {}
    old, grid = spec.rechunk.old, spec.rechunk.old_grid
    if groups is None:  # (one chunk each, in C order: chunk g's flat index is g)
        groups = [[idx] for idx in np.ndindex(*grid)]
        tails = [tuple(g[0]) for g in groups]
        flats = [[g] for g in range(len(groups))]
    else:
        tails = [(i,) for i in range(len(groups))]
        flats = [np.ravel_multi_index(tuple(np.asarray(g).T), grid).tolist() for g in groups]
    dsk: dict = {}
    stage_refs = []
    output_type = spec.settings.output_type
    for tail, group, indices in zip(tails, groups, flats):
        key = (spec.stage_name, *tail)
        shapes = [tuple(c[i] for c, i in zip(old, idx)) for idx in group]
        args = [inputs.get((spec.input_name, *idx)) or TaskRef((spec.input_name, *idx)) for idx in group]
        dsk[key] = CollectiveTask(key, stage, spec.token, tail, indices, shapes, output_type, *args)
        stage_refs.append(TaskRef(key))
    return {**dsk, **barrier_and_unpacks(spec, [ref.key for ref in stage_refs], consumers)}


def barrier_and_unpacks(spec: CollectiveSpec, stage_keys: list, consumers: list | None = None) -> dict:
    """The barrier task over ``stage_keys`` and an unpack task per output chunk (running its
    ``consumers`` task, where given: `collective_tasks`)."""
    dsk: dict = {
        spec.barrier_key: BarrierTask(
            spec.barrier_key, barrier, DataNode(None, spec), *map(TaskRef, stage_keys), spec=spec
        )
    }
    barrier_ref = TaskRef(spec.barrier_key)
    for flat, key in enumerate(spec.output_keys()):
        if consumers is None:
            dsk[key] = CollectiveTask(key, unpack, spec.token, flat, barrier_ref)
            continue
        consumer = consumers[flat]
        chunk_key = (spec.output_name, *spec.rechunk.new_index(flat))
        others = [k for k in consumer.dependencies if k != chunk_key]
        dsk[key] = CollectiveTask(
            key,
            unpack_into,
            spec.token,
            flat,
            barrier_ref,
            DataNode(None, (consumer, chunk_key, others, key)),
            *map(TaskRef, others),
        )
    return dsk
