"""NumPy chunks through the GPUs: host -> GPU -> NVLink -> GPU -> host, a round at a time.

nvmath-python's ``Redistribute`` takes host operands by copying them whole to the GPU
and back. Here a rank's NumPy chunks stay where Dask keeps them: each round uploads only
the parts of them that the round's input box needs, and the parts of its output box come
back into NumPy output chunks. GPU memory is the arena plus one round's parts, whatever
the size of the array, so ``redist.memory-budget`` bounds it as it does for CuPy chunks.

How the bytes cross (`HostLink`): a round's parts are packed by a few threads into one
pinned buffer, which one asynchronous copy moves to the GPU; coming back, one copy moves
the round's output parts into a pinned buffer and threads scatter them into the chunks.
Pinned copies run several times faster than pageable ones, and host copies on several
threads several times faster than on one (docs/benchmarks.md, "NumPy chunks through one
GPU"). Pinned copies are asynchronous, so
the engine's thread never blocks behind a reshape waiting for a dead peer; it waits for a
download with its usual event poll (``CufftMpEngine._wait``). A round's host copies still
do not overlap the exchange of the previous round.

Only dtypes CuPy holds (booleans, integers, floats, complex) go this way; the scheduler
refuses others with a clear error before the run starts (`host_dtype_problem`).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dask_redist.core.assemble import parts_in
from dask_redist.planning.boxes import Box

#: Bytes one thread copies at a time; smaller copies are not worth a hand-off.
SLICE_BYTES = 8 << 20
#: Parts start at multiples of this in the staging buffers (what CUDA allocations give).
ALIGN = 256


def host_dtype_problem(dtype) -> str | None:
    """Why NumPy chunks of ``dtype`` cannot go through the GPUs, or None."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biufc":
        return None
    return (
        f"redist.engine=cufftmp moves NumPy chunks of booleans, integers, floats and complex "
        f"numbers through the GPUs, not {dtype}; use redist.engine=auto or dask for this array"
    )


def _offsets(arrays) -> tuple[list[int], int]:
    offsets, end = [], 0
    for a in arrays:
        offsets.append(end)
        end += -(-a.nbytes // ALIGN) * ALIGN
    return offsets, end


class HostLink:
    """Pinned staging buffers and copy threads of one engine, reused across rounds and runs.

    A buffer is reused only after the GPU is done with it: the engine waits for a round
    before the next one stages (uploads), and a download is finished before the next starts.
    """

    def __init__(self, threads: int | None = None):
        self.threads = threads or min(8, os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._pinned: dict[str, np.ndarray] = {}  # "up" / "down" -> pinned uint8 buffer

    def upload(self, views: list[np.ndarray]) -> list:
        """Device arrays holding ``views``' values, queued on the current stream."""
        import cupy

        offsets, total = _offsets(views)
        pinned = self.pinned("up", total)
        staged = [_as(pinned, o, v.shape, v.dtype) for o, v in zip(offsets, views)]
        self._copy(list(zip(staged, views)))
        device = cupy.empty(max(total, 1), dtype=np.uint8)
        _memcpy(device.data.ptr, pinned.ctypes.data, total, 1)  # cudaMemcpyHostToDevice
        return [_as(device, o, v.shape, v.dtype) for o, v in zip(offsets, views)]

    def downloads(self, targets: list[np.ndarray]) -> Downloads:
        """Device arrays for ``targets`` (host views) to be filled on the GPU, then downloaded."""
        return Downloads(self, targets)

    def pinned(self, which: str, nbytes: int) -> np.ndarray:
        """The pinned buffer ``which`` ("up" or "down") of at least ``nbytes``, grown if needed."""
        import cupyx

        buf = self._pinned.get(which)
        if buf is None or buf.nbytes < nbytes:  # grow (pinning is slow: not per round)
            size = max(nbytes, 2 * (0 if buf is None else buf.nbytes))
            if buf is not None:  # CuPy's pinned pool would keep the smaller one: every size grown through
                del self._pinned[which], buf
                _release_pinned()
            self._pinned[which] = buf = cupyx.empty_pinned(size, np.uint8)
        return buf

    def _copy(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """``dst[...] = src`` for every pair, on the copy threads in slices of about `SLICE_BYTES`."""
        slices = [s for dst, src in pairs for s in _slices(dst, src)]
        if sum(dst.nbytes for dst, _ in pairs) < 2 * SLICE_BYTES or self.threads == 1:
            for dst, src in slices:
                np.copyto(dst, src)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="redist-host-copy")
        for _ in self._pool.map(lambda p: np.copyto(*p), slices):  # NumPy copies release the GIL
            pass


class Downloads:
    """One round's output parts: filled on the GPU (``device``), then `start` queues one copy to
    pinned memory and, once the stream has passed it, `finish` scatters them into the chunks."""

    def __init__(self, link: HostLink, targets: list[np.ndarray]):
        import cupy

        self.link, self.targets = link, targets
        self.offsets, self.total = _offsets(targets)
        self._device = cupy.empty(max(self.total, 1), dtype=np.uint8)
        self.device = [_as(self._device, o, t.shape, t.dtype) for o, t in zip(self.offsets, targets)]

    def start(self) -> None:
        self._pinned = self.link.pinned("down", self.total)
        _memcpy(self._pinned.ctypes.data, self._device.data.ptr, self.total, 2)  # cudaMemcpyDeviceToHost

    def finish(self) -> None:
        staged = [_as(self._pinned, o, t.shape, t.dtype) for o, t in zip(self.offsets, self.targets)]
        self.link._copy(list(zip(self.targets, staged)))


class HostParts:
    """The parts of host chunks inside one box of one round, and their device arrays.

    ``upload``: the device arrays hold the input chunks' parts (a stage reads them);
    otherwise they are filled by an unstage and `downloads` brings them into the chunks.
    """

    def __init__(self, link: HostLink, arrays: dict, box_of, box: Box, upload: bool):
        self.host: dict[int, np.ndarray] = {}
        self._bounds: dict[int, tuple] = {}
        for flat, part, view in parts_in(arrays, box_of, box):
            self.host[flat] = view
            self._bounds[flat] = (part.lower, part.upper)
        views = list(self.host.values())
        self.downloads = None if upload else link.downloads(views)
        device = link.upload(views) if upload else self.downloads.device
        self.device = dict(zip(self.host, device))

    def box_of(self, flat: int) -> tuple:
        """Global bounds of the part of chunk ``flat`` (as ``RechunkSpec.old_box`` gives a chunk's)."""
        return self._bounds[flat]


def _release_pinned() -> None:
    """Hand CuPy's cached, unused pinned host blocks back to the system (those in use stay)."""
    import cupy

    cupy.get_default_pinned_memory_pool().free_all_blocks()


def _as(buffer, offset: int, shape, dtype):
    """A C-contiguous array of ``shape`` and ``dtype`` at byte ``offset`` of a uint8 ``buffer``."""
    n = math.prod(shape) * np.dtype(dtype).itemsize
    return buffer[offset : offset + n].view(dtype).reshape(shape)


def _slices(dst: np.ndarray, src: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(dst, src) cut along their first axis into pieces of about `SLICE_BYTES`."""
    if dst.ndim == 0 or dst.nbytes <= SLICE_BYTES:
        return [(dst, src)]
    if dst.shape[0] == 1:
        return _slices(dst[0], src[0])
    step = max(1, dst.shape[0] * SLICE_BYTES // dst.nbytes)
    return [(dst[i : i + step], src[i : i + step]) for i in range(0, dst.shape[0], step)]


def _memcpy(dst: int, src: int, nbytes: int, kind: int) -> None:
    import cupy

    if nbytes:
        cupy.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, cupy.cuda.get_current_stream().ptr)
