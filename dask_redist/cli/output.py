"""What the command line prints: tables fitted to the terminal (Markdown elsewhere), plain text,
progress bars on long work; and where the logs of distributed and dask-redist go: a file it names."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time

from distributed.diagnostics.plugin import WorkerPlugin
from rich.console import Console

console = Console()

#: The loggers whose records go to the command's log file (`logs_to_file`), not the terminal.
LOGGERS = ("distributed", "dask_redist")


class _FileLog(logging.Handler):
    """Records appended to a file. (Not a ``StreamHandler``: LocalCluster's ``silence_logs`` turns
    those down, which would silence the file too.)"""

    def __init__(self, path: str, level: int = logging.INFO, who: str = ""):
        super().__init__(level)
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 - closed by `logs_to_file`
        self.setFormatter(logging.Formatter(f"%(asctime)s - {who}%(name)s - %(levelname)s - %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.file.write(self.format(record) + "\n")
        except Exception:  # (logging must never fail the command)
            self.handleError(record)

    def close(self) -> None:
        self.file.close()
        super().close()


def current_log_file() -> str | None:
    """The log file `logs_to_file` writes to now, if any."""
    handler = next((h for h in logging.getLogger(LOGGERS[0]).handlers if isinstance(h, _FileLog)), None)
    return handler.file.name if handler else None


def _warnings_and_stalls(record: logging.LogRecord) -> bool:
    """Warnings and worse, and distributed's notes of an event loop that did not answer (INFO): a
    worker's loop blocked for long enough loses its connection to the scheduler (its comms'
    ``TCP_USER_TIMEOUT``, ``distributed.comm.timeouts.tcp``)."""
    return record.levelno >= logging.WARNING or record.getMessage().startswith("Event loop was unresponsive")


class WorkerLogFile(WorkerPlugin):
    """A worker plugin for the workers of a cluster started here: their records of `LOGGERS`
    (`_warnings_and_stalls`), appended to the command's log file by the worker itself. Forwarded
    records travel the worker's stream to the scheduler, so a worker whose stream broke could not
    say why (2026-12-06, one H100: a worker closed with "worker-handle-scheduler-connection-broken"
    and the log had nothing of its own; one H200, at 20:39: the same, with no warning before it)."""

    name = "dask-redist-log-file"

    def __init__(self, path: str):
        self.path = path
        self.handler: _FileLog | None = None

    def setup(self, worker) -> None:
        self.handler = _FileLog(self.path, logging.INFO, who=f"worker {worker.name} ({os.getpid()}) ")
        self.handler.addFilter(_warnings_and_stalls)
        for name in LOGGERS:
            logging.getLogger(name).addHandler(self.handler)

    def teardown(self, worker) -> None:
        if self.handler is not None:
            for name in LOGGERS:
                logging.getLogger(name).removeHandler(self.handler)
            self.handler.close()


def log_path(command: str, path: str | None = None) -> str:
    """``path``, or a new file of the temporary directory named after the command and the time."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return path or os.path.join(tempfile.gettempdir(), f"dask-redist-{command}-{stamp}-{os.getpid()}.log")


@contextlib.contextmanager
def logs_to_file(path: str):
    """While inside, the records of `LOGGERS` in this process (and those the workers forward:
    `cli.clusters.forward_logs`) go to ``path``, and none to the terminal; the path is printed once.
    The workers of a cluster started here append theirs to ``path`` themselves (`WorkerLogFile`)."""
    handler = _FileLog(path)
    saved = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate, logger.level))
        logger.handlers, logger.propagate = [handler], False
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    text(f"logs of distributed and dask-redist: {path}")
    try:
        yield path
    finally:
        for logger, handlers, propagate, level in saved:
            logger.handlers, logger.propagate = handlers, propagate
            logger.setLevel(level)
        handler.close()


@contextlib.contextmanager
def progress(description: str, total: float):
    """A progress bar on the terminal (nothing elsewhere) while inside; yields ``update(**fields)``
    (rich's ``Progress.update``: ``advance=``, ``completed=``, ``description=``). Lines printed on
    `console` meanwhile appear above it."""
    if not console.is_terminal:
        yield lambda **fields: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda **fields: bar.update(task, **fields)


def show(rows: list[dict], title: str = "") -> None:
    """A table fitted to the terminal, or Markdown where the output is not one (`report.fitted_table`)."""
    from dask_redist.report import fitted_table

    if text := fitted_table(rows, title, console.is_terminal, console.width):
        console.print(text, markup=False, highlight=False, soft_wrap=True)


def text(message: str) -> None:
    """Plain text, wrapped only on a terminal."""
    console.print(message, markup=False, highlight=False, soft_wrap=not console.is_terminal)
