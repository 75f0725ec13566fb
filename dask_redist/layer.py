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

All three block low-level fusion: the scheduler plugin finds them by key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dask_redist.compat import DataNode, Task, TaskRef

from dask_redist.config import Settings
from dask_redist.planning import RechunkSpec

STAGE_PREFIX = "redist-stage-"
BARRIER_PREFIX = "redist-barrier-"


@dataclass(frozen=True)
class CollectiveSpec:
    """Everything the scheduler and workers need to know about one collective rechunk."""

    token: str
    input_name: str
    output_name: str
    rechunk: RechunkSpec
    dtype: np.dtype
    settings: Settings
    kind: str = "numpy"  # chunk type from the array's metadata: "numpy" or "cupy"

    @property
    def stage_name(self) -> str:
        return STAGE_PREFIX + self.token

    @property
    def barrier_key(self) -> str:
        return BARRIER_PREFIX + self.token

    def output_key(self, flat: int) -> tuple:
        return (self.output_name, *(int(i) for i in np.unravel_index(flat, self.rechunk.new_grid)))

    def output_keys(self) -> list[tuple]:
        return [(self.output_name, *map(int, i)) for i in np.ndindex(*self.rechunk.new_grid)]

    def describe(self) -> str:
        return f"rechunk {self.token[:8]} ({self.output_name})"


class CollectiveTask(Task):
    """A task of the collective: never fused, so its key stays findable."""

    __slots__ = ()

    @property
    def block_fusion(self) -> bool:
        return True


class BarrierTask(CollectiveTask):
    """The barrier; carries the spec so that the scheduler plugin can read it."""

    spec: CollectiveSpec
    __slots__ = ("spec",)

    def __init__(self, key, func, /, *args, spec: CollectiveSpec, **kwargs):
        self.spec = spec
        super().__init__(key, func, *args, **kwargs)


def stage(token: str, tail: tuple, indices: list, shapes: list, *chunks):
    from dask_redist._worker import stage as _stage

    return _stage(token, tail, indices, shapes, chunks)


def barrier(spec: CollectiveSpec, *markers):
    from dask_redist._worker import barrier as _barrier

    return _barrier(spec, markers)


async def unpack(token: str, index: int, run_id: int):
    """A coroutine, so that distributed runs it on the worker's event loop."""
    from dask_redist._worker import unpack as _unpack

    return await _unpack(token, index, run_id)


def collective_tasks(spec: CollectiveSpec, groups: list[list[tuple[int, ...]]] | None = None) -> dict:
    """The stage, barrier and unpack tasks of one collective rechunk.

    Without ``groups`` there is one stage task per input chunk, keyed like the
    chunk. With ``groups`` (input chunk indices already known to sit together on
    one worker each) there is one stage task per group: far fewer tasks, so less
    scheduling overhead, when the input is persisted.
    """
    old = spec.rechunk.old
    if groups is None:
        groups = [[idx] for idx in np.ndindex(*spec.rechunk.old_grid)]
        tails = [tuple(g[0]) for g in groups]
    else:
        tails = [(i,) for i in range(len(groups))]
    dsk: dict = {}
    stage_refs = []
    for tail, group in zip(tails, groups):
        key = (spec.stage_name, *tail)
        shapes = [tuple(c[i] for c, i in zip(old, idx)) for idx in group]
        inputs = [TaskRef((spec.input_name, *idx)) for idx in group]
        dsk[key] = CollectiveTask(key, stage, spec.token, tail, [tuple(i) for i in group], shapes, *inputs)
        stage_refs.append(TaskRef(key))
    dsk[spec.barrier_key] = BarrierTask(spec.barrier_key, barrier, DataNode(None, spec), *stage_refs, spec=spec)
    barrier_ref = TaskRef(spec.barrier_key)
    for flat in range(math.prod(spec.rechunk.new_grid)):
        key = spec.output_key(flat)
        dsk[key] = CollectiveTask(key, unpack, spec.token, flat, barrier_ref)
    return dsk
