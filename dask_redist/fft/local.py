"""The path that runs everywhere: collective rechunks and local FFTs (`dask_redist.fft.plan.passes`).

Each pass rechunks the array so that the axes it transforms are whole in every chunk (through
the collective, `dask_redist.rechunk`, where it is eligible; else Dask's rechunk, and the
reason is recorded), then transforms every chunk with ``numpy.fft`` or ``cupy.fft``,
whichever fits the chunk. Padding and cropping (``s``) happen inside the local transforms,
where the axes are whole. This is what users write by hand (rechunk, ``map_blocks(fftn)``,
rechunk, ``map_blocks(fft)``), built for them.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
from dask.base import tokenize

from dask_redist.compat import default_client, is_expression
from dask_redist.errors import NotEligibleError
from dask_redist.fft.plan import FFTOp, Pass, pass_chunks, passes, transformed_chunks

#: The key under which an FFT's last layer records what ran and why (read by ``explain``).
ANNOTATION = "redist-fft"


def local_fft(block, function: str, s, axes, norm):
    """One chunk's transform with numpy.fft or cupy.fft, whichever fits the chunk."""
    if type(block).__module__.startswith("cupy"):
        import cupy as xp
    else:
        xp = np
    return getattr(xp.fft, function)(block, s=s, axes=axes, norm=norm)


def result_dtype(function: str, dtype) -> np.dtype:
    """The dtype ``numpy.fft.<function>`` gives for ``dtype`` (NumPy 2 keeps single precision)."""
    return getattr(np.fft, function)(np.zeros(2, dtype=dtype), axes=(0,)).dtype


def enabled() -> bool:
    """Is ``dask_redist.enable()`` on (the rewrite installed as dask's ``array_optimize``)?"""
    import dask

    from dask_redist.graph.optimize import CollectiveOptimizer

    return isinstance(dask.config.get("array_optimize", None), CollectiveOptimizer)


def rechunk(x, chunks) -> tuple[object, str]:
    """``x`` rechunked to ``chunks``, and how: as one collective step where it can be (a distributed
    Client is current and the rechunk is eligible; computed on another scheduler, Dask's rechunk:
    `graph.anywhere`), else Dask's rechunk, with the reason. Under
    ``enable()`` a plain rechunk, which the hook rewrites with everything it knows at submission
    (input tasks run by the stage tasks where nothing else needs them)."""
    chunks = tuple(tuple(int(n) for n in c) for c in chunks)
    if tuple(map(tuple, x.chunks)) == chunks:
        return x, "no rechunk needed"
    if enabled():  # the hook rewrites it when the graph is submitted, inlining what it can
        return x.rechunk(chunks), "rechunk under enable(): collective where eligible (its own entry says)"
    if default_client() is None:
        return x.rechunk(chunks), "Dask's rechunk (no distributed Client: the collective needs one)"
    if is_expression(x):  # (dask_redist.rechunk refuses it; dask's p2p there raises NotImplementedError)
        why = "Dask's tasks rechunk (dask's expression mode: the collective runs under enable() there)"
        return x.rechunk(chunks, method="tasks"), why
    from dask_redist.api import collective_rechunk
    from dask_redist.graph.anywhere import collective_or_dask

    try:  # (as the cost model says: explicit=False)
        y = collective_rechunk(x, chunks, None, None, False, {}, explicit=False)
    except NotEligibleError as e:
        return x.rechunk(chunks), f"Dask's rechunk ({e})"
    # (a graph built while a Client is the default may be computed elsewhere: Dask's rechunk there)
    return collective_or_dask(y, partial(_dask_rechunk, x, chunks)), "collective rechunk"


def _dask_rechunk(x, chunks):
    from dask_redist.compat import original_rechunk

    return original_rechunk(x, chunks, method="tasks")


def apply_pass(x, p: Pass, norm):
    """Transform every chunk of ``x`` (whose ``p.axes`` are whole) over ``p.axes``."""
    chunks = transformed_chunks(x.chunks, p)
    dtype = result_dtype(p.function, x.dtype)
    name = f"redist-fft-{p.function}-" + tokenize(x.name, p, norm)
    meta = (x._meta.real if dtype.kind == "f" else x._meta).astype(dtype)  # (numpy or cupy, as x's chunks)
    return x.map_blocks(
        local_fft,
        function=p.function,
        s=p.s,
        axes=p.axes,
        norm=norm,
        chunks=chunks,
        dtype=dtype,
        meta=meta,
        name=name,
    )


def build(x, op: FFTOp, chunks=None, why: str = "") -> tuple[object, dict]:
    """``op`` on the dask array ``x`` by passes; the result (rechunked to ``chunks`` if given)
    and what ran, for ``explain``."""
    steps, how = passes(op, x.numblocks)
    parts = max(1, math.prod(x.numblocks))
    record = {"op": op.describe(), "path": "local", "why": why, "passes": how, "steps": []}
    for p in steps:
        target = pass_chunks(x.chunks, p, parts)
        x, moved = rechunk(x, target)
        x = apply_pass(x, p, op.norm)
        split = "" if p.split is None else f", split along axis {p.split}"
        record["steps"].append(f"{moved}; {p.function} over axes {list(p.axes)}{split}")
    annotate(x, record)
    if chunks is not None:
        x, moved = rechunk(x, chunks)
        record["steps"].append(f"to the chunks asked for: {moved}")
    return x, record


def annotate(x, record: dict) -> None:
    """Record what ran on ``x``'s layer (a dict: later steps appended to it show too); not in
    expression mode, whose arrays have no layers (and ``explain`` lists no FFT there)."""
    if is_expression(x):
        return
    layer = x.dask.layers[x.name]
    layer.collection_annotations = {**(layer.collection_annotations or {}), ANNOTATION: record}
