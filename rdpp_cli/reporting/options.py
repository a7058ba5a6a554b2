"""The options of `rdpp table`, declared once (rdpp_cli.options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.errors import RdppError
from rdpp_cli.options import Options, argument, at_least, one_of, option, workspace_option
from rdpp_cli.reporting.report import FORMATS

TABLES = ("toy", "objective", "precision", "selection", "real-photos", "models")


def set_sizes(ks: str | list[int] | tuple[int, ...]) -> list[int]:
    """``--ks`` ("5,10" or a list) as a list of set sizes, each at least 1."""
    text = ",".join(map(str, ks)) if isinstance(ks, (list, tuple)) else str(ks)
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise RdppError(f"--ks {ks!r} is not a comma-separated list of set sizes; pass e.g. --ks 5,10")
    return [int(p) for p in parts]


@dataclass
class TableOptions(Options):
    section = "table"

    table: str | None = argument(
        "Which tables: toy (the paper's Tables 1-2, Fig. 1 and the results table), objective (two seeds of "
        "XE, SCST, R-DPP m=2, 5), precision (fp32 against bf16), selection (--select against the decoders), "
        "real-photos (the real-photo run's report) or models (XE, SCST, R-DPP m=5 of every model).", required=True,
        check=one_of(*TABLES))
    format: str = option("md", "md (Markdown), csv (the numbers unrounded) or rich (a terminal table).",
                         check=one_of(*FORMATS))
    against: Path | None = option(
        None, "objective: a workspace with the same runs (e.g. made by another rdpp version); each cell "
        "shows 'its number → this workspace's'.")
    candidates: int = option(50, "selection: the candidates per image of the --select runs (their -c<C> tag).",
                             check=at_least(1))
    ks: str = option("5,10", "selection: the set sizes K, comma-separated.",
                     check=lambda flag, value: set_sizes(value))
    plot: Path | None = option(None, "selection: also draw the K = 10 points and the temperature curves into "
                               "this PNG.", cli={"dir_okay": False})
    licenses: Path | None = option(None, "real-photos: the photo set's LICENSES.tsv (which photos may be shown).",
                                   cli={"dir_okay": False})
    sheet: Path | None = option(None, "real-photos: also render the contact sheet of the test photos into this PNG.",
                                cli={"dir_okay": False})
    workspace: Path | None = workspace_option()

    def validate(self) -> None:
        if self.table is None:
            raise RdppError(f"name the tables to print: `rdpp table {'|'.join(TABLES)}`")
        for name, table in (("against", "objective"), ("plot", "selection"), ("licenses", "real-photos"),
                            ("sheet", "real-photos")):
            if getattr(self, name) is not None and self.table != table:
                raise RdppError(f"--{name} belongs to `rdpp table {table}`, not `rdpp table {self.table}`; "
                                "leave it out")
