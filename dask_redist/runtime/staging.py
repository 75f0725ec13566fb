"""The chunks stage tasks keep on a worker until a run takes them.

A staged chunk lives exactly as long as its stage key is in memory on the
scheduler, which sends ``redist-drop`` when the key is released: a restarted run
finds every marker it is given backed by data, and memory is released as soon as
dask would release it. A run takes its own references when it starts.

**On a worker whose chunks dask-cuda spills** (a ``device_memory_limit``), a stage task
receives its chunk unspilled, back on the GPU, and dask-cuda cannot spill what the
collective holds. So the chunks staged here stay on the GPU only up to `DEVICE_SHARE` of
that limit; beyond it a host copy is kept instead (the chunk's logical type is still CuPy),
and the `cufftmp` engine uploads those a round's parts at a time. Measured on one H200
(tools/gpu/spill_probe.py): 3.81 GiB of CuPy input, 24 of 32 chunks spilled under a 1 GiB
limit, peaked at 13.74 GiB of GPU memory in use before, as with nothing spilled.
"""

from __future__ import annotations

import threading
from typing import Any

from dask_redist.core.assemble import array_kind

#: The share of dask-cuda's device memory limit that staged chunks may keep on the GPU.
DEVICE_SHARE = 0.5


def device_limit(worker) -> int | None:
    """dask-cuda's device memory limit on ``worker`` (its DeviceHostFile's device buffer), or None."""
    n = getattr(getattr(worker.data, "device_buffer", None), "n", None)
    return int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and n > 0 else None


class StagingStore:
    """Staged chunks by (token, flat chunk index), and which stage key staged them."""

    def __init__(self):
        self._lock = threading.Lock()
        self._chunks: dict[tuple[str, int], Any] = {}
        self._by_key: dict[tuple[str, tuple], list[int]] = {}  # (token, stage key tail) -> chunk indices
        self._on_gpu: dict[tuple[str, int], int] = {}  # bytes of the staged CuPy chunks
        self._on_host = 0  # CuPy chunks staged as host copies (module docstring)

    def put(self, token: str, tail: tuple, chunks: dict[int, Any], gpu_limit: int | None = None) -> None:
        """Keep ``chunks``; CuPy ones past `DEVICE_SHARE` of ``gpu_limit`` as host copies."""
        with self._lock:
            for index, chunk in chunks.items():
                if array_kind(chunk) == "cupy":
                    if gpu_limit is not None and sum(self._on_gpu.values()) + chunk.nbytes > gpu_limit * DEVICE_SHARE:
                        chunk = chunk.get()
                        self._on_host += 1
                    else:
                        self._on_gpu[(token, index)] = chunk.nbytes
                self._chunks[(token, index)] = chunk
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
            self._chunks.pop((key[0], index), None)
            self._on_gpu.pop((key[0], index), None)

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()
            self._by_key.clear()
            self._on_gpu.clear()

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"staged chunks": len(self._chunks), "stage keys": len(self._by_key)}

    def on_host(self) -> int:
        """How many CuPy chunks were staged as host copies since this worker started."""
        return self._on_host
