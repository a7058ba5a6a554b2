"""The workspace: versioned artifact folders under ``./runs`` and newest-artifact resolution.

Layout: ``<workspace>/<group>/<name>-v<k>``, e.g. ``runs/data/toy-v1``, ``runs/xe/att2in-v1``,
``runs/finetune/dpp-m5-v2``, ``runs/samples/random-n20-v1``, ``runs/scores/v1``. A new run never
overwrites an earlier version. A folder being written holds ``.rdpp-partial.json`` (its kind and
config) until its manifest lands; rerunning the same command with the same settings resumes it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from rdpp_cli.artifacts.manifest import MANIFEST, Artifact, atomic_write_json, is_complete, read_artifact
from rdpp_cli.console import info
from rdpp_cli.errors import RdppError

PARTIAL = ".rdpp-partial.json"
ENV = "RDPP_WORKSPACE"
WORKSPACE_YAML = "rdpp.yaml"  # per-workspace option defaults, one section per command (docs/workspace.md)
GROUPS = {
    "data": "rdpp.data",
    "xe": "rdpp.model",
    "finetune": "rdpp.model",
    "samples": "rdpp.samples",
    "scores": "rdpp.scores",
}
_VERSION = re.compile(r"^(?P<stem>.*?)-?v(?P<k>\d+)$")


def workspace_dir(workspace: Path | str | None = None) -> Path:
    """``--workspace`` if given, else ``$RDPP_WORKSPACE``, else ``./runs``."""
    if workspace:
        return Path(workspace)
    return Path(os.environ.get(ENV) or "runs")


def _versions(parent: Path, stem: str) -> list[tuple[int, Path]]:
    out = []
    if parent.is_dir():
        for p in parent.iterdir():
            m = _VERSION.match(p.name)
            if p.is_dir() and m and m.group("stem") == stem:
                out.append((int(m.group("k")), p))
    return sorted(out)


def _partial_matches(path: Path, kind: str, config: dict) -> bool:
    marker = path / PARTIAL
    if not marker.is_file():
        return False
    try:
        saved = json.loads(marker.read_text())
    except json.JSONDecodeError:
        return False
    return saved.get("kind") == kind and saved.get("config") == json.loads(json.dumps(config, default=str))


def _mark_partial(path: Path, kind: str, config: dict) -> None:
    atomic_write_json(path / PARTIAL, {"kind": kind, "config": json.loads(json.dumps(config, default=str))})


def finish(path: Path) -> None:
    """Drop the partial marker once the manifest is written."""
    (Path(path) / PARTIAL).unlink(missing_ok=True)


def prepare_output(
    out: Path | str | None,
    *,
    workspace: Path | str | None,
    group: str,
    name: str,
    kind: str,
    config: dict,
    force: bool = False,
) -> Path:
    """Choose and claim the folder a stage writes to.

    - ``out`` not given: a new version ``<workspace>/<group>/<name>-v<k>``, unless the newest
      version is an unfinished run of the same kind and config, which is resumed.
    - ``out`` given: an empty or missing folder is used; an unfinished run of the same config is
      resumed; anything else (another artifact, unrelated files) is refused unless ``force``.
    """
    if out is None:
        parent = workspace_dir(workspace) / group
        parent.mkdir(parents=True, exist_ok=True)
        versions = _versions(parent, name)
        if versions:
            k, newest = versions[-1]
            if not is_complete(newest) and _partial_matches(newest, kind, config):
                info(f"resuming unfinished {newest}")
                return newest
        k = versions[-1][0] + 1 if versions else 1
        while True:
            path = parent / f"{name}-v{k}"
            try:
                path.mkdir()
                break
            except FileExistsError:
                k += 1
        _mark_partial(path, kind, config)
        return path

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise RdppError(f"--out {path} is a file; give a folder path")
    if path.is_dir() and any(path.iterdir()):
        if is_complete(path):
            if not force:
                try:
                    existing = read_artifact(path).kind
                except RdppError:
                    existing = "an rdpp"
                raise RdppError(
                    f"{path} already holds {existing} artifact; choose another --out or pass --force to replace it"
                )
            (path / MANIFEST).unlink()  # from here on the folder is incomplete, never read as whole
            _clear(path)
        elif _partial_matches(path, kind, config):
            info(f"resuming unfinished {path}")
            return path
        elif not force:
            what = "an unfinished run with other settings" if (path / PARTIAL).exists() else "files that are not an rdpp artifact"
            raise RdppError(f"{path} holds {what}; choose another --out or pass --force to overwrite it")
        else:
            _clear(path)
    path.mkdir(parents=True, exist_ok=True)
    _mark_partial(path, kind, config)
    return path


def _clear(path: Path) -> None:
    for child in path.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def list_artifacts(workspace: Path | str | None = None, groups: tuple[str, ...] | None = None) -> list[Artifact]:
    """Every complete artifact in the workspace (oldest first)."""
    root = workspace_dir(workspace)
    found = []
    for group in groups or tuple(GROUPS):
        parent = root / group
        if not parent.is_dir():
            continue
        for p in parent.iterdir():
            if p.is_dir() and is_complete(p):
                try:
                    found.append(read_artifact(p, GROUPS[group]))
                except RdppError:
                    continue
    return sorted(found, key=lambda a: (a.created, str(a.path)))


def resolve_input(
    from_: str | Path | None,
    *,
    workspace: Path | str | None,
    groups: tuple[str, ...],
    kind: str,
    what: str,
    make_with: str,
    quiet: bool = False,
) -> Artifact:
    """The artifact a stage reads: ``from_`` as a path or a name in the workspace, else the newest.

    ``groups`` are searched in order of preference (e.g. ``("finetune", "xe")``: the newest
    fine-tuned model, else the newest XE model).
    """
    root = workspace_dir(workspace)
    if from_ is not None:
        p = Path(from_)
        if p.exists():
            return read_artifact(p, kind)
        for group in groups:
            if (root / group / str(from_)).exists():
                return read_artifact(root / group / str(from_), kind)
        raise RdppError(f"{what} '{from_}' not found as a path nor under {root}/{{{','.join(groups)}}}; "
                        f"see `rdpp ls`")
    for group in groups:
        arts = list_artifacts(root, (group,))
        if arts:
            chosen = arts[-1]
            if not quiet:
                info(f"using {what}: [bold]{chosen.path}[/bold] (newest in {root}/{group}; --from to pick another)")
            return chosen
    raise RdppError(f"no {what} in workspace {root}; make one with `{make_with}`")


def find_reusable(
    workspace: Path | str | None,
    group: str,
    settings: dict,
    inputs: list[Artifact] = (),
) -> Artifact | None:
    """The newest complete artifact in ``group`` whose config has every key/value of ``settings``
    and that was made from exactly these ``inputs`` (same manifest hashes); None if there is none."""
    want = json.loads(json.dumps(settings, default=str))
    need = {a.manifest_sha256 for a in inputs}
    for art in reversed(list_artifacts(workspace, (group,))):
        cfg = art.config
        if any(cfg.get(k) != v for k, v in want.items()):
            continue
        if need <= {i.get("manifest_sha256") for i in art.inputs}:
            return art
    return None
