"""Pieces that reach a worker before the start of their run, and runs that ended there.

A peer can send its pieces before the scheduler's start message for the same run has
reached this worker: they are kept (`EarlyPieces.keep`) until the start takes them, for at
most `EARLY_TTL_S`. Once a run ended here (done, aborted, forgotten), its early pieces go
and later ones are refused (`EarlyPieces.is_late`): run ids only grow per token (the
scheduler never reuses one). The worker's state (`dask_redist.runtime.worker`) calls every
method under its own lock.
"""

from __future__ import annotations

from collections import defaultdict

#: Pieces that arrive for a run whose start message has not are kept this long at most
#: (seconds): a run's start follows its peers' within the barrier's round trip, and pieces
#: for a rechunk that never starts here must not be kept for ever.
EARLY_TTL_S = 600.0
#: Tokens whose last ended run a worker remembers, to refuse pieces that arrive late.
ENDED_KEPT = 100_000


class EarlyPieces:
    """Early pieces by (token, run id), when the first of them came, and the last run ended per token."""

    def __init__(self):
        self._pieces: dict[tuple[str, int], list] = defaultdict(list)
        self._since: dict[tuple[str, int], float] = {}  # when the first of them arrived
        self._ended: dict[str, int] = {}  # token -> the last run id that ended here

    def __len__(self) -> int:
        return len(self._pieces)

    def runs(self) -> list[tuple[str, int]]:
        """(token, run id) of the runs pieces are kept for."""
        return list(self._pieces)

    def is_late(self, token: str, run_id: int) -> bool:
        """Whether run ``run_id`` of ``token`` ended here already (its pieces go nowhere)."""
        return run_id <= self._ended.get(token, 0)

    def keep(self, token: str, run_id: int, piece: tuple, now: float) -> None:
        self._pieces[(token, run_id)].append(piece)
        self._since.setdefault((token, run_id), now)

    def expire(self, now: float) -> None:
        """Drop the pieces kept longer than `EARLY_TTL_S`."""
        for key in [k for k, since in self._since.items() if now - since > EARLY_TTL_S]:
            self._drop(key)

    def take(self, token: str, run_id: int) -> list:
        """The pieces kept for run ``run_id`` (now starting); those of older runs of ``token`` go."""
        pieces = self._pieces.pop((token, run_id), [])
        self._since.pop((token, run_id), None)
        for key in [k for k in self._pieces if k[0] == token and k[1] < run_id]:
            self._drop(key)
        return pieces

    def ended(self, token: str, run_id: int) -> None:
        """Runs of ``token`` up to ``run_id`` ended here: drop their early pieces, refuse late ones."""
        for key in [k for k in self._pieces if k[0] == token and k[1] <= run_id]:
            self._drop(key)
        self._ended[token] = max(run_id, self._ended.pop(token, 0))  # (moved to the end: the newest)
        while len(self._ended) > ENDED_KEPT:
            del self._ended[next(iter(self._ended))]

    def newest(self, token: str) -> int:
        """The newest run id pieces are kept for, 0 if none."""
        return max((k[1] for k in self._pieces if k[0] == token), default=0)

    def clear(self) -> None:
        self._pieces.clear()
        self._since.clear()

    def _drop(self, key: tuple[str, int]) -> None:
        self._pieces.pop(key, None)
        self._since.pop(key, None)
