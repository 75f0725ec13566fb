"""When Dask's own rechunk is faster: the measured model behind ``redist.min-bytes: auto``.

The collective pays a fixed cost Dask's ``tasks`` rechunk does not: a barrier task, a
round trip to the scheduler to plan and start the run, a message to every worker. Dask's
rechunk pays per piece (old chunk x new chunk intersection): a task, its scheduling and
often a transfer each. So what decides is the number of pieces, not the bytes.

Measured on the CPU machine (2 cores, 2 workers, NumPy, 2026-12-01,
``dask-redist bench --workers 2 --size 64KiB 1MiB 8MiB 32MiB 256MiB 1GiB --chunks 2 ... 64
--methods redist-dask tasks``, medians of 3-7; docs/benchmarks.md "Small rechunks"):

====================  ==================  =====================
slab -> slab           pieces             collective vs ``tasks``
====================  ==================  =====================
2 -> 2 chunks          4                  27 vs 19 ms (64 KiB), 45 vs 35 ms (32 MiB),
                                          394 vs 346 ms (1 GiB): ``tasks`` wins at every size
3 -> 3                 9                  26 vs 27 ms, 37 vs 41 ms (8 MiB): about even
4 -> 4 and more        16 and more        the collective wins (e.g. 64 -> 64: 36 vs 73 ms)
====================  ==================  =====================

So ``auto`` keeps Dask's rechunk for NumPy chunks when a rechunk has at most
`AUTO_MAX_PIECES` pieces, at any size. CuPy chunks are not measured small: Dask's
comms move them through host memory over TCP, the collective over NVLink, so ``auto``
keeps the collective for them.
"""

from __future__ import annotations

import math

from dask_redist.planning.geometry import RechunkSpec, axis_segments

#: Most pieces for which Dask's rechunk of NumPy chunks was measured faster (module docstring).
AUTO_MAX_PIECES = 4


def piece_count(spec: RechunkSpec) -> int:
    """Old chunk x new chunk intersections (pieces) of a rechunk: a product over the axes."""
    return math.prod(len(axis_segments(o, n)) for o, n in zip(spec.old, spec.new))


def dask_is_faster(spec: RechunkSpec, kind: str) -> str | None:
    """Why Dask's own rechunk is expected to be faster for this rechunk (``redist.min-bytes:
    auto``), or None when the collective is."""
    if kind != "numpy":
        return None
    pieces = piece_count(spec)
    if pieces > AUTO_MAX_PIECES:
        return None
    return (
        f"{pieces} pieces: Dask's rechunk is faster up to {AUTO_MAX_PIECES} pieces (redist.min-bytes: auto; "
        "set redist.min-bytes to a size, e.g. 0, to decide by bytes instead)"
    )
