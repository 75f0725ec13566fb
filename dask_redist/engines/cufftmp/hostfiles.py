"""An all-gather between the processes of one machine, through files in a private directory.

The world's group all-gathers through the scheduler: each step waits for the scheduler's and
every worker's event loop, which are busiest exactly when a run ends (its unpack tasks). PEs
that share one GPU share a machine, and their run's two all-gathers (`peers`) need no
scheduler: each rank writes its payload to a file of the step and reads its peers' files as
they appear. The directory is made by rank 0 (mode 0700) and agreed on through the world's
group when the world starts (`agree`); where a rank cannot use it (another machine, another
user, a separate ``/dev/shm``), the world keeps the scheduler's all-gather.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from typing import Callable

from dask_redist.engines.ipc import Stopped  # noqa: F401 - (raised here, as its callers name it)
from dask_redist.errors import RedistTimeoutError

#: Longest pause between looks for a peer's file (the first look is at once, then 20 us, ...).
MAX_PAUSE_S = 0.001


class FileExchange:
    """``exchange(tag, payload) -> every rank's payload``, in rank order (a
    `world.DaskProcessGroup`'s exchange), through files ``<tag>.<rank>`` in ``directory``."""

    def __init__(self, directory: str, rank: int, nranks: int, timeout: float):
        self.directory, self.rank, self.nranks, self.timeout = directory, rank, nranks, timeout
        self._last: str | None = None  # this rank's file of the previous step

    def _path(self, tag: str, rank: int) -> str:
        return os.path.join(self.directory, f"{tag.replace('/', '_')}.{rank}")

    def __call__(self, tag: str, payload: bytes, stop: Callable[[], bool] | None = None) -> list:
        """Every rank's payload of step ``tag``; `Stopped` as soon as ``stop()`` is true while a
        peer's is missing (its own file of the step then removed)."""
        mine = self._path(tag, self.rank)
        with open(mine + ".part", "wb") as f:
            f.write(payload)
        os.replace(mine + ".part", mine)  # (a peer sees all of it or nothing)
        values = [None] * self.nranks
        values[self.rank] = payload
        missing = [r for r in range(self.nranks) if r != self.rank]
        deadline, pause = time.monotonic() + self.timeout, 2e-5
        while missing:
            for r in list(missing):
                with contextlib.suppress(FileNotFoundError), open(self._path(tag, r), "rb") as f:
                    values[r] = f.read()
                    missing.remove(r)
            if missing:
                if stop is not None and stop():
                    with contextlib.suppress(OSError):
                        os.unlink(mine)
                    raise Stopped(f"step {tag}: given up waiting for ranks {missing}")
                if time.monotonic() > deadline:
                    raise RedistTimeoutError(
                        f"step {tag} of the PEs' all-gather through {self.directory}: ranks {missing} did "
                        f"not answer within {self.timeout:g}s (redist.timeouts.bootstrap)"
                    )
                time.sleep(pause)
                pause = min(2 * pause, MAX_PAUSE_S)
        # every peer wrote this step, so each has read this rank's file of the step before
        self.forget_last()
        self._last = mine
        return values

    def forget_last(self) -> None:
        """Remove this rank's file of the last step (once every peer has read it)."""
        if self._last is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._last)
            self._last = None

    def close(self) -> None:
        """Once no peer reads any more (after NVSHMEM's finalize): this rank's files gone, and the
        directory with them where the peers' are gone too."""
        self.forget_last()
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)


def make_directory() -> str:
    """A new directory only this user can use, in shared memory where there is some."""
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    return tempfile.mkdtemp(prefix="dask-redist-", dir=where)


def agree(group, timeout: float, hosts=None) -> FileExchange | None:
    """A `FileExchange` every rank of ``group`` (the world's, through the scheduler) can use, or
    None for every rank (three steps of ``group``; collective). ``hosts``: every rank's
    `dask_redist.config.host`, alike on every rank; ranks of several hosts share no files (None at
    once, no step taken), even pseudo-hosts of one machine."""
    if hosts is not None and len(set(hosts)) > 1:
        return None
    directory = None
    if group.rank == 0:
        with contextlib.suppress(OSError):
            directory = make_directory()
    directory = group.allgather(directory)[0]
    if directory is None:
        return None
    try:
        nonce = secrets.token_hex(8)
        try:
            with open(os.path.join(directory, f"probe.{group.rank}"), "w") as f:
                f.write(nonce)
        except OSError:
            nonce = None
        nonces = group.allgather(nonce)
        seen = None not in nonces and all(_read(directory, f"probe.{r}") == n for r, n in enumerate(nonces))
        usable = all(group.allgather(seen))
    finally:  # (every rank read every probe before the last step)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, f"probe.{group.rank}"))
    if not usable:  # (whichever rank removes its probe last removes the directory)
        with contextlib.suppress(OSError):
            os.rmdir(directory)
        return None
    return FileExchange(directory, group.rank, group.nranks, timeout)


def _read(directory: str, name: str) -> str | None:
    try:
        with open(os.path.join(directory, name)) as f:
            return f.read()
    except OSError:
        return None
