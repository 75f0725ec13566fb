"""What the command line prints: tables fitted to the terminal (Markdown elsewhere), plain text."""

from __future__ import annotations

from rich.console import Console

console = Console()


def show(rows: list[dict], title: str = "") -> None:
    """A table fitted to the terminal, or Markdown where the output is not one (`report.fitted_table`)."""
    from dask_redist.report import fitted_table

    if text := fitted_table(rows, title, console.is_terminal, console.width):
        console.print(text, markup=False, highlight=False, soft_wrap=True)


def text(message: str) -> None:
    """Plain text, wrapped only on a terminal."""
    console.print(message, markup=False, highlight=False, soft_wrap=not console.is_terminal)
