"""What a report is made of, how it prints, and the readers of artifact files it is built from.

A report is a list of blocks: ``Table`` (columns, rows of cells, an optional title) and ``Text``
(lines of prose, e.g. the checks under a table). A cell is a string or a ``Num``, a number with
its format, so that Markdown and rich print ``0.812`` while CSV keeps the number itself. The
readers take a workspace folder and an artifact's folder name (``scores/<name>/scores.json``, ...)
and return None for what is not there yet; they read files only (json, csv): no torch, no pandas.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASH = "–"  # a number that is not there
FORMATS = ("md", "csv", "rich")


@dataclass(frozen=True)
class Num:
    """A number and its format spec (``".3f"``, ``"+.3f"``, ``".1%"``); None prints as "–"."""

    value: float | int | None
    spec: str = ".3f"

    def __str__(self) -> str:
        return DASH if self.value is None else format(self.value, self.spec)

    def raw(self) -> str:
        """The number as CSV holds it: every digit, "" when not there."""
        return "" if self.value is None else repr(self.value) if isinstance(self.value, float) else str(self.value)


Cell = str | Num


@dataclass
class Table:
    """``columns``; ``rows`` of cells; ``title`` (Markdown prints it above the table); ``align``: one
    "l" or "r" per column for Markdown's separator row ("" prints ``---`` under every column)."""

    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    title: str | None = None
    align: str = ""


@dataclass
class Text:
    """Lines printed as they are (Markdown and rich; CSV leaves them out)."""

    lines: list[str]


Block = Table | Text


# ---- printing -------------------------------------------------------------------------------------

def _md_row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown(blocks: list[Block]) -> str:
    """The blocks as Markdown, one blank line between blocks and under a table's title."""
    parts = []
    for b in blocks:
        if isinstance(b, Text):
            parts.append("\n".join(b.lines))
            continue
        align = b.align or "l" * len(b.columns)
        lines = [b.title, ""] if b.title else []
        lines += [_md_row(b.columns), "|" + "".join("---:|" if a == "r" else "---|" for a in align)]
        lines += [_md_row(r) for r in b.rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _plain_title(title: str) -> str:
    return title.lstrip("#").strip()


def to_csv(blocks: list[Block]) -> str:
    """The tables as CSV (numbers unrounded), each after a ``# title`` line, a blank line between
    tables; text blocks are left out."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for k, b in enumerate(x for x in blocks if isinstance(x, Table)):
        if k:
            out.write("\n")
        if b.title:
            out.write(f"# {_plain_title(b.title)}\n")
        writer.writerow(b.columns)
        writer.writerows([c.raw() if isinstance(c, Num) else c for c in r] for r in b.rows)
    return out.getvalue()


def print_rich(blocks: list[Block]) -> None:
    """The blocks as rich tables on the console (numbers right-aligned)."""
    from rich.table import Table as RichTable

    from rdpp_cli.console import console

    for b in blocks:
        if isinstance(b, Text):
            console.print("\n".join(b.lines), markup=False, highlight=False, soft_wrap=True)
            continue
        t = RichTable(title=_plain_title(b.title) if b.title else None, title_justify="left")
        for j, col in enumerate(b.columns):
            numeric = bool(b.rows) and all(isinstance(r[j], Num) for r in b.rows if j < len(r))
            t.add_column(col, justify="right" if numeric else "left")
        for r in b.rows:
            t.add_row(*(str(c) for c in r))
        console.print(t)


def show(blocks: list[Block], fmt: str) -> None:
    """Print the blocks to stdout as ``fmt`` (md, csv or rich)."""
    if fmt == "rich":
        print_rich(blocks)
    else:
        print(markdown(blocks) if fmt == "md" else to_csv(blocks), end="")


# ---- reading a workspace --------------------------------------------------------------------------

def read_json(path: Path) -> Any | None:
    """The file's JSON, or None when there is no such file."""
    return json.loads(path.read_text()) if path.is_file() else None


def get(d: Any, *keys: str) -> Any | None:
    """``d[k1][k2]...``; None where a level is missing or empty."""
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def scores(ws: Path, name: str) -> dict | None:
    """``<ws>/scores/<name>/scores.json`` (rdpp score), or None."""
    return read_json(ws / "scores" / name / "scores.json")


def samples(ws: Path, name: str) -> list | None:
    """``<ws>/samples/<name>/samples.json`` (rdpp sample), or None."""
    return read_json(ws / "samples" / name / "samples.json")


def bad_endings(ws: Path, name: str) -> float | None:
    """The mean over images of the share of captions that end in a word that cannot end a sentence
    (``metrics.diversity.BAD_ENDINGS``) in ``samples/<name>``, from samples.json itself, so that
    artifacts of every rdpp version are read the same way; None when there is no such artifact."""
    import numpy as np

    from rdpp_cli.metrics.diversity import ending_share

    smp = samples(ws, name)
    if smp is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # no image with a caption: NaN
        return float(np.nanmean(ending_share([[c.lower() for c in s["captions"]] for s in smp])))


def last_time(metrics_csv: Path) -> float:
    """The ``time`` column of a model's metrics.csv at its last epoch (NaN when not there)."""
    if not metrics_csv.is_file():
        return math.nan
    with open(metrics_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    return float(rows[-1]["time"]) if rows and rows[-1].get("time") not in (None, "") else math.nan
