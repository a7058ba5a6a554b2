"""The options of `rdpp table`, declared once (rdpp_cli.options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.errors import RdppError
from rdpp_cli.options import Options, argument, at_least, force_option, one_of, option, out_option, workspace_option
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


FIGURE_FORMATS = ("pdf", "png", "svg")


def name_list(text: str | list[str] | tuple[str, ...] | None) -> list[str] | None:
    """A comma-separated option ("XE,SCST" or a list) as a list of stripped names; None when not given."""
    if text is None:
        return None
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


def _no_empty_name(flag: str, text: str | list[str] | tuple[str, ...] | None) -> None:
    """RdppError when a comma-separated option has an empty item (``a,,c``, ``a,b,``): dropped, it would
    shift every name after it to another model."""
    if text is None:
        return
    items = [str(x) for x in text] if isinstance(text, (list, tuple)) else str(text).split(",")
    empty = [k for k, x in enumerate(items, 1) if not x.strip()]
    if empty and len(empty) < len(items):
        raise RdppError(f"{flag} {text!r}: item {empty[0]} of {len(items)} is empty; give every model a name "
                        "(no ',,' and no ',' at either end)")


def figure_file(flag: str, path: Path | None) -> None:
    """RdppError unless ``path`` (``--figure``) is a regular, non-empty UTF-8 text file (a UTF-8 byte-order
    mark is allowed)."""
    import stat

    if path is None:
        return
    p = Path(path)
    todo = "pass a text file of image ids, one a line"
    if not p.exists():
        raise RdppError(f"{flag} {path} does not exist; {todo}")
    mode = p.stat().st_mode
    if not stat.S_ISREG(mode):
        what = ("a folder" if stat.S_ISDIR(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a pipe" if stat.S_ISFIFO(mode) else "not a regular file")
        raise RdppError(f"{flag} {path} is {what}, not a regular file; {todo}")
    raw = p.read_bytes()
    if not raw.strip():
        raise RdppError(f"{flag} {path} is empty; write one image id a line")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        kind = "UTF-16 text" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else f"byte 0x{raw[e.start]:02x} is not UTF-8"
        line = raw.count(b"\n", 0, e.start) + 1
        raise RdppError(f"{flag} {path}, line {line}: {kind}; save the file as UTF-8 text") from None


@dataclass
class CompareOptions(Options):
    """`rdpp compare [SAMPLES_OR_SCORES…]`: the models' caption sets side by side, per image."""

    section = "compare"

    samples: list[str] | None = argument(
        "Samples artifacts, or scores artifacts of them (folders or workspace names; default: every samples "
        "artifact of the newest data artifact's --split).")
    models: str | None = option(
        None, "Comma-separated names picking and ordering the samples: each the name of a samples artifact or of "
        "the model it was sampled from (e.g. updown-small-v1,scst-v1,dpp-m5-v1).")
    labels: str | None = option(None, "Comma-separated labels, one per model in the page's order (default: the "
                                "samples' names).")
    split: str = option("test", "The split whose samples the default picks.", choices=("train", "val", "test"))
    photos: Path | None = option(
        None, "Folder holding the data's photos where they moved since prepro (as --images-root); every compared "
        "photo must then be there.", identity=False, cli={"file_okay": False})
    figure: Path | None = option(
        None, "A file of image ids (one a line, # comments): also draw those images with each model's captions "
        "as figure.<format> (the supplement's layout).", cli={"dir_okay": False}, check=figure_file)
    format: str | None = option(None, "The figure's format (with --figure; default pdf).", choices=FIGURE_FORMATS)
    figure_captions: int = option(5, "Captions per model in the figure (the first ones; the chosen ones of a "
                                  "--select set).", check=at_least(1))
    per_page: int = option(20, "Images per page of the HTML page.", check=at_least(1))
    out: Path | None = out_option("a new version <workspace>/compare/<data name>-<split>-v<k>")
    force: bool = force_option()
    workspace: Path | None = workspace_option()

    @property
    def figure_format(self) -> str | None:
        """The figure's format: ``format``, pdf by default; None without ``figure``."""
        return (self.format or "pdf") if self.figure is not None else None

    def recorded(self) -> dict:
        """As ``Options.recorded``, with the format the figure was drawn in (none without one)."""
        return {**super().recorded(), "format": self.figure_format}

    def identity(self) -> dict:
        return {**super().identity(), "format": self.figure_format}

    def validate(self) -> None:
        if name_list(self.models) == [] or (self.labels is not None and name_list(self.labels) == []):
            raise RdppError("--models/--labels name nothing; give comma-separated names or leave the option out")
        _no_empty_name("--models", self.models)
        _no_empty_name("--labels", self.labels)
        if self.format is not None and self.figure is None:
            raise RdppError(f"--format {self.format} is the format of the --figure drawing, and no --figure was "
                            "given; pass --figure IDS_FILE or drop --format")
        labels = name_list(self.labels)
        given = name_list(self.models) or self.samples
        if labels is not None and given and len(labels) != len(given):
            raise RdppError(f"{len(labels)} labels for {len(given)} models; give one label each (--labels)")
        if labels is not None and len(set(labels)) != len(labels):
            raise RdppError(f"--labels {self.labels!r} repeats a label; give each model its own")
