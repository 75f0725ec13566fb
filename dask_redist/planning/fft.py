"""The geometry of a distributed FFT run (cuFFTMp's slab distributions), pure NumPy.

A run transforms the trailing 2 or 3 axes of an array (the axes before are batches, a loop
of transforms on one plan). Every rank holds, for the transform, a slab of the input and
gets the complementary slab of the output (cuFFTMp's built-in slabs, ``redistribute=False``):
``Slab.X`` splits axis ``first`` in ``nranks`` slabs, the first ``X % nranks`` one longer;
``Slab.Y`` splits axis ``first + 1`` the same way (`in_axis`, `out_axis`). The run is then
three steps on every rank, each collective:

1. *leg in*: the input chunks to the input slabs (a rechunk; slab ``r`` owned by rank ``r``);
2. the transforms, one per batch, in place on the symmetric heap (unnormalized, as cuFFT);
3. *leg out*: the output slabs to the output chunks (a rechunk; owners chosen by the planner
   from the slabs' placement, `DistributedFFT.plan`), scaled for ``norm``.

What cuFFTMp accepts, as nvmath-python 1.0 checks it (``nvmath/distributed/fft/fft.py``) and
cuFFTMp's "Supported functionalities" page states it, is encoded here (`problem`, `in_axis`):

* 2-D and 3-D operands only (``_problem_spec_reducer``);
* C2C on complex64/complex128, R2C on float32/float64, C2R on complex64/complex128
  (``_get_fft_concrete_type``);
* in 2-D, R2C takes ``Slab.X`` input only and C2R ``Slab.Y`` input only
  (``_problem_spec_reducer``); in 3-D both take either. C2R takes ``Slab.Y`` here in 2-D and
  3-D alike (cuFFTMp's own R2C/C2R pairing: R2C X -> Y, C2R Y -> X), so an ``irfftn`` of an
  ``rfftn``'s natural output needs no data moved before its transform;
* each of the first two global extents of the operand (for C2R the complex one) at least the
  number of processes (``FFT.__init__``); the output's are checked too, since a slab of
  nothing is not something this package's legs or cuFFTMp's plans are known to accept;
* the output comes in the complementary slab (``FFT.__init__``: ``result_partition_dim =
  1 - partition_dim``), slab sizes as `slab_sizes` (``_calculate_slab_shape_strides``);
  C2R's last axis is ``2 (m - 1)`` or ``2 (m - 1) + 1`` (``last_axis_parity``).

The collective's `RechunkSpec` for such a run goes from the input chunks to the output
chunks *in the input's space* (`input_space`: the last axis at the input's length, cut in as
many chunks as the output's), which gives the output grid, its keys and balanced owners
without a second type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dask_redist.planning.geometry import Chunks, RechunkSpec
from dask_redist.planning.plan import Plan, make_plan


#: The dtypes cuFFTMp transforms, per kind (nvmath's ``_get_fft_concrete_type``).
DTYPES = {
    "c2c": ("complex64", "complex128"),
    "r2c": ("float32", "float64"),
    "c2r": ("complex64", "complex128"),
}
#: The input slab each kind takes in 2-D, where cuFFTMp allows only one (nvmath's
#: ``_problem_spec_reducer``: "2D FFT R2C only supports X-slab input", "2D FFT C2R only
#: supports Y-slab input"); C2C takes either.
SLAB_2D = {"r2c": "X", "c2r": "Y"}


#: The local function of each transform kind (numpy.fft and cupy.fft both have them).
FUNCTIONS = {("c2c", False): "fftn", ("c2c", True): "ifftn", ("r2c", False): "rfftn", ("c2r", True): "irfftn"}


def slab_sizes(length: int, parts: int) -> tuple[int, ...]:
    """``length`` in ``parts`` slabs, the first ``length % parts`` one longer (cuFFTMp's slabs)."""
    parts = max(1, min(int(parts), int(length)))
    return tuple(length // parts + (i < length % parts) for i in range(parts))


def slab_refusal(kind: str, ndim: int, slab: str) -> str | None:
    """Why cuFFTMp refuses ``kind`` input in slab ``slab`` ("X" or "Y") in ``ndim`` dimensions."""
    if ndim == 2 and SLAB_2D.get(kind, slab) != slab:
        return f"a 2-D {kind.upper()} takes Slab.{SLAB_2D[kind]} input only, not Slab.{slab}"
    return None


@dataclass(frozen=True)
class DistributedFFT:
    """One transform of the trailing ``ndim`` axes (2 or 3) of an array of ``in_shape``."""

    kind: str  # "c2c", "r2c" or "c2r"
    inverse: bool
    norm: str | None
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    ndim: int
    out_chunks: Chunks  # the result's chunks
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
    def function(self) -> str:
        """The numpy.fft / cupy.fft function of the same transform (`FUNCTIONS`)."""
        return FUNCTIONS[(self.kind, self.inverse)]

    @property
    def fft_type(self) -> str:
        return self.kind.upper()

    @property
    def parity(self) -> str:
        """The last output axis of a C2R transform: "even" (2 (m - 1)) or "odd" (2 (m - 1) + 1)."""
        return "odd" if self.kind == "c2r" and self.out_shape[-1] % 2 else "even"

    @property
    def distribution(self) -> str:
        """The input's slab, "X" or "Y" (nvmath's ``Slab.X`` / ``Slab.Y``): Y for C2R (see the module)."""
        return "Y" if self.kind == "c2r" else "X"

    @property
    def in_axis(self) -> int:
        """The array axis the input slabs split."""
        return self.first + (self.distribution == "Y")

    @property
    def out_axis(self) -> int:
        """The array axis the output slabs split: the other of the first two (the complementary slab)."""
        return self.first + (self.distribution == "X")

    def in_slabs(self, nranks: int) -> Chunks:
        return _slabs(self.in_shape, self.in_axis, nranks)

    def out_slabs(self, nranks: int) -> Chunks:
        return _slabs(self.out_shape, self.out_axis, nranks)

    def slab_shape(self, nranks: int, rank: int, out: bool, batches: bool = False) -> tuple[int, ...]:
        """Rank ``rank``'s slab of one transform, of the output if ``out``; with ``batches``, of
        them all (the batch axes first)."""
        slabs = (self.out_slabs if out else self.in_slabs)(nranks)[0 if batches else self.first :]
        return tuple(c[rank] if len(c) > 1 else c[0] for c in slabs)

    def input_space(self, chunks: Chunks) -> Chunks:
        """Chunks of the output as the collective's rechunk sees them (see the module): the last
        axis at the input's length in as many chunks (`last_axis_problem`: possible)."""
        last = self.in_shape[-1]
        if len(chunks[-1]) == 1 or sum(chunks[-1]) == last:
            cut = (last,) if len(chunks[-1]) == 1 else tuple(chunks[-1])
        else:
            cut = slab_sizes(last, len(chunks[-1]))
        return (*map(tuple, chunks[:-1]), cut)

    def last_axis_problem(self, chunks: Chunks) -> str | None:
        """Why output ``chunks`` cannot be the run's own (more chunks along the last axis than
        the input's length, which `input_space` cannot cut), or None."""
        if len(chunks[-1]) > self.in_shape[-1]:
            return f"{len(chunks[-1])} chunks along the last axis, more than the input's length ({self.in_shape[-1]})"
        return None

    def problem(self, nranks: int) -> str | None:
        """Why cuFFTMp cannot run this transform over ``nranks`` processes (its rules, as the
        module lists them), or None: what would otherwise fail inside the run."""
        if self.ndim not in (2, 3) or self.first < 0:
            return f"a {self.ndim}-D transform: cuFFTMp does 2-D and 3-D ones"
        if self.in_dtype.name not in DTYPES[self.kind]:
            return f"dtype {self.in_dtype}: cuFFTMp's {self.fft_type} takes {' or '.join(DTYPES[self.kind])}"
        if why := slab_refusal(self.kind, self.ndim, self.distribution):
            return why
        if why := self._shape_problem():
            return why
        lengths = [*self.in_shape[self.first : self.first + 2], *self.out_shape[self.first : self.first + 2]]
        if min(lengths) < nranks:
            return (
                f"the transform's first two axes ({lengths[0]}, {lengths[1]}; {lengths[2]}, {lengths[3]} after it) "
                f"must each be at least the number of GPUs ({nranks})"
            )
        return None

    def _shape_problem(self) -> str | None:
        """Why the output's shape is not what cuFFTMp makes of the input's, or None."""
        expected = list(self.in_shape)
        m = self.in_shape[-1]
        if self.kind == "r2c":
            expected[-1] = m // 2 + 1
        elif self.kind == "c2r":
            expected[-1] = 2 * (m - 1) + (self.parity == "odd")
        if tuple(expected) != tuple(self.out_shape) or min(self.out_shape[self.first :]) < 1:
            return f"an output of shape {self.out_shape} from {self.in_shape}: cuFFTMp's {self.fft_type} makes {tuple(expected)}"
        return None

    def from_chunks_problem(self, old: Chunks) -> str | None:
        """Why one PE cannot transform input chunks ``old`` where they are (each chunk over the
        axes after the first into its rows of the result, then the first axis in place: no leg
        in), or None: a C2C transform of every axis, the chunks split the first axis only."""
        if self.kind != "c2c" or self.first != 0 or self.in_shape != self.out_shape:
            return "only a C2C transform of every axis, of the input's shape"
        if any(len(c) != 1 for c in old[1:]):
            return "input chunks split an axis after the first"
        return None

    def legs(self, old: Chunks, nranks: int) -> tuple[RechunkSpec, RechunkSpec]:
        """The rechunks in (input chunks -> input slabs) and out (output slabs -> output chunks)."""
        return (
            RechunkSpec(old, self.in_slabs(nranks), self.in_dtype.itemsize),
            RechunkSpec(self.out_slabs(nranks), self.out_chunks, self.out_dtype.itemsize),
        )

    def outputs_are_slabs(self, old: Chunks, nranks: int, out_ranks) -> bool:
        """Whether the output chunks are the output slabs, each on its slab's rank (``out_ranks``:
        the run's owners), so that the leg out moves nothing (one PE's one output chunk)."""
        _, out = self.legs(old, nranks)
        return out.old == out.new and np.array_equal(out_ranks, self.slab_ranks(nranks, True))

    def slab_ranks(self, nranks: int, out: bool) -> np.ndarray:
        """Rank of every slab (rank ``r`` holds slab ``r``), shaped like the slab grid."""
        grid = [1] * len(self.in_shape)
        grid[self.out_axis if out else self.in_axis] = nranks
        return np.arange(nranks, dtype=np.int64).reshape(grid)

    def plan(self, rechunk: RechunkSpec, in_ranks, nranks: int, needed=None) -> Plan:
        """The run's plan: the input chunks where they are, each output chunk owned by the rank
        the planner picks for it from the output slabs (balanced, moving the fewest bytes)."""
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
