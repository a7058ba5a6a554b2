"""Shared rich console, progress bars and summary tables."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

# Tables go to stdout; progress and notes go to stderr so stdout stays parseable.
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


class RateColumn(TextColumn):
    """Items per second with a unit, e.g. ``123.4 images/s``."""

    def __init__(self, unit: str = "it") -> None:
        super().__init__("")
        self.unit = unit

    def render(self, task):  # type: ignore[override]
        from rich.text import Text

        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.1f} {self.unit}/s", style="progress.data.speed")


# The newest progress bars, which say how far a stage without epochs got when it is interrupted.
_bars: list[tuple[Progress, str]] = []


def progress_position() -> str | None:
    """``after <done> of <total> <unit> (<task>)`` from the newest progress bar with a task under
    way (``after 120 of 500 images (extract)``), else None."""
    for bar, unit in reversed(_bars):
        for task in reversed(bar.tasks):
            if task.total and not task.finished:
                return f"after {task.completed:,.0f} of {task.total:,.0f} {unit} ({task.description})"
    return None


def forget_progress() -> None:
    """Start a stage with no progress bars (the CLI wrapper calls it)."""
    _bars.clear()


def progress(unit: str = "it", transient: bool = False) -> Progress:
    """A progress bar for long loops: ``with progress("images") as p: t = p.add_task("extract", total=n)``.

    Disabled (no output) when RDPP_NO_PROGRESS=1, e.g. in tests that capture stderr. Its tasks also
    say how far a stage got when it is interrupted (``progress_position``).
    """
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        RateColumn(unit),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
        console=err_console,
        transient=transient,
        disable=os.environ.get("RDPP_NO_PROGRESS") == "1",
    )
    _bars.append((bar, unit))
    del _bars[:-8]  # the newest few: a library caller may make many
    return bar


def summary_table(title: str, rows: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Table:
    """A two-column key/value table, printed at the end of every stage."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    items = rows.items() if isinstance(rows, Mapping) else rows
    for key, value in items:
        table.add_row(str(key), _fmt(value))
    return table


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def note(message: str) -> None:
    """A visible one-line note on stderr (e.g. 'SPICE skipped: ...'), never wrapped."""
    err_console.print(f"[yellow]note:[/yellow] {message}", soft_wrap=True)


def warning(message: str) -> None:
    """A one-line warning on stderr: the command goes on, but not as it would by default."""
    err_console.print(f"[bold yellow]warning:[/bold yellow] {message}", soft_wrap=True)


def info(message: str) -> None:
    err_console.print(message)
