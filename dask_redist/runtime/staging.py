"""The chunks stage tasks keep on a worker until a run takes them.

A staged chunk lives exactly as long as its stage key is in memory on the
scheduler, which sends ``redist-drop`` when the key is released: a restarted run
finds every marker it is given backed by data, and memory is released as soon as
dask would release it. A run takes its own references when it starts.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from dask_redist.compat import spill_buffer_in_memory


class StagingStore:
    """Staged chunks by (token, flat chunk index), and which stage key staged them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._chunks: dict[tuple[str, int], Any] = {}
        self._by_key: dict[tuple[str, tuple], list[int]] = {}  # (token, stage key tail) -> chunk indices
        self.nbytes = 0  # of every chunk staged here in host memory (NumPy's; not CuPy's)

    def put(self, token: str, tail: tuple, chunks: dict[int, Any]) -> None:
        with self._lock:
            for index, chunk in chunks.items():
                self._forget((token, index))
                self._chunks[(token, index)] = chunk
                self.nbytes += _host_bytes(chunk)
            self._by_key[(token, tuple(tail))] = list(chunks)

    def get(self, token: str, indices) -> dict[int, Any]:
        """The staged chunks among ``indices`` (missing ones are left out)."""
        with self._lock:
            found = {int(i): self._chunks.get((token, int(i))) for i in indices}
        return {i: c for i, c in found.items() if c is not None}

    def drop(self, token: str, tail: tuple) -> None:
        """The scheduler released a stage key: forget the chunks it staged."""
        with self._lock:
            self._drop((token, tuple(tail)))

    def drop_token(self, token: str) -> None:
        """Forget every chunk staged for rechunk ``token``."""
        with self._lock:
            for key in [k for k in self._by_key if k[0] == token]:
                self._drop(key)

    def _drop(self, key: tuple) -> None:
        """Forget the chunks staged under stage key ``key`` = (token, tail); under the lock."""
        for index in self._by_key.pop(key, ()):
            self._forget((key[0], index))

    def _forget(self, key: tuple) -> None:
        """Forget staged chunk ``key`` = (token, index), if held; under the lock."""
        if (chunk := self._chunks.pop(key, None)) is not None:
            self.nbytes -= _host_bytes(chunk)

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._by_key.clear()
            self.nbytes = 0

    def held_ids(self) -> set[int]:
        """The ids of the staged chunks and of the arrays they are views of."""
        with self._lock:
            chunks = list(self._chunks.values())
        ids = set()
        for chunk in chunks:
            while chunk is not None and id(chunk) not in ids:
                ids.add(id(chunk))
                chunk = getattr(chunk, "base", None)
        return ids

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"staged chunks": len(self._chunks), "stage keys": len(self._by_key)}


def _host_bytes(chunk) -> int:
    """The bytes of ``chunk`` in host memory: a NumPy chunk's, none of a CuPy chunk's."""
    return int(chunk.nbytes) if isinstance(chunk, np.ndarray) else 0


def spillable_bytes(data, staging: StagingStore, managed: int) -> int:
    """The bytes a worker's memory manager could free by spilling: Dask's data in RAM (the fast
    part of distributed's `SpillBuffer`, weighed as it weighs it), less the values also staged here
    (spilling a chunk the collective holds frees nothing); ``managed`` (the worker's ``nbytes``)
    where ``data`` is no SpillBuffer. Dask's ``nbytes`` counts what it has spilled to disk too: a
    worker whose inputs were spilled, then read back by the stage tasks, looked as if it could free
    them all, and paused for good holding its staged chunks, its last stage task never run."""
    in_memory = spill_buffer_in_memory(data)
    if in_memory is None:
        return managed
    held = staging.held_ids()
    return sum(weight for weight, value in in_memory if id(value) not in held)
