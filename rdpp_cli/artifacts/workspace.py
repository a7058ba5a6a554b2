"""The workspace: versioned artifact folders under ``./runs`` and newest-artifact resolution.

Layout: ``<workspace>/<group>/<stem>-v<k>``, e.g. ``runs/data/toy-v1``, ``runs/xe/updown-small-v1``,
``runs/finetune/dpp-m5-v2``. Derived artifacts are named after their parent: samples
``runs/samples/dpp-m5-v2.random-n20-v1`` (model ``dpp-m5-v2``), and their scores
``runs/scores/dpp-m5-v2.random-n20-v1`` (then ``...-v1-v2`` for a second scoring of the same
samples). One pattern (``version_name``/``split_version``) makes and reads every versioned name. A new
run never overwrites an earlier version. A folder being written holds ``.rdpp-partial.json`` (its
kind and resume identity) until its manifest lands, and ``.rdpp-lock`` (``artifacts.lock``) while a
run writes it; rerunning the same command with the same settings resumes an unfinished folder.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import rdpp_cli.artifacts.lock as _lock
from rdpp_cli.artifacts.manifest import (GROUP_NAMES, MANIFEST, PARTIAL, Artifact, atomic_write_json,
                                         claimed_sequence, is_complete, read_artifact, workspace_root)
from rich.markup import escape

from rdpp_cli.console import info
from rdpp_cli.errors import RdppError

SEQUENCE = ".rdpp-sequence"  # in the workspace folder: the number of the last claim (``next_sequence``)
ENV = "RDPP_WORKSPACE"
WORKSPACE_YAML = "rdpp.yaml"  # per-workspace option defaults, one section per command (docs/workspace.md)
GROUPS = {
    "data": "rdpp.data",
    "xe": "rdpp.model",
    "finetune": "rdpp.model",
    "samples": "rdpp.samples",
    "scores": "rdpp.scores",
    "captions": "rdpp.captions",
    "compare": "rdpp.compare",
}
assert tuple(GROUPS) == GROUP_NAMES
RESERVED = (PARTIAL, _lock.LOCK)  # bookkeeping files of a folder being written: never cleared, never hashed
_VERSION = re.compile(r"^(?P<stem>.+)-v(?P<k>[1-9]\d*)$")


def split_version(name: str) -> tuple[str, int] | None:
    """``("dpp-m5-v1.random-n20", 3)`` for ``dpp-m5-v1.random-n20-v3``; None for an unversioned name."""
    m = _VERSION.match(name)
    return (m.group("stem"), int(m.group("k"))) if m else None


def version_name(stem: str, k: int) -> str:
    """Version ``k`` of ``stem``: ``<stem>-v<k>``. A stem that is itself a versioned artifact name
    (the scores of samples ``x-v1``) is its own first version: ``x-v1``, then ``x-v1-v2``."""
    return stem if k == 1 and split_version(stem) else f"{stem}-v{k}"


def derived_name(parent: str, own: str) -> str:
    """The stem of an artifact made from ``parent``: ``dpp-m5-v1.random-n20`` (samples of model dpp-m5-v1)."""
    return f"{parent}.{own}"


def workspace_dir(workspace: Path | str | None = None) -> Path:
    """``--workspace`` if given, else ``$RDPP_WORKSPACE``, else ``./runs``; RdppError when that path is
    a file (or anything else that is not a folder)."""
    root = Path(workspace) if workspace else Path(os.environ.get(ENV) or "runs")
    if root.exists() and not root.is_dir():
        given = "--workspace" if workspace else f"${ENV}" if os.environ.get(ENV) else "the default workspace"
        raise RdppError(f"workspace {root} ({given}) is a file, not a folder; pass --workspace DIR, a folder (made "
                        "if missing), or move the file away")
    return root


def _versions(parent: Path, stem: str) -> list[tuple[int, Path]]:
    out = []
    if parent.is_dir():
        for p in parent.iterdir():
            if not p.is_dir():
                continue
            if p.name == version_name(stem, 1):
                out.append((1, p))
            elif (sv := split_version(p.name)) and sv[0] == stem and sv[1] > 1:
                out.append((sv[1], p))
    return sorted(out)


def _identity(config: dict) -> dict:
    """A run's identity as JSON sees it; RdppError (before anything is written) for an option
    that is not a finite number."""
    try:
        return json.loads(json.dumps(config, default=str, allow_nan=False))
    except ValueError:
        bad = next((k for k, v in config.items() if isinstance(v, float) and not math.isfinite(v)), "an option")
        raise RdppError(f"--{str(bad).replace('_', '-')} is {config.get(bad)}: options must be finite numbers; "
                        "pass a finite value") from None


def read_partial(path: Path) -> dict | None:
    """The unfinished-run marker of folder ``path`` (the run's kind and identity), or None when it
    has no readable one."""
    try:
        saved = json.loads((path / PARTIAL).read_text())
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def _partial_matches(path: Path, kind: str, config: dict) -> bool:
    saved = read_partial(path)
    return saved is not None and saved.get("kind") == kind and saved.get("config") == _identity(config)


def same_identity(saved: dict, config: dict) -> bool:
    """Whether a marker's identity ``saved`` is ``config``'s, as JSON sees both."""
    return saved == _identity(config)


def _mark_partial(path: Path, kind: str, config: dict, settings: dict | None = None) -> None:
    """The unfinished-run marker, with the workspace's next sequence number when ``path`` is in a
    workspace: the order of claims decides which artifact is the newest, not the clock."""
    marker = {"kind": kind, "config": _identity(config)}
    if settings:
        marker["settings"] = _identity(settings)
    root = workspace_root(path)
    if root is not None:
        marker["sequence"] = _lock.next_number(root / SEQUENCE)
    atomic_write_json(path / PARTIAL, marker)


def finish(path: Path) -> None:
    """Drop the partial marker and the run's lock once the manifest is written."""
    (Path(path) / PARTIAL).unlink(missing_ok=True)
    _lock.release(path)


def prepare_output(
    out: Path | str | None,
    *,
    workspace: Path | str | None,
    group: str,
    name: str,
    kind: str,
    config: dict,
    force: bool = False,
    reads: Iterable[Path | str | None] = (),
    settings: dict | None = None,
) -> Path:
    """Choose and claim the folder a stage writes to, and lock it for this run (``artifacts.lock``;
    ``finish`` releases it).

    - ``out`` not given: a new version ``<workspace>/<group>/<name>-v<k>``, unless the newest
      version is an unfinished run of the same kind and config, which is resumed. Looking at the
      versions and claiming one is one step (``lock.claiming``): of two identical commands started
      together, one runs and the other is refused because the first holds the folder.
    - ``out`` given: an empty or missing folder is used; an unfinished run of the same config is
      resumed; an artifact of this ``kind`` (or an unfinished run of it with other settings) is
      replaced only with ``force``, and only when the folder holds nothing else than what the
      artifact owns (``_make_room``); anything else (another kind, unrelated files) is refused.

    ``reads``: the paths the stage reads (artifact folders, input files); an ``out`` equal to, inside
    or above one of them is refused, ``force`` or not, before anything is touched.

    ``config`` is the run's identity: what decides its result (options and the manifest hashes of
    its inputs, never paths, so that a moved workspace still resumes). A folder another live run
    holds is refused with one line naming it. ``settings``: what the run resolved beyond its identity
    (``--fast auto``'s choice), kept in a new folder's marker for a rerun to read (``unfinished_run``).
    """
    ident = _identity(config)  # a NaN option is refused before any folder is made
    refuse_unwritable(out, workspace=workspace, group=group)
    if out is None:
        parent = workspace_dir(workspace) / group
        parent.mkdir(parents=True, exist_ok=True)
        key = hashlib.sha256(json.dumps([kind, name, ident], sort_keys=True).encode()).hexdigest()[:16]
        with _lock.claiming(parent, key):
            return _new_or_resumed_version(parent, name, kind, config, settings)

    path = Path(out)
    refuse_overlap(path, reads)
    if path.exists() and not path.is_dir():
        raise RdppError(f"--out {path} is a file; give a folder path")
    path.mkdir(parents=True, exist_ok=True)
    _lock.acquire(path)  # refused while another run writes it; a dead run's lock is taken over
    with _lock.released_on_error(path):
        if any(p.name != _lock.LOCK for p in path.iterdir()):
            if not is_complete(path) and _partial_matches(path, kind, config):
                info(f"resuming unfinished {path}")
                return path
            _make_room(path, kind, force, workspace)
        _mark_partial(path, kind, config, settings)
    return path


def unfinished_run(out: Path | str | None, *, workspace: Path | str | None, group: str, name: str,
                   kind: str) -> tuple[Path, dict] | None:
    """The unfinished run of ``kind`` a stage would resume if its identity matched (``out``, else the
    newest version of ``name`` in ``<workspace>/<group>``) and its marker (``kind``, ``config``: the
    identity, ``settings``); None when there is none. Reads only."""
    if out is not None:
        path = Path(out)
    else:
        versions = _versions(workspace_dir(workspace) / group, name)
        if not versions:
            return None
        path = versions[-1][1]
    saved = read_partial(path) if path.is_dir() and not is_complete(path) else None
    if saved is None or saved.get("kind") != kind or not isinstance(saved.get("config"), dict):
        return None
    return path, saved


def _new_or_resumed_version(parent: Path, name: str, kind: str, config: dict, settings: dict | None = None) -> Path:
    versions = _versions(parent, name)
    if versions:
        k, newest = versions[-1]
        if not is_complete(newest) and _partial_matches(newest, kind, config):
            _lock.acquire(newest)  # refused while the run that made it is alive
            if is_complete(newest):  # finished while we looked
                _lock.release(newest)
            else:
                info(f"resuming unfinished {newest}")
                return newest
    k = versions[-1][0] + 1 if versions else 1
    while True:
        path = parent / version_name(name, k)
        try:
            path.mkdir()
            break
        except FileExistsError:
            k += 1
    _lock.acquire(path)
    _mark_partial(path, kind, config, settings)
    return path


def refuse_unwritable(out: Path | str | None, *, workspace: Path | str | None, group: str) -> None:
    """RdppError when the folder a stage would write (``out``, else ``<workspace>/<group>``) lies on a
    read-only file system or one this user may not write, found by creating (and removing) an empty
    file in its nearest existing folder. ``prepare_output`` checks it; a stage that works long before
    claiming its folder checks it first too, so that a read-only workspace is said before any work."""
    target = Path(out) if out is not None else workspace_dir(workspace) / group
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        if probe == target and out is not None:
            return  # --out names a file: prepare_output says so
        what = "--out" if out is not None else "the workspace folder"
        raise RdppError(f"{probe} is a file, not a folder, so {what} {target} cannot be made under it; pass a path "
                        "whose folders are folders")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rdpp-probe-", dir=probe)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            return  # not a question of permission: the write itself will say what it is
        where = "--out DIR" if out is not None else "--out DIR (or --workspace DIR)"
        raise RdppError(f"{probe} is read-only ({e.strerror}); pass {where}, a folder you can write") from None
    os.close(fd)
    os.unlink(tmp)


def refuse_overlap(out: Path | str | None, reads: Iterable[Path | str | None]) -> None:
    """RdppError when ``out`` (``--out``; None: a new version folder, nothing to check) is, lies
    inside or holds a path the stage reads. ``prepare_output`` checks it; a stage that works long
    before claiming its folder checks it first too, so that the refusal comes at once."""
    if out is None:
        return
    target = Path(out).resolve()
    for given in reads:
        if given is None:
            continue
        src = Path(given).resolve()
        how = ("is" if target == src else "lies inside" if target.is_relative_to(src)
               else "holds" if src.is_relative_to(target) else None)
        if how:
            raise RdppError(f"--out {out} {how} {given}, which this stage reads; choose another --out "
                            "(not even --force writes over a stage's input)")


def _make_room(path: Path, kind: str, force: bool, workspace: Path | str | None) -> None:
    """Empty ``path`` for a new run of ``kind`` (``force``), or refuse: only an artifact of the
    same kind, or an unfinished run of it, is ever replaced, and an artifact others were made from
    only when orphaning them was asked for (``orphaning``)."""
    if is_complete(path):
        try:
            art = read_artifact(path)
            existing = art.kind
        except RdppError:
            existing = None
        if existing != kind:
            raise RdppError(f"{path} holds {existing or 'an unreadable'} artifact, not {kind}; choose another --out "
                            "(--force replaces only an artifact of the same stage)")
        if not force:
            raise RdppError(f"{path} already holds {existing} artifact; choose another --out or pass --force to replace it")
        _refuse_orphaning(art, workspace)
        _refuse_others(path, kind, _not_owned(path, set(art.manifest.get("files") or {})))
        (path / MANIFEST).unlink()  # from here on the folder is incomplete, never read as whole
    elif (path / PARTIAL).exists():
        started = (read_partial(path) or {}).get("kind")
        if started != kind:
            raise RdppError(f"{path} holds an unfinished {started or 'unknown'} run, not {kind}; choose another --out "
                            "(--force replaces only an artifact of the same stage)")
        if not force:
            raise RdppError(f"{path} holds an unfinished run with other settings; choose another --out or pass "
                            "--force to overwrite it")
        _refuse_others(path, kind, [p for p in sorted(path.iterdir()) if not p.name.startswith(".")
                                    and p.name not in STAGE_OUTPUTS.get(kind, ())])
    else:
        raise RdppError(f"{path} holds files that are not an rdpp artifact; choose another --out "
                        "(--force replaces only an artifact of the same stage, never other files)")
    _clear(path)


# The top-level names an unfinished run of each kind may have written (a complete artifact's are the
# files its manifest lists). Names starting with a dot are rdpp's bookkeeping and temporary files.
STAGE_OUTPUTS = {
    "rdpp.data": ("captions.h5", "cider_df.h5", "features.h5", "vocab.json", "dataset.json", "source"),
    "rdpp.model": ("checkpoints", "last_state.pt", "metrics.csv", "tensorboard"),
    "rdpp.samples": ("samples.json",),
    "rdpp.scores": ("scores.json", "per_image.csv", "plot.png"),
    "rdpp.captions": ("results.json", "contact_sheet.html"),
    "rdpp.compare": ("index.html", "plot.png", "table.md", "compare.json", "thumbs", "data", "figure.pdf",
                     "figure.png", "figure.svg"),
}


def _not_owned(path: Path, listed: set[str], prefix: str = "") -> list[Path]:
    """What in ``path`` its artifact does not own: files its manifest does not list (``listed``,
    relative to the artifact folder; ``prefix``: ``path``'s own place in it), hidden names and the
    manifest aside; a folder holding no listed file is named as one."""
    out = []
    for child in sorted(path.iterdir()):
        rel = prefix + child.name
        if child.name.startswith(".") or rel == MANIFEST or rel in listed:
            continue
        if child.is_dir() and not child.is_symlink() and any(f.startswith(rel + "/") for f in listed):
            out += _not_owned(child, listed, rel + "/")
        else:
            out.append(child)
    return out


def _refuse_others(path: Path, kind: str, others: list[Path]) -> None:
    """--force replaces an artifact's own files, never others: refuse, naming them, when there are."""
    if others:
        names = ", ".join(p.relative_to(path).as_posix() + ("/" if p.is_dir() else "") for p in others[:6])
        names += ", ..." if len(others) > 6 else ""
        raise RdppError(f"{path} holds files that are not its {kind} artifact's ({names}); "
                        "move them out of the folder or choose another --out (--force replaces only an artifact "
                        "of the same stage, never other files)")


_orphan_descendants = contextvars.ContextVar("orphan_descendants", default=False)


@contextlib.contextmanager
def orphaning(allowed: bool = True):
    """Within the block, ``--force`` may replace an artifact that others were made from (the command
    line's ``--orphan-descendants``); they are then refused as inputs, their input having changed."""
    token = _orphan_descendants.set(allowed)
    try:
        yield
    finally:
        _orphan_descendants.reset(token)


def descendants(art: Artifact, workspace: Path | str | None = None) -> list[Artifact]:
    """Every complete artifact made from ``art``, directly or through others, in its workspace (and
    ``workspace``), found by the manifest hashes their inputs record."""
    roots = {r.resolve() for r in (workspace_root(art.path), Path(workspace) if workspace else None)
             if r is not None and r.is_dir()}
    arts = [a for r in sorted(roots) for a in list_artifacts(r)]
    found, todo, seen = [], [art.manifest_sha256], {art.manifest_sha256}
    while todo:
        sha = todo.pop()
        for a in arts:
            if a.manifest_sha256 not in seen and any(i.get("manifest_sha256") == sha for i in a.inputs):
                seen.add(a.manifest_sha256)
                found.append(a)
                todo.append(a.manifest_sha256)
    return found


def _refuse_orphaning(art: Artifact, workspace: Path | str | None) -> None:
    if _orphan_descendants.get():
        return
    below = descendants(art, workspace)
    if below:
        names = ", ".join(f"{a.path.parent.name}/{a.name}" for a in below[:6]) + (", ..." if len(below) > 6 else "")
        raise RdppError(f"{art.path} has {len(below)} artifact(s) made from it ({names}): replacing it would orphan "
                        "them; choose another --out, or pass --orphan-descendants with --force")


def _clear(path: Path) -> None:
    for child in path.iterdir():
        if child.name != _lock.LOCK:
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
    return sorted(found, key=newest_last)


def newest_last(art: Artifact) -> tuple:
    """The order of a workspace's artifacts, oldest first: the sequence number of their claims (a
    clock set wrong cannot reorder them), then, for those made before rdpp numbered claims (0), the
    time written in their manifests."""
    return (art.sequence, art.created, str(art.path))


def group_folders(root: Path, groups=tuple(GROUPS)) -> list[Path]:
    """The folders (and links to folders, even broken ones) of the workspace's ``groups``."""
    return sorted(p for g in groups if (root / g).is_dir() for p in (root / g).iterdir()
                  if (p.is_dir() or p.is_symlink()) and not p.name.startswith("."))


def broken_link(p: Path) -> str | None:
    """Why the link ``p`` leads nowhere (it points to a missing path, or into a loop of links), else None."""
    if not p.is_symlink() or p.exists():
        return None
    try:
        os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"a link to {os.readlink(p)} in a loop of links that never reaches a folder"
    return f"a link to {os.readlink(p)}, which does not exist"


def stray_folders(workspace: Path | str | None = None, listed: set[Path] = frozenset(),
                  groups=tuple(GROUPS)) -> list[tuple[Path, str]]:
    """The folders under the workspace's groups that are not complete, readable artifacts of their
    group's kind, each with why: ``unfinished run``, ``no manifest.json``, a broken link or the
    reading error. ``listed``: folders already read as artifacts (``list_artifacts``), not read again."""
    out = []
    for p in group_folders(workspace_dir(workspace), groups):
        if p in listed:
            continue
        if (why := broken_link(p)) is not None:
            out.append((p, why))
        elif (p / MANIFEST).is_file():
            try:
                read_artifact(p, GROUPS[p.parent.name])
            except RdppError as e:
                out.append((p, str(e)))
        else:
            out.append((p, "unfinished run" if (p / PARTIAL).is_file() else "no manifest.json"))
    return out


def _skipped(root: Path, groups: tuple[str, ...], chosen: Artifact, listed: set[Path]) -> str:
    """``; skipped ...`` naming the folders of ``groups`` that are not usable artifacts and may be newer
    than ``chosen`` (an unfinished run claimed after it, or a folder whose order cannot be read)."""
    skipped = [(p, why) for p, why in stray_folders(root, listed, groups)
               if (seq := claimed_sequence(p)) is None or seq > chosen.sequence]
    if not skipped:
        return ""
    short = [(p, why if (p / MANIFEST).is_symlink() or not (p / MANIFEST).is_file() else "manifest not readable as "
              f"{GROUPS[p.parent.name]}; `rdpp verify` says why") for p, why in skipped]
    return "; skipped " + ", ".join(f"{p.parent.name}/{p.name} ({why})" for p, why in short[:3]) \
        + (f" and {len(short) - 3} more" if len(short) > 3 else "")


def resolve_input(
    from_: str | Path | None,
    *,
    workspace: Path | str | None,
    groups: tuple[str, ...],
    kind: str,
    what: str,
    make_with: str,
    quiet: bool = False,
    option: str = "--from",
) -> Artifact:
    """The artifact a stage reads: ``from_`` as a path, a name in the workspace (``dpp-m5-v1``) or a
    group/name as ``rdpp ls`` shows it (``finetune/dpp-m5-v1``); else the newest.

    ``groups`` are searched in order of preference (e.g. ``("finetune", "xe")``: the newest
    fine-tuned model, else the newest XE model). ``option``: the command's option that names this
    input (the hint printed with the newest says so).
    """
    root = workspace_dir(workspace)
    if from_ is not None:
        p = Path(from_)
        if p.exists():
            return read_artifact(p, kind)
        candidates = [root / group / str(from_) for group in groups]
        if p.parts and p.parts[0] in groups:
            candidates.insert(0, root / p)
        for c in candidates:
            if c.exists():
                return read_artifact(c, kind)
        raise RdppError(f"{what} '{from_}' not found as a path nor under {root}/{{{','.join(groups)}}}; "
                        f"see `rdpp ls`")
    for k, group in enumerate(groups):
        arts = list_artifacts(root, (group,))
        if arts:
            chosen = arts[-1]
            if not quiet:
                skipped = _skipped(root, groups[:k + 1], chosen, {a.path for a in arts})
                info(f"using {what}: [bold]{chosen.path}[/bold] (newest in {root}/{group}; {option} to pick another"
                     f"{escape(skipped)})")
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
