"""``rdpp verify``: check what manifests promise, for every artifact of the workspace or those named.

For each artifact:

- every listed file exists with its recorded size and its recorded sha256: hashed now, or with
  ``quick`` the hash remembered when a stage or an earlier ``rdpp verify`` last hashed that version
  of the file (``artifacts.verified``; a file changed on disk since is reported as not checked);
- a data artifact's features (``fc`` and ``att`` of ``features.h5``) are finite (not with ``quick``);
- every recorded input still resolves to an artifact with the recorded manifest hash
  (``lineage.open_input``: at its recorded path, or found by hash where it moved);
- an artifact made, directly or through others, from an artifact with a problem is reported too,
  naming that ancestor: what it was made from is no longer what its manifest says.

Every folder under the workspace's groups is looked at: one without a manifest is reported as a
problem, unless it holds ``.rdpp-partial.json`` (an unfinished run, listed as such); a manifest
that cannot be read is a problem, and so is a link to a folder that is gone. ``workspace.stray_folders`` is
the same survey for ``rdpp ls``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rdpp_cli.artifacts.lineage import entry_name, open_input
from rdpp_cli.artifacts.manifest import MANIFEST, Artifact, read_artifact
from rdpp_cli.artifacts.options import VerifyOptions
from rdpp_cli.artifacts.verified import own_progress_bar
from rdpp_cli.artifacts.workspace import GROUPS, PARTIAL, broken_link, group_folders, read_partial, workspace_dir
from rdpp_cli.errors import RdppError
from rdpp_cli.options import takes

NO_MANIFEST = ("no manifest.json and no .rdpp-partial.json: not an artifact nor an unfinished run (its manifest "
               "was deleted?); remake it, or delete the folder")


@dataclass
class Checked:
    """One folder's verdict: ``problems`` is empty when it is intact (or an unfinished run)."""

    path: Path
    kind: str = "?"
    files: int = 0
    bytes: int = 0
    inputs: int = 0
    problems: list[str] = field(default_factory=list)
    made_from: list[Path] = field(default_factory=list)  # the inputs, resolved
    unfinished: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems


def _folders(names: list[str] | None, root: Path) -> list[Path]:
    if not names:
        return group_folders(root)
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
    """The verdict on one folder (its own files and inputs; ``verify`` adds its ancestors' problems)."""
    res = Checked(Path(path))
    if (why := broken_link(res.path)) is not None:
        res.problems.append(f"{why}; restore what it points to, or delete the link")
        return res
    if not (res.path / MANIFEST).is_file() and (res.path / PARTIAL).is_file():
        res.unfinished, res.kind = True, str((read_partial(res.path) or {}).get("kind", "?"))
        return res
    if not (res.path / MANIFEST).exists():
        res.problems.append(NO_MANIFEST)
        return res
    try:
        art: Artifact = read_artifact(path, GROUPS.get(res.path.parent.name))
    except RdppError as e:
        res.problems.append(str(e))
        return res
    res.kind = art.kind
    files = art.manifest.get("files", {})
    res.files, res.bytes = len(files), sum(int(e.get("bytes", 0)) for e in files.values())
    res.problems += art.problems(full=not quick)
    if art.kind == "rdpp.data" and not quick and not res.problems and "features.h5" in art.manifest["files"]:
        res.problems += non_finite_features(res.path / "features.h5")
    for entry in art.inputs:
        res.inputs += 1
        try:
            res.made_from.append(_resolved(open_input(art, entry, workspace=workspace, quiet=True).path))
        except RdppError as e:
            res.problems.append(f"input {entry_name(entry)}: {e}")
    return res


def non_finite_features(path: Path, block_bytes: int = 1 << 26) -> list[str]:
    """The first image whose ``fc`` or ``att`` rows in the features file ``path`` hold NaN or infinity
    (one problem line per array), read in blocks of about ``block_bytes``; empty when all are finite."""
    import h5py
    import numpy as np

    out = []
    with h5py.File(path, "r") as f:
        for name in ("fc", "att"):
            if name not in f:
                continue
            ds = f[name]
            step = max(1, block_bytes // max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:]))))
            for s in range(0, ds.shape[0], step):
                rows = ds[s:s + step]
                bad = ~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1)
                if bad.any():
                    row = s + int(np.argmax(bad))
                    image = int(f["image_ids"][row]) if "image_ids" in f else row
                    out.append(f"features.h5: the {name} features of image {image} (row {row}) hold NaN or infinity "
                               "(imported so, or written so by an older rdpp); remake the data artifact from finite "
                               "features")
                    break
    return out


def _label(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _propagate(results: dict[Path, Checked]) -> None:
    """Add to every verdict the ancestors (inputs, their inputs, ...) with problems of their own."""
    own = {p: list(r.problems) for p, r in results.items()}

    def changed(r: Checked, seen: set[Path]) -> list[Path]:
        out = []
        for q in r.made_from:
            if q in seen or q not in results:
                continue
            seen.add(q)
            out += ([q] if own[q] else []) + changed(results[q], seen)
        return out

    for r in results.values():
        for q in changed(r, set()):
            r.problems.append(f"made from {_label(q)}, which has a problem ({own[q][0]}); restore {_label(q)} "
                              "or remake this artifact from an intact one")


def _resolved(path: Path) -> Path:
    """``path`` with its links followed; as it is (absolute) where they loop."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):  # a loop of links: RuntimeError before Python 3.13, OSError (ELOOP) after
        return Path(path).absolute()


def check_all(folders: list[Path], *, workspace: Path | str | None, quick: bool, advance=None) -> list[Checked]:
    """Verdicts on ``folders`` in order, each with its ancestors' problems (the ancestors are
    checked too, once each, whether named or not)."""
    results: dict[Path, Checked] = {}
    named: dict[Path, Path] = {}  # resolved -> as given
    for folder in folders:
        named.setdefault(_resolved(folder), Path(folder))
    todo = list(named)
    while todo:
        p = todo.pop(0)
        if p in results:
            continue
        results[p] = check_artifact(named.get(p, p), workspace=workspace, quick=quick)
        todo += results[p].made_from
        if advance and p in named:
            advance()
    _propagate(results)
    return [results[p] for p in named]


@takes(VerifyOptions)
def verify(opts: VerifyOptions, *, show: bool = True) -> list[Checked]:
    """Check the named ``artifacts`` (paths, names or group/name), or every folder of the workspace's
    groups; prints a table of the verdicts (``show``) and returns them."""
    from rdpp_cli.console import console, progress

    root = workspace_dir(opts.workspace)
    folders = _folders(opts.artifacts, root)
    with progress("artifacts") as bar, own_progress_bar():
        task = bar.add_task("verify", total=len(folders), info="")
        results = check_all(folders, workspace=opts.workspace, quick=opts.quick, advance=lambda: bar.advance(task))
    if show:
        console.print(_table(results, opts.quick))
        bad = sum(not r.ok for r in results)
        unfinished = sum(r.unfinished for r in results)
        console.print(f"{len(results) - unfinished} artifact(s) checked in {root}, {bad} with problems"
                      + (f"; {unfinished} unfinished run(s) (rerun their command to resume)" if unfinished else ""))
    return results


def _table(results: list[Checked], quick: bool):
    from rich.markup import escape
    from rich.table import Table

    what = ("sizes, the hashes remembered when each file was last hashed, and lineage" if quick
            else "sha256 of every file, and lineage")
    table = Table(title=f"rdpp verify ({what})", title_justify="left")
    for col in ("artifact", "kind", "files", "inputs", "status"):
        table.add_column(col, overflow="fold")
    for r in results:
        status = ("[yellow]unfinished run[/yellow]" if r.unfinished and r.ok else "[green]ok[/green]" if r.ok
                  else "[red]" + escape("; ".join(r.problems)) + "[/red]")
        table.add_row(_label(r.path), r.kind.removeprefix("rdpp."), f"{r.files} ({r.bytes:,} bytes)", str(r.inputs),
                      status)
    return table
