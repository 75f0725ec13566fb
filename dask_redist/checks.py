"""The checks of a setting's value: each returns it, or raises a `ConfigError` naming the key
(``redist.KEY``), the value and what it must be. `dask_redist.config` reads ``redist.*`` with them;
engines check their own sections with them (`check_size`, `check_bool`, `check_int`)."""

from __future__ import annotations

from dask.utils import parse_bytes, parse_timedelta

from dask_redist.errors import ConfigError


def check_bool(key, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"redist.{key} must be true or false, got {value!r}")
    return value


#: The ranges of the numeric settings (each checked, the `ConfigError` naming key, value and range).
#: Timeouts stop short of what Python's waits take (``threading.TIMEOUT_MAX``); size classes beyond
#: 16 bits are exact for any width; a retry count or chunk count beyond these is a typo.
MAX_SECONDS = 30 * 24 * 3600.0
RANGES = {
    "size-class-bits": (0, 16),
    "retries": (0, 100),
    "nvshmem.shared-gpu-max-chunks": (1, 1 << 20),
}


def check_size(key, value, low: int = 0) -> int:
    try:
        n = parse_bytes(value) if isinstance(value, str) else value
    except ValueError:
        raise ConfigError(f"redist.{key} must be a size like '1GiB', got {value!r}") from None
    if isinstance(n, bool) or not isinstance(n, int) or n < low:
        raise ConfigError(
            f"redist.{key} must be a size like '1GiB' or a number of bytes >= {low}, got {value!r}"
        )
    return n


def check_min_bytes(value) -> int | str:
    return "auto" if value == "auto" else check_size("min-bytes", value)


def check_size_or_off(key, value) -> int | None:
    return None if value is False or value is None else check_size(key, value)


def check_seconds(key, value) -> float:
    try:
        t = parse_timedelta(value, default="s")
    except (ValueError, KeyError, TypeError):
        t = None
    if t is None or isinstance(value, bool) or not 0 < t <= MAX_SECONDS:
        raise ConfigError(
            f"redist.{key} must be a duration above 0s and at most 30 days, like '60s', got {value!r}"
        )
    return float(t)


def check_int(key, value, low: int = 0) -> int:
    """An integer setting within its range (`RANGES`, else at least ``low``)."""
    low, high = RANGES.get(key, (low, None))
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        within = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ConfigError(f"redist.{key} must be an integer {within}, got {value!r}")
    return value
