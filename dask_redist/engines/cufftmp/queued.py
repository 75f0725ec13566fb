"""Work of a world of one PE, queued behind its inputs' kernels and not waited for.

With one PE no other process reads or writes the chunks, so the GPU's own ordering is enough.
The work goes on CUDA's legacy default stream, which starts only once the work queued before
it on every blocking stream of the process is done (the kernels computing the inputs, on
whichever thread's stream they were queued), and which the work queued after it on those
streams waits for (the consumers of the outputs, Dask copying them elsewhere). So the host
waits neither for the inputs nor for the result: the unpack tasks, and the consumers fused into
them, are queued while the GPU works, as Dask's own tasks on CuPy chunks are. (Work queued on
a non-blocking stream of a user's own is not ordered so: such a user synchronizes it, as
anywhere in Dask.) The inputs are let go once the work is queued: CuPy's pool hands their
memory again only to work queued after it on their stream.

What such work reads from the host's side (a job table's pinned memory) is kept until it is done
(`InFlight`); its GPU timings are read once they are asked for (the engine's `stats`).
"""

from __future__ import annotations

from collections import deque


def stream():
    """The stream a one-PE run's work goes on: CUDA's legacy default stream (see the module)."""
    import cupy

    return cupy.cuda.Stream.null


class InFlight:
    """Objects that queued GPU work still reads, each batch kept until its event has completed
    (events of one stream complete in order: the oldest are let go first)."""

    def __init__(self):
        self._held: deque = deque()

    def hold(self, event, objects: list) -> None:
        self._held.append((event, objects))
        while self._held and self._held[0][0].done:
            self._held.popleft()
