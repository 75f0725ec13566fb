"""Errors raised by dask-redist."""

from __future__ import annotations


class ConfigError(ValueError):
    """A ``redist.*`` config value has the wrong type or an impossible value."""


class RedistError(RuntimeError):
    """A collective rechunk failed; the message names the run, the rank and the phase."""


class RedistTimeoutError(RedistError):
    """A wait inside a collective rechunk ran past its ``redist.timeouts.*`` limit.

    (Not a subclass of the builtin ``TimeoutError``: an OSError layout would keep
    tblib, and so distributed, from sending it back to the client intact.)
    """


class RedistConsistencyError(RedistError):
    """A run's state is stale or was lost (a worker left, a newer attempt started).

    The scheduler restarts the collective when it sees one of these; users only
    see it when the retries (``redist.retries``) are used up.
    """


class EngineUnavailableError(RedistError):
    """The run's engine cannot start on these workers as configured; no data moved yet.

    Every rank raises it together (the check is agreed on before NVSHMEM starts),
    so nobody is left waiting; under ``redist.engine: auto`` the scheduler reruns
    the rechunk on the ``dask`` engine, otherwise the user sees the message.
    """


class RunRefusedError(RedistError):
    """The run's engine refused it on every rank alike before any data moved, leaving its
    world as it was (a distributed FFT that cuFFTMp could not set up: see
    `dask_redist.engines.cufftmp.fft.agree`). The run fails; the engine stays usable."""


#: How a run failed, as worker and scheduler tell each other: the failure names the error
#: each rank raises (a ``restart`` is retried by the scheduler; ``unavailable`` too, on the
#: next engine, under ``engine: auto``; after ``refused`` the engine's world stays usable).
FAILURES: dict[str, type[RedistError]] = {
    "restart": RedistConsistencyError,
    "timeout": RedistTimeoutError,
    "unavailable": EngineUnavailableError,
    "refused": RunRefusedError,
    "error": RedistError,
}


def failure_of(error: RedistError) -> str:
    """The `FAILURES` entry of ``error``."""
    return next(failure for failure, cls in FAILURES.items() if isinstance(error, cls))


class NotEligibleError(ValueError):
    """An array cannot be rechunked by the collective; the message says why."""


def type_name(x) -> str:
    """``x``'s type for a message: ``numpy.ndarray``, ``xarray.DataArray``, ``int``."""
    return f"{type(x).__module__.split('.')[0]}.{type(x).__qualname__}".removeprefix("builtins.")


def is_xarray(x) -> bool:
    """Is ``x`` an xarray object (a ``DataArray`` or ``Dataset``), without importing xarray? Asked
    of its type: a ``Delayed`` answers any attribute."""
    return hasattr(type(x), "chunk") and hasattr(type(x), "dims")


def a_kind_of(x) -> str:
    """``x``'s type with its article, for a message: ``a numpy.ndarray``, ``an int``."""
    name = type_name(x)
    return f"{'an' if name[0] in 'aeiox' else 'a'} {name}"
