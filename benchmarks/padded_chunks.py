"""Would an output chunk with a padded last axis make its fused consumer faster?

    python benchmarks/padded_chunks.py [REPS]

After the `fft` pipeline's rechunk (256 MiB complex128 cube, 16 chunks) an output chunk is
(256, 16, 256), C order: along axis 0 its elements lie 64 KiB apart, a power of two, so a
transform along that axis reads them through the same few cache sets. A chunk built as a view
of a (256, 16, 256 + pad) array spreads them; so does one whose axes lie in memory in the
senders' order, (16, 256, 256), axis 1 outermost ("senders'"), where the unpack copies each
sender's piece as runs of its last axis. This times, for NumPy, the fastest of REPS
(default 15) of what the pipelines' consumers do (a transform along axis 0, squaring, a mean
over axis 0; the transform again with its output copied into C order, since NumPy's transform
and ufuncs keep their input's order), whether each output is C-ordered on the senders' chunk,
and the unpack's copy of the senders' pieces into the chunk, on the C-ordered chunk, on padded views and in the senders' order, in ms, beside the transform along
axis 1 of a slab before the rechunk (the `fft` pipeline's ``without``).
"""

from __future__ import annotations

import sys

import numpy as np

from fft_consumer_work import fastest  # (this folder: run as a script)

from dask_redist.bench.cases import slab_case

CONSUMERS = {
    "fft along axis 0": lambda b: np.fft.fft(b, axis=0),
    # (the user's output C-ordered again, where the consumer kept its input's order)
    "fft along axis 0, then C order": lambda b: np.ascontiguousarray(np.fft.fft(b, axis=0)),
    "b ** 2": lambda b: b**2,
    "mean over axis 0": lambda b: b.mean(axis=0),
}


def _no_sync() -> None:  # (NumPy: nothing queued)
    pass


def padded(shape, dtype, pad: int):
    """A C-ordered array of ``shape`` (``pad`` 0), or a view of one whose last axis is ``pad`` longer."""
    whole = np.ones((*shape[:-1], shape[-1] + pad), dtype=dtype)
    return whole[..., : shape[-1]]


def senders_order(shape, dtype):
    """An array of ``shape`` whose axes 1 and 0 are swapped in memory: axis 1 outermost."""
    return np.ones((shape[1], shape[0], *shape[2:]), dtype=dtype).swapaxes(0, 1)


def assembling(chunk, pieces):
    """The unpack's copy: each sender's piece into its rows of axis 0 of ``chunk``."""

    def run(_) -> None:
        rows = pieces[0].shape[0]
        for i, piece in enumerate(pieces):
            chunk[i * rows : (i + 1) * rows] = piece

    return run


def main(reps: int = 15) -> None:
    for nchunks in (16, 64):
        case = slab_case("256MiB", nchunks, "complex128")
        n0, n1, n2 = case.shape
        after = (n0, case.new[1][0], n2)
        for dtype in (np.complex128, np.float64):
            slab = np.ones((case.old[0][0], n1, n2), dtype=dtype)
            print(f"\n{nchunks} chunks, a chunk {after} {np.dtype(dtype).name}")
            along_1 = fastest(lambda b: np.fft.fft(b, axis=1), slab, reps, _no_sync)
            print(f"fft along axis 1 of a slab {slab.shape}: {along_1:.2f}")
            print("consumer | C order | pad 1 | pad 4 | pad 8 | senders'")
            chunks = [padded(after, dtype, pad) for pad in (0, 1, 4, 8)]
            chunks.append(senders_order(after, dtype))
            for name, f in CONSUMERS.items():
                times = [fastest(f, chunk, reps, _no_sync) for chunk in chunks]
                kept = "" if f(chunks[-1]).flags.c_contiguous else " (senders': not C-ordered)"
                print(f"{name} | " + " | ".join(f"{t:.2f}" for t in times) + kept)
            pieces = [np.ones((case.old[0][0], *after[1:]), dtype=dtype)] * (n0 // case.old[0][0])
            times = [fastest(assembling(chunk, pieces), None, reps, _no_sync) for chunk in chunks]
            print("the unpack's copy | " + " | ".join(f"{t:.2f}" for t in times))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
