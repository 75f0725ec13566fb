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


import numpy as np
from dask.highlevelgraph import MaterializedLayer

from dask_redist.compat import DataNode, TaskRef
from dask_redist.core.spec import BarrierTask, CollectiveSpec, CollectiveTask
from dask_redist.runtime.tasks import barrier, stage, unpack


class CollectiveLayer(MaterializedLayer):
    """The layer of a collective (a rewritten rechunk, a distributed FFT): never a rechunk to
    rewrite again, though it keeps the rechunk's layer name (`graph.optimize.find_rechunks`).
    ``decision``: the rewrite's `graph.optimize.Decision` where it was made on the client
    (`dask_redist.rechunk`), for ``explain``."""

    def __init__(self, mapping, annotations=None, collection_annotations=None, decision=None):
        super().__init__(mapping, annotations=annotations, collection_annotations=collection_annotations)
        self.decision = decision


def collective_tasks(
    spec: CollectiveSpec, groups: list[list[tuple[int, ...]]] | None = None, inputs: dict | None = None
) -> dict:
    """The stage, barrier and unpack tasks of one collective rechunk.

    Without ``groups`` there is one stage task per input chunk, keyed like the
    chunk. With ``groups`` (input chunk indices already known to sit together on
    one worker each) there is one stage task per group: far fewer tasks, so less
    scheduling overhead, when the input is persisted. ``inputs``: tasks of input
    chunks the stage tasks run themselves (by key; `graph.stages.inlined_inputs`).
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
    dsk[spec.barrier_key] = BarrierTask(
        spec.barrier_key, barrier, DataNode(None, spec), *stage_refs, spec=spec
    )
    barrier_ref = TaskRef(spec.barrier_key)
    for flat, key in enumerate(spec.output_keys()):
        dsk[key] = CollectiveTask(key, unpack, spec.token, flat, barrier_ref)
    return dsk
