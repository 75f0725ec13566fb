"""The command line's argument types: a bad value is argparse's one-line usage error (exit 2),
naming the option's value and what it must be, never a traceback or a case run anyway."""

from __future__ import annotations

import argparse

#: The protocols whose addresses are host:port (a scheduler at one needs its port).
HOST_PORT_PROTOCOLS = ("tcp", "tls", "ucx", "ucxx", "ws", "wss")


def at_least(low: int):
    """An ``int`` type of ``low`` or more."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, got {n}")
        return n

    parse.__name__ = f"whole number >= {low}"
    return parse


def positive_float(text: str) -> float:
    """A ``float`` above 0."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x > 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return x


def size(text: str) -> str:
    """A size as dask's ``parse_bytes`` reads it (``256MiB``, ``1GiB``, ``1e6``), above 0; kept as
    written (the cases parse it and name it)."""
    from dask.utils import parse_bytes

    try:
        n = parse_bytes(text)
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: e.g. 256MiB, 1GiB") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not above 0 bytes")
    return text


def dtype(text: str) -> str:
    """The name of a numeric NumPy dtype (``float64``, ``complex64``, ``int32``), kept as written."""
    import numpy as np

    try:
        kind = np.dtype(text).kind
    except TypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a NumPy dtype: e.g. float64, float32") from None
    if kind not in "biufc":
        raise argparse.ArgumentTypeError(f"{text!r} is not a numeric dtype: e.g. float64, float32")
    return text


def scheduler_address(text: str) -> str:
    """A scheduler's address as distributed's Client takes it: ``tcp://host:8786``, ``host:8786``;
    or the scheduler file ``dask scheduler --scheduler-file`` wrote (its ``address``), as the
    workers of a shared node or a batch job are given it."""
    import json
    import os

    from distributed.comm.addressing import parse_address, parse_host_port

    if os.path.isfile(text):
        try:
            with open(text) as f:
                address = json.load(f)["address"]
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a scheduler file ({type(e).__name__}: {e}): "
                "the JSON `dask scheduler --scheduler-file` writes"
            ) from None
        return scheduler_address(address)
    try:
        protocol, location = parse_address(text)
        if protocol in HOST_PORT_PROTOCOLS:
            parse_host_port(location)
    except (ValueError, TypeError) as e:
        if "://" not in text and (os.sep in text or text.endswith((".json", ".yaml"))):  # (a file's path)
            raise argparse.ArgumentTypeError(
                f"no scheduler file at {text!r} (no such file) and no scheduler address either: "
                "the file `dask scheduler --scheduler-file` writes, or an address like tcp://host:8786"
            ) from None
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a scheduler address ({e}): e.g. tcp://host:8786"
        ) from None
    return text


def protocol(text: str) -> str:
    """A protocol distributed knows (``tcp``, ``ucx``, ...; a UCX cluster then needs UCX installed)."""
    from distributed.comm.registry import get_backend

    try:
        get_backend(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def methods_problem(args, engines) -> str | None:
    """Why ``bench --methods`` names a method that this kind of bench has not, or None."""
    if not getattr(args, "methods", None) or args.pipeline:  # (the pipelines have their own rows)
        return None
    if args.fft:
        from dask_redist.bench.fft import CPU_METHODS, GPU_METHODS

        known = list(GPU_METHODS if args.gpu else CPU_METHODS)
    else:
        rechunks = [*(f"redist-{e}" for e in engines), "enabled", "tasks", "p2p"]
        known = [*rechunks, *(f"{m}-ucx" for m in rechunks), "nvmath", "ceiling", "floor"]
    unknown = [m for m in args.methods if m not in known]
    if not unknown:
        return None
    what = "bench --fft" + (" --gpu" if args.gpu else "") if args.fft else "bench"
    return f"argument --methods: {', '.join(map(repr, unknown))}: {what} runs {' '.join(known)}"
