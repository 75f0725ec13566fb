"""Whether a collective fits in the workers' memory: it holds its inputs and outputs at once and cannot spill.

Asked twice, of the same rule: on the client, of the whole rechunk against the workers' total
(`beyond_memory`: Dask's rechunk is kept), and at the barrier, of each rank of the planned run
(`over_memory`: the run fails naming the worker). The threshold is distributed's pause fraction
(`pause_fraction`). And on each worker as it stages, of the memory it actually uses
(`staging_beyond_pause`): a worker paused by staged chunks, which Dask cannot spill, stays paused
before the barrier, where nothing times out.
"""

from __future__ import annotations

import dask
import numpy as np
from dask.utils import format_bytes

from dask_redist.planning.geometry import chunk_nbytes
from dask_redist.planning.plan import Plan


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
    (`over_memory`).
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


def over_memory(plan: Plan, ranks: list[str], limits: list[int], fraction: float) -> str | None:
    """Why the run cannot fit: the first rank (of ``ranks``, worker addresses) whose inputs and
    outputs at once exceed ``fraction`` of its memory limit (``limits``, bytes per rank; 0: no
    limit, fits), or None. A run holds both and cannot spill them; rather than have the nanny
    kill the worker, the run fails with the numbers, at its barrier."""
    in_bytes = np.bincount(
        plan.in_ranks.ravel(),
        weights=chunk_nbytes(plan.spec.old, plan.spec.itemsize).ravel(),
        minlength=plan.nranks,
    )
    for rank, limit in enumerate(limits):
        need = int(in_bytes[rank] + plan.out_bytes[rank])
        if limit and need > fraction * limit:
            return (
                f"the rechunk needs {format_bytes(need)} at once on worker {ranks[rank]}, over {fraction:.0%} of its "
                f"memory limit ({format_bytes(limit)}); the collective cannot spill to disk. Use more workers "
                "or more memory per worker, or keep dask's rechunk for this array (redist.min-bytes, "
                "dask_redist.disable())"
            )
    return None


def staging_beyond_pause(process: int, managed: int, staged: int, limit: int | None, fraction) -> str | None:
    """Why a worker that stages more would pause for good, or None: its memory that Dask cannot
    spill (``process`` less ``managed``, bytes: what Dask could free by spilling) is over ``fraction`` (distributed's pause fraction;
    False: never pauses) of its memory ``limit``, and the chunks staged on it (``staged``), which Dask
    cannot spill either, are what puts it there. Paused, it would not run the stage tasks left, so
    the barrier would never run."""
    if not limit or not fraction:
        return None
    unspillable = process - managed
    over = unspillable - fraction * limit
    if over <= 0 or staged < over:
        return None
    return (
        f"its staged input chunks ({format_bytes(staged)}) put the memory Dask cannot spill on this worker "
        f"({format_bytes(unspillable)}) over {fraction:.0%} of its memory limit ({format_bytes(limit)}, "
        "distributed.worker.memory.pause): it would pause before the barrier, for good, since the "
        "collective cannot spill its staged chunks. Use more workers or more memory per worker, or "
        "keep dask's rechunk for this array (redist.min-bytes, dask_redist.disable())"
    )
