"""The folder engine: pieces through files in one folder, a third engine in a package of its own.

Nothing of dask_redist names it: it registers through the entry-point group
``dask_redist.engines`` (pyproject.toml) or ``redist.engines``; its description
(`FolderDescription`) tells ``auto`` to take it for integer NumPy chunks where every worker
writes `FOLDER` on one host (after cufftmp, before dask), and it owns the settings section
``redist.folder.*`` (``poll``: how often a rank looks for a peer's file), which it checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import tempfile
import time
from dataclasses import dataclass

import numpy as np
from dask.utils import parse_timedelta

from dask_redist.config import ConfigError
from dask_redist.core.wire import Packed, pack
from dask_redist.engines import Engine, EngineDescription, Request, engine_settings
from dask_redist.engines.exchange import by_peer, cut_pieces, receives, sends
from dask_redist.errors import RedistTimeoutError

#: Where the folder engine's ranks leave each other's pieces (every worker of one host shares it).
FOLDER = os.path.join(tempfile.gettempdir(), "dask-redist-folder-engine")


@dataclass(frozen=True)
class FolderSettings:
    """``redist.folder.*``, checked."""

    poll_s: float = 0.01  # how often a rank looks for a file it waits for


class FolderDescription(EngineDescription):
    """The folder engine as the scheduler sees it: ``auto`` takes it for integer NumPy chunks
    (after cufftmp, before dask) where every worker can write `FOLDER` on one host."""

    preference = 10
    probes = True  # every worker says whether it can write the folder, and on which host
    chunk_types = ("numpy",)

    def read_settings(self, section: dict) -> FolderSettings:
        if unknown := sorted(set(section) - {"poll"}):
            raise ConfigError(f"unknown option redist.{self.name}.{unknown[0]}: the folder engine takes poll")
        poll = section.get("poll", "10ms")
        try:
            seconds = parse_timedelta(poll, default="s")
        except (ValueError, KeyError, TypeError):
            seconds = None
        if not seconds or seconds <= 0 or isinstance(poll, bool):
            raise ConfigError(
                f"redist.{self.name}.poll must be a positive duration like '10ms', got {poll!r}"
            )
        return FolderSettings(float(seconds))

    def declines(self, request: Request) -> str | None:
        if request.chunk_type != "numpy":
            return f"{request.chunks}: the folder engine takes NumPy chunks"
        if request.dtype is not None and np.dtype(request.dtype).kind not in "iu":
            return f"NumPy chunks of {request.dtype}: the folder engine takes integers"
        return None

    def unable(self, answers: dict[str, dict], request: Request) -> str | None:
        if bad := [w for w, a in answers.items() if not a.get("ok")]:
            return f"{bad[0]} cannot write {FOLDER}"
        if len({a.get("host") for a in answers.values()}) > 1:
            return "the workers are on several hosts: the folder engine needs one"
        return None

    def chosen(self, request: Request, passed_over: list[str]) -> str:
        return "integer NumPy chunks, every worker on one host: through files"

    def mapping(self, plan, settings) -> tuple[str, int, int]:
        return f"one file per pair of ranks in {FOLDER}", 0, 1

    def doctor_line(self, reports: dict[str, dict]) -> str:
        hosts = sorted({r.get("capabilities", {}).get("host") for r in reports.values()})
        return f"every worker writes {FOLDER}" + (
            f" on {hosts[0]}" if len(hosts) == 1 else f" on {len(hosts)} hosts"
        )


class FolderEngine(Engine):
    """Each rank writes what it sends to each peer into one file (`dask_redist.core.wire`'s packed
    buffer), renamed into place when complete; each rank waits for the files it receives, reads
    and removes them. The exchange kit (`dask_redist.engines.exchange`) says what goes where."""

    name = "folder"
    description = FolderDescription

    def __init__(self):
        self._stats: dict = {"runs": 0, "poll_s": None}

    def stats(self) -> dict:
        return dict(self._stats)

    @staticmethod
    def capabilities() -> dict:
        os.makedirs(FOLDER, exist_ok=True)
        ok = os.access(FOLDER, os.W_OK)
        return {
            "ok": ok,
            "reason": f"writes {FOLDER}" if ok else f"cannot write {FOLDER}",
            "host": socket.gethostname(),
        }

    def execute(self, run, transport):
        settings = engine_settings(run.spec.engine, run.spec.collective.settings)
        self._stats.update(runs=self._stats["runs"] + 1, poll_s=settings.poll_s)
        run.set_phase("send")
        ranks = hashlib.sha1(" ".join(run.spec.workers).encode()).hexdigest()[:12]  # (one cluster's run)
        folder = os.path.join(FOLDER, f"{run.spec.token}-{run.run_id}-{ranks}")
        os.makedirs(folder, exist_ok=True)
        for dst, mine in by_peer(run, sends(run), "dst"):
            arrays = cut_pieces(run, mine)
            if dst == run.rank:
                run.receive(run.rank, 0, arrays)
                continue
            path = os.path.join(folder, f"{run.rank}-{dst}")
            pack(arrays, mine.nbytes).tofile(path + ".part")
            os.replace(path + ".part", path)
        run.inputs = {}
        recv = receives(run)
        for src, theirs in by_peer(run, recv, "src"):
            if src != run.rank:
                run.receive(src, 0, Packed(len(theirs), self._wait_for(run, folder, src, settings.poll_s)))
        with contextlib.suppress(OSError):  # (the last rank to finish removes it)
            os.rmdir(folder)
        run.finish(run.assemblies(run.wait_received(recv)))

    @staticmethod
    def _wait_for(run, folder: str, src: int, poll_s: float) -> np.ndarray:
        """The file rank ``src`` wrote for this rank, read and removed."""
        path = os.path.join(folder, f"{src}-{run.rank}")
        deadline = time.monotonic() + run.timeout
        while not os.path.exists(path):
            run.set_phase("exchange")  # raises once the run is aborted
            if time.monotonic() > deadline:
                raise RedistTimeoutError(
                    f"{run.name()}: no file from rank {src} in {folder} after {run.timeout:g}s"
                )
            time.sleep(poll_s)
        buffer = np.fromfile(path, dtype=np.uint8)
        os.remove(path)
        return buffer
