"""A run of PEs that share one GPU of one host: every piece copied from its input chunk straight
into its output chunk, whichever worker owns that, through CUDA IPC. (One host by ``redist.host``:
PEs of two pseudo-hosts on one GPU take the arena's rounds, as PEs of two hosts would.)

The arena's rounds make three passes over the bytes (stage, reshape, unstage) and a round per
``redist.memory-budget``. Processes on one GPU can instead map each other's memory: each rank
exports its output chunks (an IPC handle per allocation, and where in it each chunk lies), the
ranks all-gather that (through files on the machine they share, `hostfiles`, where they can; else
through the scheduler), and each rank copies its own pieces into whichever
output chunk they belong to, in one launch of the arena's copy kernel (`copies.PieceJobs`). A
second all-gather says that every rank's copies are done, and whether they all went right:
only then are the outputs finished (the peers write into them until then). A rank that could
not map its peers' chunks (processes that may not share memory) says so there, and every rank
then takes the arena's rounds, for this run and the world's later ones.

Whether a run takes this path is decided from what every rank has alike (the run's spec and
plan, and the world's ``shared_gpu``: `applies`), so all of them take it or none does; a rank
that cannot export its chunks (memory from a stream-ordered pool has no IPC handle, an input
chunk not C-contiguous) says so in the first all-gather, and then every rank takes the arena's
rounds instead. An aborted rank takes part in both all-gathers, its copies skipped; a rank that
is gone ends every wait here (`gather`). No NVSHMEM call is made, and no symmetric memory used.
"""

from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import replace

import numpy as np

from dask_redist.engines.copies import addresses
from dask_redist.engines.ipc import (  # noqa: F401 - (the peers' path, as its tests name it)
    CudaIpc,
    Exported,
    Failed,
    PAGE,
    Mapped,
    Refused,
    Steps,
    export,
    gather,
    map_outputs,
    opened_since,
)
from dask_redist.engines.registry import engine_settings
from dask_redist.errors import RedistError

#: What a run on this path reports as its layout (`CufftMpEngine._record`).
LAYOUT = namedtuple("Peers", "mapping rounds")("peers (one GPU: chunk to chunk through CUDA IPC)", 1)


def applies(run, shared_gpu: bool, max_pieces: int) -> bool:
    """Whether ``run`` takes this path (the same answer on every rank: nothing here is the rank's
    own): CuPy chunks of at most 3 axes on a world of several PEs on one GPU, at most
    ``max_pieces`` pieces, ``redist.nvshmem.shared-gpu-copies`` on and at most
    ``redist.nvshmem.shared-gpu-max-chunks`` output chunks per rank."""
    spec, plan = run.spec, run.plan
    settings = engine_settings(spec.engine, spec.collective.settings)
    if not (shared_gpu and settings.shared_gpu_copies):
        return False
    if spec.chunk_type != "cupy" or len(spec.workers) < 2 or spec.collective.rechunk.ndim > 3:
        return False
    if plan.piece_count > max_pieces:
        return False
    owned = np.bincount(plan.out_ranks.ravel()[plan.needed.ravel()], minlength=plan.nranks)
    return int(owned.max(initial=0)) <= settings.shared_gpu_max_chunks


def refusal(run, everyone: list) -> Refused | None:
    """Why the run cannot take this path (a rank cannot export its chunks), or None where every
    rank exported; raises where a rank was aborted. From what every rank sent alone, so that all
    of them decide alike (a rank aborted since it sent its chunks goes on to the second
    all-gather, its copies skipped: the peers wait for it there)."""
    refused = [(r, p) for r, p in enumerate(everyone) if isinstance(p, Refused)]
    refused.sort(key=lambda rp: not rp[1].aborted)
    if not refused:
        return None
    rank, why = refused[0]
    if why.aborted:
        raise (
            run.failure()
            if run.state == "failed"
            else RedistError(f"{run.name()}: rank {rank} ({run.spec.workers[rank]}) was aborted")
        )
    return Refused(f"rank {rank} ({run.spec.workers[rank]}): {why.why}", lasting=why.lasting)


def run_peers(
    run, outputs: dict, prepare, group, copy, done, steps: dict | None = None
) -> Refused | Failed | None:
    """This rank's part of ``run`` on this path: its output chunks (allocated, nothing queued on
    them) exported, its pieces copied by ``copy(run, jobs)`` into whichever output chunk they
    belong to, and every rank's copies agreed done; then ``done()`` (``outputs`` are complete),
    and the peers' chunks unmapped. None once done; where every rank must take the arena's rounds
    instead, why: a `Refused` (nothing written) or a `Failed` (chunks could not be mapped: none
    will be, in this world). Raises an abort's error, or a rank's failure, on every rank.

    ``prepare()``: the job table of this rank's pieces (a `copies.PieceJobs`) and the IPC to use
    (a `CudaIpc`); ``group``: the world's all-gather. Every rank makes both all-gathers whatever
    goes wrong here (what does is told to the others in them), unless a rank is gone. ``steps``:
    filled with the milliseconds each step took (for the engine's stats)."""
    rechunk = run.spec.collective.rechunk
    inputs = dict(run.inputs)  # (held until the copies are done: an abort empties run.inputs)
    steps = Steps({} if steps is None else steps)
    table = ipc = None
    if run.state == "failed":
        mine = Refused("the run was aborted", aborted=True)
    else:
        try:
            table, ipc = prepare()
            contiguous = all(a.flags.c_contiguous for a in inputs.values())
            mine = export(outputs, ipc) if contiguous else Refused("an input chunk is not C-contiguous")
        except Exception as e:  # noqa: BLE001 - told to every rank: the arena's rounds then
            mine = Refused(f"{type(e).__name__}: {e}", lasting=True)
        if isinstance(mine, Refused) and getattr(run, "into", None):
            # outputs given by an FFT's leg (its operand, on the symmetric heap, which has no CUDA
            # IPC handle): this run's own, not the chunks of this world's later runs
            mine = replace(mine, lasting=False)
    steps("export")
    everyone = gather(run, group, mine)
    steps("all-gather chunks")
    if (refused := refusal(run, everyone)) is not None:
        return refused
    mapped, status = None, None
    try:
        if run.state != "failed":  # (aborted since: the peers still wait below)
            mapped = map_outputs(
                everyone, run.rank, outputs, np.unique(table.new_block), math.prod(rechunk.new_grid), ipc
            )
    except Exception as e:  # noqa: BLE001 - told to every rank below: the arena's rounds then
        status = Failed(f"{type(e).__name__}: {e}", unmapped=True)
    steps("map")
    try:
        try:
            if mapped is not None and run.state != "failed":
                copy(run, table.at(addresses(inputs, math.prod(rechunk.old_grid)), mapped.addresses))
        except Exception as e:  # noqa: BLE001 - told to every rank below, which all raise
            status = Failed(f"{type(e).__name__}: {e}")
        steps("copy")
        result = outcome(run, gather(run, group, status))
        steps("all-gather done")
        if isinstance(result, BaseException):
            raise result
        if result is None:
            done()
        return result
    finally:
        if mapped is not None:
            mapped.close()
        steps("unmap")


def outcome(run, statuses: list) -> BaseException | Failed | None:
    """What the ranks' statuses (None each, or a `Failed`) come to: the error to raise (a rank's
    failure), or a `Failed` where a rank could not map its peers' chunks (every rank then takes
    the arena's rounds), decided alike by every rank; then this rank's abort, or None: every
    rank's copies are done."""
    bad = sorted(((r, s) for r, s in enumerate(statuses) if s is not None), key=lambda rs: rs[1].unmapped)
    if bad and not bad[0][1].unmapped:
        rank, status = bad[0]
        return RedistError(
            f"{run.name()}: rank {rank} ({run.spec.workers[rank]}) failed in phase 'exchange' copying "
            f"chunk to chunk: {status.why} (redist.nvshmem.shared-gpu-copies: false takes the "
            "symmetric heap's rounds instead)"
        )
    if bad:
        rank, status = bad[0]
        return Failed(
            f"rank {rank} ({run.spec.workers[rank]}) could not map its peers' chunks: {status.why}", True
        )
    return run.failure() if run.state == "failed" else None
