"""Lineage by content: following an artifact's recorded inputs, wherever they have moved.

An input entry ``{"kind", "name", "path", "manifest_sha256"}`` (``manifest.input_ref``) names its
input by the sha256 of the input's ``manifest.json``. ``open_input`` opens it at its recorded path
(relative to the workspace) when the manifest there still has that hash; otherwise it looks for
the artifact with that hash in the owner's workspace and the current one (a moved or copied
workspace), and refuses with one line when the input changed or is gone. ``follow_input`` is the
same for a stage that may also be handed the input explicitly (``--data``): the given artifact
must be the recorded one (same manifest hash), not merely one with the same image ids or path.
"""

from __future__ import annotations

from pathlib import Path

from rdpp_cli.artifacts.manifest import Artifact, is_complete, read_artifact, workspace_root
from rdpp_cli.artifacts.workspace import GROUPS, list_artifacts, resolve_input, workspace_dir
from rdpp_cli.console import info
from rdpp_cli.errors import RdppError


def ref_name(art: Artifact) -> str:
    """How configs and messages name an artifact: ``group/name`` inside a workspace, else its path."""
    return f"{art.path.parent.name}/{art.name}" if workspace_root(art.path) is not None else str(art.path)


def entry_name(entry: dict) -> str:
    """``group/name`` of a recorded input (``rdpp ls``'s lineage column)."""
    p = Path(entry.get("path", ""))
    return f"{p.parent.name}/{entry.get('name', p.name)}" if p.parent.name else entry.get("name", str(p))


def _roots(owner: Artifact, workspace: Path | str | None) -> list[Path]:
    roots: list[Path] = []
    for r in (workspace_root(owner.path), workspace_dir(workspace).resolve() if workspace_dir(workspace).is_dir()
              else None):
        if r is not None and r not in roots:
            roots.append(r)
    return roots


def find_by_hash(roots: list[Path], kind: str, sha: str, name: str | None = None) -> Artifact | None:
    """The complete artifact of ``kind`` whose manifest hash is ``sha`` in any of ``roots``
    (same-named folders first: reading a few manifests, not every file)."""
    groups = tuple(g for g, k in GROUPS.items() if k == kind)
    for root in roots:
        if name:
            for g in groups:
                p = root / g / name
                if is_complete(p):
                    try:
                        art = read_artifact(p, kind)
                    except RdppError:
                        continue
                    if art.manifest_sha256 == sha:
                        return art
    for root in roots:
        for art in list_artifacts(root, groups):
            if art.manifest_sha256 == sha:
                return art
    return None


def open_input(owner: Artifact, entry: dict, *, workspace: Path | str | None = None, quiet: bool = False) -> Artifact:
    """The artifact a recorded input entry of ``owner`` names, checked by its manifest hash."""
    kind, sha = entry.get("kind"), entry.get("manifest_sha256")
    recorded = owner.input_path(entry)
    changed = None
    if is_complete(recorded):
        art = read_artifact(recorded, kind)
        if not sha or art.manifest_sha256 == sha:
            return art
        changed = art
    if sha:
        found = find_by_hash(_roots(owner, workspace), kind, sha, entry.get("name"))
        if found is not None:
            if not quiet:
                info(f"input {entry_name(entry)} of {owner.name} is not at {recorded}; found it by its manifest hash "
                     f"at [bold]{found.path}[/bold]")
            return found
    if changed is not None:
        raise RdppError(f"{recorded} changed after {owner.path} was made from it (its manifest hash differs from "
                        f"the one recorded); restore it, or remake {owner.name} from it (`rdpp verify` lists what changed)")
    raise RdppError(f"input {entry_name(entry)} of {owner.path} is missing: not at {recorded}, and no {kind} artifact "
                    f"in {', '.join(map(str, _roots(owner, workspace))) or 'the workspace'} has its manifest hash; "
                    f"copy it into the workspace (or pass --workspace), or remake {owner.name}")


def follow_input(
    owner: Artifact,
    kind: str,
    given: str | Path | None,
    *,
    workspace: Path | str | None,
    what: str,
    make_with: str,
    refused: str,
    quiet: bool = False,
) -> Artifact | None:
    """``owner``'s input of ``kind``: ``given`` (path or name) if set, which must then be the very
    artifact ``owner`` records (same manifest hash; ``refused`` is the rest of the one-line error),
    else the recorded one. None when ``given`` is None and ``owner`` records no such input."""
    entry = owner.input_of_kind(kind)
    if given is None:
        if entry is None:
            return None
        art = open_input(owner, entry, workspace=workspace, quiet=quiet)
        if not quiet:
            info(f"using {what}: [bold]{art.path}[/bold] (the one {ref_name(owner)} was made from)")
        return art
    art = resolve_input(given, workspace=workspace, groups=tuple(g for g, k in GROUPS.items() if k == kind),
                        kind=kind, what=what, make_with=make_with, quiet=quiet)
    if entry is not None and entry.get("manifest_sha256") and entry["manifest_sha256"] != art.manifest_sha256:
        raise RdppError(f"{ref_name(owner)} was made from {what} {entry_name(entry)}, not from {art.path} (their "
                        f"manifests differ); {refused}")
    return art


def resolve_data_for(model_art: Artifact, data: str | Path | None, workspace: Path | str | None,
                     quiet: bool = False) -> Artifact:
    """A model's data artifact: ``data`` if given, else the one the model was trained on (found by
    its manifest hash where the workspace moved); it must be the model's training data (same manifest)."""
    if model_art.input_of_kind("rdpp.data") is None:
        raise RdppError(f"model artifact {model_art.path} records no data artifact among its inputs; "
                        "retrain it with `rdpp train-xe`")
    return follow_input(model_art, "rdpp.data", data, workspace=workspace, what="data artifact",
                        make_with="rdpp prepro toy` or `rdpp prepro coco", quiet=quiet,
                        refused=f"drop --data to use the model's own, or train a model on {data} with "
                                f"`rdpp train-xe --data {data}`")
