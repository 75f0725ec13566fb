"""Byte-level stand-ins for the GPU's chunk copies: a job table replayed on one byte buffer,
chunks kept in it, and random rechunks to try them on."""

from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

import numpy as np
from hypothesis import strategies as st


def copy_rows(n0, n1, nbytes, s0, s1, d0, d1, src_memory, src_at, dst_memory, dst_at) -> None:
    """The kernel's work for one job (rows of ``nbytes`` over two outer axes), on bytes."""
    for i0 in range(n0):
        for i1 in range(n1):
            s, d = src_at + i0 * s0 + i1 * s1, dst_at + i0 * d0 + i1 * d1
            dst_memory[d : d + nbytes] = src_memory[s : s + nbytes]


def replay_at_addresses(jobs) -> None:
    """The kernel's jobs replayed on the process's own memory, at the addresses the jobs name."""
    for src, dst, n0, n1, nbytes, s0, s1, d0, d1 in jobs.tolist():
        for i0 in range(n0):
            for i1 in range(n1):
                ctypes.memmove(dst + i0 * d0 + i1 * d1, src + i0 * s0 + i1 * s1, nbytes)


class Group:
    """The ranks' all-gather among threads (every rank answers: nothing to stop for)."""

    def __init__(self, nranks: int):
        self._barrier = threading.Barrier(nranks, timeout=30)
        self._slots: dict = {}
        self.calls = [0] * nranks

    def for_rank(self, rank: int):
        group, rank_ = self, rank

        class One:
            rank, nranks = rank_, len(self.calls)

            def allgather(self, obj, stop=None):
                group.calls[rank] += 1
                key = group.calls[rank]
                group._slots.setdefault(key, {})[rank] = obj
                group._barrier.wait()
                values = [group._slots[key][r] for r in range(len(group.calls))]
                group._barrier.wait()
                return values

        return One()


def run_ranks(one, group: Group) -> None:
    """``one(rank)`` for every rank of ``group`` on threads of its own; every rank ended, after
    as many all-gathers as the others."""
    threads = [threading.Thread(target=one, args=(r,), name=f"rank-{r}") for r in range(len(group.calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank was left waiting"
    assert len(set(group.calls)) == 1, f"ranks made different numbers of all-gathers: {group.calls}"


class FakeIpc:
    """CUDA IPC's calls as an engine makes them, on addresses (``fail``: "export" or "open" fails
    as CUDA would); subclasses say where an allocation starts and where a peer's is mapped."""

    def __init__(self, fail: str = ""):
        self.fail, self.opened, self.closed = fail, [], []

    def allocation(self, ptr: int) -> int:
        return ptr

    def mapped_at(self, base: int) -> int:
        return base

    def handle(self, base: int) -> bytes:
        if self.fail == "export":
            raise RuntimeError("cudaErrorInvalidValue: invalid argument")
        return base.to_bytes(8, "little")

    def open(self, handle: bytes) -> int:
        if self.fail == "open":
            raise RuntimeError("cudaErrorMapBufferObjectFailed")
        self.opened.append(self.mapped_at(int.from_bytes(handle, "little")))
        return self.opened[-1]

    def close(self, ptr: int) -> None:
        self.closed.append(ptr)


def draw_placement(data, rechunk, nranks: int):
    """A random rank for every input chunk (on the old grid), and the output chunks needed (a
    boolean grid, some of them), or None for all."""
    n_old, n_new = int(np.prod(rechunk.old_grid)), int(np.prod(rechunk.new_grid))
    in_ranks = np.array(data.draw(st.lists(st.integers(0, nranks - 1), min_size=n_old, max_size=n_old)))
    needed = None
    if data.draw(st.booleans()):
        needed = np.zeros(n_new, bool)
        needed[data.draw(st.lists(st.integers(0, n_new - 1), min_size=1, max_size=n_new))] = True
        needed = needed.reshape(rechunk.new_grid)
    return in_ranks.reshape(rechunk.old_grid), needed


def replay_all(jobs, memory: np.ndarray) -> None:
    """Every job of a table on one byte buffer, pointers being offsets into it."""
    for src, dst, *rows in jobs.tolist():
        copy_rows(*rows, memory, src, memory, dst)


def random_rechunk(data, side: int):
    """A random 1-3-D shape of at most ``side`` per axis, a dtype, and a `RechunkSpec` between two
    random chunkings of it."""
    from dask_redist.planning import RechunkSpec

    shape = [data.draw(st.integers(1, side)) for _ in range(data.draw(st.integers(1, 3)))]

    def chunking(n):
        cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=3)))) if n > 1 else []
        return tuple(np.diff([0, *cuts, n]).tolist())

    dtype = np.dtype(data.draw(st.sampled_from([np.int8, np.float32, np.complex128])))
    return (
        shape,
        dtype,
        RechunkSpec(tuple(chunking(n) for n in shape), tuple(chunking(n) for n in shape), dtype.itemsize),
    )


class InMemory:
    """What the engine reads of a C-contiguous CuPy array, for a chunk kept at ``ptr`` in one
    byte buffer (the replayed jobs' pointers are offsets into it)."""

    def __init__(self, shape, ptr: int):
        self.shape, self.ndim = tuple(shape), len(shape)
        self.data = SimpleNamespace(ptr=ptr)
        self.flags = SimpleNamespace(c_contiguous=True)


def write_chunk(memory: np.ndarray, at: int, whole: np.ndarray, lo, hi) -> tuple[InMemory, int]:
    """The box ``[lo, hi)`` of ``whole`` written C-ordered into the buffer at ``at``: the chunk
    there, and the next free address."""
    part = np.ascontiguousarray(whole[tuple(slice(a, b) for a, b in zip(lo, hi))])
    memory[at : at + part.nbytes] = part.view(np.uint8).ravel()
    return InMemory(part.shape, at), at + part.nbytes


class Bump:
    """``xp.empty`` for the engine's output chunks: one after another in the buffer from ``at``."""

    def __init__(self, at: int):
        self.at = at

    def empty(self, shape, dtype) -> InMemory:
        out = InMemory(shape, self.at)
        self.at += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return out
