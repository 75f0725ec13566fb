"""When Dask's own rechunk is faster: the measured model behind ``redist.min-bytes: auto``.

The collective pays a fixed cost Dask's ``tasks`` rechunk does not: a barrier task, a
round trip to the scheduler to plan and start the run, a message to every worker. Dask's
rechunk pays per piece (old chunk x new chunk intersection): a task, its scheduling and
often a transfer each. So what decides is the number of pieces, not the bytes.

Measured (docs/benchmarks.md, "Small rechunks", with the command and the machine): at
4 pieces (2 -> 2 slabs) Dask's ``tasks`` rechunk was faster at every size from 64 KiB to
1 GiB; from 9 pieces (3 -> 3 slabs) on the collective was, by more as pieces grow.
So ``auto`` keeps Dask's rechunk for NumPy chunks when a rechunk has at most
`AUTO_MAX_PIECES` pieces, at any size. CuPy chunks are not measured small: Dask's
comms move them through host memory over TCP, the collective over NVLink, so ``auto``
keeps the collective for them.
"""

from __future__ import annotations

import math

import dask
from dask.utils import format_bytes

from dask_redist.planning.geometry import RechunkSpec, axis_segments

#: Most pieces for which Dask's rechunk of NumPy chunks was measured faster (module docstring).
AUTO_MAX_PIECES = 4


def piece_count(spec: RechunkSpec) -> int:
    """Old chunk x new chunk intersections (pieces) of a rechunk: a product over the axes."""
    return math.prod(len(axis_segments(o, n)) for o, n in zip(spec.old, spec.new))


def dask_is_faster(spec: RechunkSpec, chunk_type: str) -> str | None:
    """Why Dask's own rechunk is expected to be faster for this rechunk (``redist.min-bytes:
    auto``), or None when the collective is."""
    if chunk_type != "numpy":
        return None
    pieces = piece_count(spec)
    if pieces > AUTO_MAX_PIECES:
        return None
    return (
        f"{pieces} pieces: Dask's rechunk is faster up to {AUTO_MAX_PIECES} pieces (redist.min-bytes: auto; "
        "set redist.min-bytes to a size, e.g. 0, to decide by bytes instead)"
    )


def pause_fraction() -> float:
    """The share of a worker's memory limit at which distributed pauses it (its default where unset)."""
    return dask.config.get("distributed.worker.memory.pause") or 0.8


def beyond_memory(nbytes: int, limits: list[int], fraction: float) -> str | None:
    """Why a NumPy rechunk of ``nbytes`` cannot run as a collective on workers with memory
    ``limits`` (bytes; 0: no limit), or None.

    A run holds its inputs and its outputs in worker memory at once and cannot spill them;
    Dask's rechunks can. Where the two together pass ``fraction`` of the workers' memory
    (distributed's pause threshold), the workers would pause before the barrier runs (and
    nothing would time out) or their nannies would restart them: Dask's rechunk is kept.
    A run that fits in all but is uneven is refused at its barrier instead, naming the worker
    (`dask_redist.runtime.rechunks.over_memory`).
    """
    if not limits or not all(limits):
        return None
    room = fraction * sum(limits)
    if 2 * nbytes <= room:
        return None
    return (
        f"its input and output ({format_bytes(2 * nbytes)}) are more than the workers can hold at once "
        f"({fraction:.0%} of their memory, {format_bytes(int(room))}) and the collective cannot spill: "
        "Dask's rechunk, which can, is kept (add workers or memory)"
    )
