"""The cufftmp engine's own settings, ``redist.nvshmem.*``, read and checked (`CufftMpSettings.read`)."""

from __future__ import annotations

from dataclasses import dataclass

from dask_redist.checks import check_bool, check_int, check_size
from dask_redist.errors import ConfigError


@dataclass(frozen=True)
class CufftMpSettings:
    """``redist.nvshmem.*`` as the cufftmp engine reads it (``exit-when-stuck`` is the runtime's:
    `dask_redist.config.Settings.exit_when_stuck`)."""

    symmetric_size: int | None = None  # NVSHMEM's symmetric heap per GPU; None: the environment's
    shared_gpu_copies: bool = True  # PEs on one GPU copy chunk to chunk (`.peers`)
    shared_gpu_max_chunks: int = 128  # ... where no worker owns more output chunks than this

    @classmethod
    def read(cls, section: dict) -> CufftMpSettings:
        """``section`` (keys relative to ``redist.nvshmem``) checked; `ConfigError` names the key."""
        known = {"symmetric-size", "exit-when-stuck", "shared-gpu-copies", "shared-gpu-max-chunks"}
        if unknown := sorted(set(section) - known):
            raise ConfigError(
                f"unknown option redist.nvshmem.{unknown[0]}: the keys are {', '.join(sorted(known))}"
            )
        default = cls()
        sym = section.get("symmetric-size")
        return cls(
            symmetric_size=None if sym is None else check_size("nvshmem.symmetric-size", sym, low=1),
            shared_gpu_copies=check_bool(
                "nvshmem.shared-gpu-copies", section.get("shared-gpu-copies", default.shared_gpu_copies)
            ),
            shared_gpu_max_chunks=check_int(
                "nvshmem.shared-gpu-max-chunks",
                section.get("shared-gpu-max-chunks", default.shared_gpu_max_chunks),
                low=1,
            ),
        )
