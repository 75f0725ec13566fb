"""What one collective rechunk is, as every process of the cluster sees it.

These types sit below both plugins (scheduler and worker) and the engines, and
travel between them: the graph carries a `CollectiveSpec` inside its barrier task,
stage tasks return `Staged` markers, the scheduler sends every rank a `RunSpec`.

Keys: for a rechunk with token ``T`` of the array ``in`` into output keys ``out``::

    (in, i)  ->  ("redist-stage-T", i)  --+
    (in, j)  ->  ("redist-stage-T", j)  --+->  "redist-barrier-T"  ->  (out, k) for every k

Chunks are named by flat index everywhere (`dask_redist.planning.geometry`); the
N-D tails of dask's keys are made here (`CollectiveSpec.output_key`) and in the
graph, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from dask_redist.compat import Task
from dask_redist.config import Settings
from dask_redist.planning import Plan, RechunkSpec, make_plan
from dask_redist.planning.fft import DistributedFFT

STAGE_PREFIX = "redist-stage-"
BARRIER_PREFIX = "redist-barrier-"
_LABELS = {"numpy": "NumPy", "cupy": "CuPy"}  # chunk types, as reasons name them


def stage_token(key) -> str | None:
    """The rechunk token of a stage task's key ``(STAGE_PREFIX + token, i, ...)``, else None."""
    if type(key) is tuple and key and type(key[0]) is str and key[0].startswith(STAGE_PREFIX):
        return key[0][len(STAGE_PREFIX) :]
    return None


@dataclass(frozen=True)
class CollectiveSpec:
    """Everything the scheduler and workers need to know about one collective rechunk."""

    token: str
    input_name: str
    output_name: str
    rechunk: RechunkSpec
    dtype: np.dtype
    settings: Settings
    chunk_type: str = "numpy"  # from the array's metadata (after redist.output-type): "numpy" or "cupy"
    #: what the run computes besides moving the chunks: None (a rechunk) or a distributed FFT
    #: (`dask_redist.planning.fft`; ``rechunk`` then goes from the input to the output chunks
    #: in the input's space), executed in the same run by an engine that runs FFTs
    fft: DistributedFFT | None = None
    #: the layer whose tasks the unpack tasks also run, under its keys (`graph.fuse`); "": none,
    #: the unpack tasks carry the output keys
    consumer: str = ""
    #: the axes of an output chunk's index that the consumer's keys keep, where it drops axes of
    #: one chunk (a reduction's aggregation over such an axis); None: all of them
    consumer_axes: tuple[int, ...] | None = None

    @property
    def stage_name(self) -> str:
        return STAGE_PREFIX + self.token

    @property
    def barrier_key(self) -> str:
        return BARRIER_PREFIX + self.token

    @property
    def unpack_name(self) -> str:
        """The name of the unpack tasks' keys: the output's, or its fused consumer's."""
        return self.consumer or self.output_name

    def output_key(self, flat: int) -> tuple:
        """The dask key of the task that hands output chunk ``flat`` over (its unpack task)."""
        return self._key(self.rechunk.new_index(flat))

    def output_keys(self) -> list[tuple]:
        """The keys of every unpack task, in flat order."""
        return [self._key(tuple(map(int, i))) for i in np.ndindex(*self.rechunk.new_grid)]

    def _key(self, index: tuple) -> tuple:
        if self.consumer_axes is not None:
            index = tuple(index[a] for a in self.consumer_axes)
        return (self.unpack_name, *index)

    def describe(self) -> str:
        what = "rechunk" if self.fft is None else f"fft ({self.fft.kind})"
        return f"{what} {self.token[:8]} ({self.output_name})"

    def run_problem(
        self, engine: str, kind: str, nranks: int, ffts: dict[str, tuple[str, ...]]
    ) -> str | None:
        """Why a run on ``engine`` over ``nranks`` ranks with staged chunks of ``kind`` cannot do
        what this spec asks, or None. ``ffts``: the engines that run FFTs, and on which chunk types
        (an FFT needs one of them, with one of its chunk types)."""
        if self.fft is None:
            return None
        if kind not in ffts.get(engine, ()):
            names = " or ".join(ffts) or "no"
            kinds = "/".join(sorted({_LABELS.get(k, k) for types in ffts.values() for k in types}))
            return f"{self.describe()} runs on the {names} engine with {kinds} chunks only, not {engine} with {kind} chunks"
        return self.fft.problem(nranks)

    def plan_run(self, in_ranks, nranks: int, needed=None) -> Plan:
        """The plan of a run over ``nranks`` ranks with the inputs at ``in_ranks`` (the
        scheduler's choice of owners): the planner's, or the FFT's (`DistributedFFT.plan`)."""
        if self.fft is not None:
            return self.fft.plan(self.rechunk, in_ranks, nranks, needed)
        return make_plan(self.rechunk, in_ranks, nranks, needed=needed)


class Staged(NamedTuple):
    """What a stage task returns per chunk: where the chunk is kept, and what it is."""

    address: str
    nbytes: int
    chunk_type: str
    index: int  # the chunk's flat index in the input grid
    stage: tuple  # the stage key's tail: (stage name, *stage)


@dataclass(frozen=True, eq=False)
class RunSpec:
    """What the scheduler tells every rank when it starts a run (each re-derives the plan)."""

    collective: CollectiveSpec
    run_id: int
    seq: int  # global order of runs: every worker executes runs by increasing seq
    workers: tuple[str, ...]  # rank -> worker address
    in_ranks: np.ndarray
    out_ranks: np.ndarray
    needed: np.ndarray
    engine: str
    chunk_type: str = "numpy"  # of the staged chunks: "numpy" or "cupy"
    reason: str = ""  # why this engine

    @property
    def token(self) -> str:
        return self.collective.token

    @cached_property
    def plan(self) -> Plan:
        return make_plan(
            self.collective.rechunk,
            self.in_ranks,
            len(self.workers),
            out_ranks=self.out_ranks,
            needed=self.needed,
        )

    def name(self, rank: int | None = None) -> str:
        who = "" if rank is None else f", rank {rank} ({self.workers[rank]})"
        return f"{self.collective.describe()} run {self.run_id}{who}"


class CollectiveTask(Task):
    """A task of the collective: never fused, so its key stays findable by the scheduler plugin."""

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
