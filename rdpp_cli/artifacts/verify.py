"""``rdpp verify``: check what manifests promise, for every artifact of the workspace or those named.

For each artifact: every listed file exists with its recorded size and (unless ``quick``) its
recorded sha256, and every recorded input still resolves to an artifact with the recorded manifest
hash (``lineage.open_input``: at its recorded path, or found by hash where it moved). A folder whose
manifest cannot be read is reported too. Unfinished runs (no manifest yet) are not artifacts and
are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rdpp_cli.artifacts.lineage import entry_name, open_input
from rdpp_cli.artifacts.manifest import MANIFEST, Artifact, read_artifact
from rdpp_cli.artifacts.workspace import GROUPS, workspace_dir
from rdpp_cli.errors import RdppError


@dataclass
class Checked:
    """One artifact's verdict: ``problems`` is empty when it is intact."""

    path: Path
    kind: str = "?"
    files: int = 0
    bytes: int = 0
    inputs: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _folders(names: list[str] | None, root: Path) -> list[Path]:
    if not names:
        return sorted(p for g in GROUPS if (root / g).is_dir() for p in (root / g).iterdir()
                      if p.is_dir() and (p / MANIFEST).is_file())
    out = []
    for name in names:
        candidates = [Path(name), root / name, *(root / g / name for g in GROUPS)]
        found = next((c for c in candidates if c.is_dir()), None)
        if found is None:
            raise RdppError(f"artifact '{name}' not found as a path nor under {root}/{{{','.join(GROUPS)}}}; "
                            "see `rdpp ls`")
        out.append(found)
    return out


def check_artifact(path: Path, *, workspace: Path | str | None = None, quick: bool = False) -> Checked:
    """The verdict on one artifact folder."""
    res = Checked(Path(path))
    try:
        art: Artifact = read_artifact(path)
    except RdppError as e:
        res.problems.append(str(e))
        return res
    res.kind = art.kind
    files = art.manifest.get("files", {})
    res.files, res.bytes = len(files), sum(int(e.get("bytes", 0)) for e in files.values())
    res.problems += art.problems(full=not quick)
    for entry in art.inputs:
        res.inputs += 1
        try:
            open_input(art, entry, workspace=workspace, quiet=True)
        except RdppError as e:
            res.problems.append(f"input {entry_name(entry)}: {e}")
    return res


def verify(artifacts: list[str] | None = None, *, workspace: Path | str | None = None, quick: bool = False,
           show: bool = True) -> list[Checked]:
    """Check the named artifacts (paths, names or group/name), or every artifact of the workspace;
    prints a table of the verdicts (``show``) and returns them."""
    from rdpp_cli.console import console, progress

    root = workspace_dir(workspace)
    folders = _folders(artifacts, root)
    results = []
    with progress("artifacts") as bar:
        task = bar.add_task("verify", total=len(folders), info="")
        for p in folders:
            results.append(check_artifact(p, workspace=workspace, quick=quick))
            bar.advance(task)
    if show:
        console.print(_table(results, quick))
        bad = sum(not r.ok for r in results)
        console.print(f"{len(results)} artifact(s) checked in {root}, {bad} with problems")
    return results


def _table(results: list[Checked], quick: bool):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"rdpp verify ({'sizes and lineage' if quick else 'sha256 of every file, and lineage'})",
                  title_justify="left")
    for col in ("artifact", "kind", "files", "inputs", "status"):
        table.add_column(col, overflow="fold")
    for r in results:
        status = "[green]ok[/green]" if r.ok else "[red]" + escape("; ".join(r.problems)) + "[/red]"
        table.add_row(f"{r.path.parent.name}/{r.path.name}", r.kind.removeprefix("rdpp."),
                      f"{r.files} ({r.bytes:,} bytes)", str(r.inputs), status)
    return table
