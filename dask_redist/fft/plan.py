"""What a distributed FFT does, decided before any graph is built (pure NumPy, no dask).

`FFTOp` is one call (``fftn``, ``rfftn``, ...) with its arguments checked and normalized as
NumPy does (`normalize`). `passes` cuts it into the passes of the path that runs everywhere:
each pass first rechunks the array so that the axes it transforms are whole in every chunk
(split along one other axis), then transforms every chunk locally. One pass where an axis
that is not transformed (a batch axis) can carry the split; otherwise two, as the slab
decomposition does: all axes but one, then that one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dask_redist.planning.fft import FUNCTIONS, slab_sizes

NORMS = (None, "backward", "ortho", "forward")


@dataclass(frozen=True)
class FFTOp:
    """One N-D transform of an array of shape ``shape``: over ``axes`` (normalized, in order),
    to lengths ``s`` (the logical transform lengths, as NumPy's ``s``)."""

    kind: str  # "c2c", "r2c" (rfftn) or "c2r" (irfftn)
    inverse: bool
    axes: tuple[int, ...]
    s: tuple[int, ...]
    norm: str | None
    shape: tuple[int, ...]  # the input's

    @property
    def function(self) -> str:
        return FUNCTIONS[(self.kind, self.inverse)]

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The result's shape (NumPy's)."""
        out = list(self.shape)
        for axis, n in zip(self.axes, self.s):
            out[axis] = n
        if self.kind == "r2c":
            out[self.axes[-1]] = self.s[-1] // 2 + 1
        return tuple(out)

    def describe(self) -> str:
        return (
            f"{self.function} over axes {list(self.axes)}, s={list(self.s)}, norm={self.norm or 'backward'}"
        )


def _axis(axis, ndim: int, name: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{name} must hold integers, got {axis!r}")
    if not -ndim <= axis < ndim:  # (NumPy's AxisError: a ValueError and an IndexError)
        raise np.exceptions.AxisError(
            f"{name}: axis {axis} is out of bounds for an array of dimension {ndim}"
        )
    return int(axis) % ndim


def normalize(shape, kind: str, inverse: bool, s=None, axes=None, norm=None) -> FFTOp:
    """The transform NumPy's ``fftn``/``rfftn``/``irfftn`` (``kind``, ``inverse``) would do with
    ``s``, ``axes`` and ``norm`` on an array of ``shape``; errors name the argument.

    As NumPy: ``axes`` defaults to the last ``len(s)`` axes (or all), ``s`` to the input's
    lengths (``irfftn``: ``2 * (m - 1)`` on the last axis), ``-1`` in ``s`` keeps the input's
    length. An axis may not be repeated here: `repeated_axes` splits such a call in steps.
    No axis to transform (``axes=()``, ``s=()``, a 0-d array): ``fftn``/``ifftn`` transform
    nothing (`FFTOp.axes` empty: NumPy returns the input), ``rfftn``/``irfftn`` raise IndexError,
    as NumPy does.
    """
    shape = tuple(int(n) for n in shape)
    if norm not in NORMS:
        raise ValueError(f'norm must be None, "backward", "ortho" or "forward", got {norm!r}')
    if axes is None:
        axes = range(len(shape)) if s is None else range(len(shape) - len(s), len(shape))
    axes = tuple(_axis(a, len(shape), "axes") for a in axes)
    if not axes and kind != "c2c":  # (NumPy: IndexError, from its last axis)
        raise IndexError(
            f"{FUNCTIONS[(kind, inverse)]} needs an axis to transform (its last one is halved): axes is empty"
        )
    if len(set(axes)) != len(axes):
        raise ValueError(f"axes must not repeat an axis, got {list(axes)}")
    shapeless = s is None
    s = [shape[a] for a in axes] if shapeless else list(s)
    if len(s) != len(axes):
        raise ValueError(f"s and axes have different lengths ({len(s)} and {len(axes)})")
    if kind == "c2r" and shapeless:
        s[-1] = 2 * (shape[axes[-1]] - 1)
    out = []
    for n, a in zip(s, axes):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"s must hold integers, got {n!r}")
        n = shape[a] if n == -1 else int(n)
        if n < 1:
            raise ValueError(f"s: invalid number of data points ({n}) for axis {a}; each must be >= 1")
        out.append(n)
    return FFTOp(kind, inverse, axes, tuple(out), norm, shape)


def _one_d_ops(kind: str, axes: tuple, s: list) -> list[tuple[str, int, int]]:
    """NumPy's order of 1-D transforms for ``fftn``/``rfftn``/``irfftn``: (kind, axis, n) each."""
    ops = [("c2c", a, n) for a, n in zip(axes, s)]
    if kind == "c2c":
        return ops[::-1]
    if kind == "r2c":  # rfft over the last axis first, then fft over the others, last to first
        return [("r2c", *ops[-1][1:]), *ops[-2::-1]]
    return [*ops[:-1], ("c2r", *ops[-1][1:])]  # ifft over all axes but the last, in order; then irfft


def repeated_axes(shape, kind: str, s=None, axes=None) -> list[tuple[str, tuple, tuple]] | None:
    """Where ``axes`` repeat an axis, NumPy transforms it again: the steps that do as NumPy does,
    each over distinct axes, as (kind, s, axes), first to last; None where no axis repeats.

    NumPy applies one 1-D transform per entry of ``axes`` (`_one_d_ops`); consecutive ones over
    distinct axes commute and are one step. ``s`` defaults as NumPy's, from the input's shape."""
    if axes is None:
        return None
    shape = tuple(int(n) for n in shape)
    axes = tuple(_axis(a, len(shape), "axes") for a in axes)
    if len(set(axes)) == len(axes):
        return None
    if s is None:
        s = [shape[a] for a in axes]
        if kind == "c2r":
            s[-1] = 2 * (shape[axes[-1]] - 1)
    elif len(s) != len(axes):
        raise ValueError(f"s and axes have different lengths ({len(s)} and {len(axes)})")
    steps: list[list[tuple[str, int, int]]] = []
    for op in _one_d_ops(kind, axes, [shape[a] if n == -1 else n for n, a in zip(s, axes)]):
        if not steps or op[1] in {a for _, a, _ in steps[-1]}:
            steps.append([])
        steps[-1].append(op)
    out = []
    for ops in steps:
        real = [o for o in ops if o[0] != "c2c"]  # (the real axis last: FFTOp transforms it so)
        ops = [o for o in ops if o[0] == "c2c"] + real
        out.append((real[0][0] if real else "c2c", tuple(n for _, _, n in ops), tuple(a for _, a, _ in ops)))
    return out


@dataclass(frozen=True)
class Pass:
    """One pass: rechunk so that ``axes`` are whole, split along ``split``, then apply
    ``function`` (a numpy.fft / cupy.fft name) to every chunk over ``axes`` with ``s``."""

    function: str
    axes: tuple[int, ...]
    s: tuple[int, ...]
    split: int | None  # the axis left in several chunks (None: nothing to split, one chunk)


def _pick(candidates, key) -> int | None:
    candidates = list(candidates)
    return max(candidates, key=key) if candidates else None


def passes(op: FFTOp, numblocks: tuple[int, ...]) -> tuple[list[Pass], str]:
    """The passes of ``op`` on an array with ``numblocks`` chunks per axis, and why so many.

    A batch axis (one not transformed) carries the split of a single pass when it is at least
    as long as the split a slab decomposition would have (``prod(numblocks)`` slabs, at most the
    axis length). Otherwise the first pass transforms every axis but one (the one with most
    chunks already; for ``irfftn`` the last, which NumPy transforms last), the second that one,
    split along the longest of the others.
    """
    axes, kind = op.axes, op.kind
    chunked = [a for a in axes if numblocks[a] > 1]
    if not chunked:
        return [
            Pass(op.function, axes, op.s, None)
        ], "every transformed axis is one chunk already: one local pass"
    want = math.prod(numblocks)
    batch = _pick(
        (a for a in range(len(op.shape)) if a not in axes), key=lambda a: (op.shape[a], numblocks[a])
    )
    if batch is not None and op.shape[batch] > 1:
        if len(axes) == 1 or op.shape[batch] >= min(want, max(op.shape[a] for a in axes)):
            return [
                Pass(op.function, axes, op.s, batch)
            ], f"split along batch axis {batch}: one rechunk, one local pass"
    if len(axes) == 1:
        return [
            Pass(op.function, axes, op.s, None)
        ], "a 1-D transform with no batch axis to split along: one chunk"
    length = dict(zip(axes, op.s))
    if kind == "c2r":
        last = axes[-1]
    else:
        allowed = axes[:-1] if kind == "r2c" else axes
        last = _pick(allowed, key=lambda a: (numblocks[a], -axes.index(a)))
    first = tuple(a for a in axes if a != last)
    after = {a: (length[a] // 2 + 1 if kind == "r2c" and a == axes[-1] else length[a]) for a in first}
    split2 = _pick(first, key=lambda a: (after[a], -axes.index(a)))
    f1, f2 = _two_pass_functions(op)
    return (
        [Pass(f1, first, tuple(length[a] for a in first), last), Pass(f2, (last,), (length[last],), split2)],
        f"no batch axis long enough to split along: two passes (axes {list(first)}, then axis {last})",
    )


def _two_pass_functions(op: FFTOp) -> tuple[str, str]:
    if op.kind == "c2c":
        return (op.function, op.function)
    if op.kind == "r2c":
        return ("rfftn", "fftn")
    return ("ifftn", "irfftn")


def pass_chunks(chunks: tuple[tuple[int, ...], ...], p: Pass, parts: int) -> tuple[tuple[int, ...], ...]:
    """The chunks a pass needs of an array chunked ``chunks``: its axes whole; its split axis
    kept where it is split already and nothing else must change, else in ``parts`` slabs."""
    whole = [(sum(c),) for c in chunks]
    out = [whole[a] if a in p.axes else c for a, c in enumerate(chunks)]
    if p.split is not None:
        merge_only = all(len(chunks[a]) == 1 for a in p.axes)
        if not (merge_only and len(chunks[p.split]) > 1):
            out[p.split] = slab_sizes(sum(chunks[p.split]), parts)
    return tuple(out)


def transformed_chunks(chunks, p: Pass) -> tuple[tuple[int, ...], ...]:
    """The chunks after pass ``p`` on ``chunks``: its axes at their new lengths (for an
    ``rfftn`` pass the last of them ``n // 2 + 1``)."""
    out = list(chunks)
    for a, n in zip(p.axes, p.s):
        out[a] = (n,)
    if p.function == "rfftn":
        out[p.axes[-1]] = (p.s[-1] // 2 + 1,)
    return tuple(out)
