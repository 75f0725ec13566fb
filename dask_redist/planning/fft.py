"""The geometry of a distributed FFT run (cuFFTMp's slab distributions), pure NumPy.

A run transforms the trailing 2 or 3 axes of an array (the axes before are batches, a loop
of transforms on one plan). Every rank holds, for the transform, an X slab of the input
(cuFFTMp's ``Slab.X``: axis ``first`` in ``nranks`` slabs, the first ``X % nranks`` one
longer) and gets a Y slab of the output (``Slab.Y``: axis ``first + 1`` split the same way).
The run is then three steps on every rank, each collective:

1. *leg in*: the input chunks to the X slabs (a rechunk; slab ``r`` owned by rank ``r``);
2. the transforms, one per batch, in place on the symmetric heap (unnormalized, as cuFFT);
3. *leg out*: the Y slabs to the output chunks (a rechunk; owners chosen by the planner
   from the Y slabs' placement, `DistributedFFT.plan`), scaled for ``norm``.

The collective's `RechunkSpec` for such a run goes from the input chunks to the output
chunks *in the input's space* (`input_space`: the last axis at the input's length, one
chunk), which gives the output grid, its keys and balanced owners without a second type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dask_redist.planning.geometry import Chunks, RechunkSpec
from dask_redist.planning.plan import Plan, make_plan


def slab_sizes(length: int, parts: int) -> tuple[int, ...]:
    """``length`` in ``parts`` slabs, the first ``length % parts`` one longer (cuFFTMp's slabs)."""
    parts = max(1, min(int(parts), int(length)))
    return tuple(length // parts + (i < length % parts) for i in range(parts))


@dataclass(frozen=True)
class DistributedFFT:
    """One transform of the trailing ``ndim`` axes (2 or 3) of an array of ``in_shape``."""

    kind: str  # "c2c", "r2c" or "c2r"
    inverse: bool
    norm: str | None
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    ndim: int
    out_chunks: Chunks  # the result's chunks (whole along the last axis)
    in_dtype: np.dtype
    out_dtype: np.dtype

    @property
    def first(self) -> int:
        """The array axis of the transform's first axis (the axes before it are batches)."""
        return len(self.in_shape) - self.ndim

    @property
    def batches(self) -> int:
        return math.prod(self.in_shape[: self.first])

    @property
    def fft_type(self) -> str:
        return self.kind.upper()

    @property
    def parity(self) -> str:
        """The last output axis of a C2R transform: "even" (2 (m - 1)) or "odd" (2 (m - 1) + 1)."""
        return "odd" if self.kind == "c2r" and self.out_shape[-1] % 2 else "even"

    def in_slabs(self, nranks: int) -> Chunks:
        return _slabs(self.in_shape, self.first, nranks)

    def out_slabs(self, nranks: int) -> Chunks:
        return _slabs(self.out_shape, self.first + 1, nranks)

    def input_space(self, chunks: Chunks) -> Chunks:
        """Chunks of the output as the collective's rechunk sees them (see the module)."""
        return (*map(tuple, chunks[:-1]), (self.in_shape[-1],))

    def problem(self, nranks: int) -> str | None:
        """Why ``nranks`` ranks cannot run this transform (cuFFTMp's minimum), or None."""
        x, y = self.in_shape[self.first], self.in_shape[self.first + 1]
        if min(x, y, self.out_shape[self.first + 1]) < nranks:
            return (
                f"the transform's first two axes ({x}, {y}; {self.out_shape[self.first + 1]} after it) must each be "
                f"at least the number of GPUs ({nranks})"
            )
        return None

    def legs(self, old: Chunks, nranks: int) -> tuple[RechunkSpec, RechunkSpec]:
        """The rechunks in (input chunks -> X slabs) and out (Y slabs -> output chunks)."""
        return (
            RechunkSpec(old, self.in_slabs(nranks), self.in_dtype.itemsize),
            RechunkSpec(self.out_slabs(nranks), self.out_chunks, self.out_dtype.itemsize),
        )

    def slab_ranks(self, nranks: int, out: bool) -> np.ndarray:
        """Rank of every slab (rank ``r`` holds slab ``r``), shaped like the slab grid."""
        grid = [1] * len(self.in_shape)
        grid[self.first + out] = nranks
        return np.arange(nranks, dtype=np.int64).reshape(grid)

    def plan(self, rechunk: RechunkSpec, in_ranks, nranks: int, needed=None) -> Plan:
        """The run's plan: the input chunks where they are, each output chunk owned by the rank
        the planner picks for it from the Y slabs (balanced, moving the fewest bytes)."""
        _, out = self.legs(rechunk.old, nranks)
        owners = make_plan(out, self.slab_ranks(nranks, True), nranks, needed=needed).out_ranks
        return make_plan(rechunk, in_ranks, nranks, out_ranks=owners, needed=needed)

    @property
    def length(self) -> int:
        """N: the number of points of one transform (the real output's, for C2R)."""
        shape = self.out_shape if self.kind == "c2r" else self.in_shape
        return math.prod(shape[self.first :])

    @property
    def scale(self) -> float:
        """What the unnormalized result is multiplied by for NumPy's ``norm``."""
        n = self.length
        if self.norm == "ortho":
            return 1 / math.sqrt(n)
        if self.norm == "forward":
            return 1.0 if self.inverse else 1 / n
        return 1 / n if self.inverse else 1.0


def _slabs(shape, axis: int, nranks: int) -> Chunks:
    return tuple(slab_sizes(n, nranks) if a == axis else (n,) for a, n in enumerate(shape))
