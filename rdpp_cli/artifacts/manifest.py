"""Artifact manifests: what a stage wrote, from what, with which settings.

An artifact is a directory with ``manifest.json``, written last and atomically. A directory without
a manifest is incomplete and is never read. See docs/workspace.md.

Inputs are recorded as ``{"kind", "name", "path", "manifest_sha256"}``: ``path`` relative to the
workspace (``data/toy-v1``) when the input lies in the workspace the artifact is written to, else
absolute; the manifest hash identifies the input wherever it moves (``artifacts.lineage``).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
from dataclasses import dataclass
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rdpp_cli import __version__
from rdpp_cli.artifacts.files import (atomic_write, atomic_write_bytes, atomic_write_json, json_bytes,  # noqa: F401
                                      sha256_file, write_failure)
from rdpp_cli.errors import RdppError

# The manifest schema each kind is written with, and the oldest schema this rdpp still reads. An
# artifact older than that is refused with the command that remakes it (REMAKE); a newer one asks for
# a newer rdpp. The schemas change with the version (rdpp_cli.__version__, CHANGELOG.md): rdpp.data is
# at schema 2 since rdpp 0.2.0, whose cider_df.h5 counts the end token (EOS) of every training
# reference, as the training reward does (docs/rewards.md#the-end-token-in-the-training-reward);
# schema-1 data artifacts (rdpp 0.1.0) are still read (their references score, their models sample)
# and refused by the stages that need the training reward (rdpp_cli.metrics.train_cider). Every other
# kind is at schema 1, as in rdpp 0.1.0.
SCHEMAS = {"rdpp.data": 2, "rdpp.model": 1, "rdpp.samples": 1, "rdpp.scores": 1, "rdpp.captions": 1,
           "rdpp.compare": 1}
OLDEST_READ = {"rdpp.data": 1, "rdpp.model": 1, "rdpp.samples": 1, "rdpp.scores": 1, "rdpp.captions": 1,
               "rdpp.compare": 1}
SCHEMA = 1  # kept for old imports; use SCHEMAS[kind]
REMAKE = {
    "rdpp.data": "rdpp prepro toy` or `rdpp prepro coco",
    "rdpp.model": "rdpp train-xe` (XE) or `rdpp finetune",
    "rdpp.samples": "rdpp sample",
    "rdpp.scores": "rdpp score",
    "rdpp.captions": "rdpp caption",
    "rdpp.compare": "rdpp compare",
}
MANIFEST = "manifest.json"
KINDS = tuple(SCHEMAS)
# An artifact's workspace is the folder two levels up when its parent is one of these group folders.
GROUP_NAMES = ("data", "xe", "finetune", "samples", "scores", "captions", "compare")


PARTIAL = ".rdpp-partial.json"  # the marker of a folder being written: its kind, identity and sequence number


def claimed_sequence(folder: Path) -> int | None:
    """The workspace's sequence number this folder was claimed with (its partial marker's), or None."""
    try:
        seq = json.loads((Path(folder) / PARTIAL).read_text()).get("sequence")
    except (OSError, ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None



def workspace_root(path: Path | str) -> Path | None:
    """The workspace an artifact folder lies in (``<root>/<group>/<name>``), or None."""
    p = Path(path).resolve()
    return p.parent.parent if p.parent.name in GROUP_NAMES else None


def file_ref(path: Path | str, root: Path | str | None) -> str:
    """How a manifest records a file a user passed (backbone weights): relative to the workspace
    ``root`` when it lies inside it (it moves with the workspace), else absolute. The file's sha256
    is recorded beside it; ``Artifact.resolve_path`` reads it back."""
    p = Path(path).resolve()
    if root is not None and p.is_relative_to(Path(root).resolve()):
        return p.relative_to(Path(root).resolve()).as_posix()
    return str(p)


def input_ref(art: "Artifact", out_dir: Path | str) -> dict:
    """How an artifact written to ``out_dir`` records its input ``art``: the path relative to their
    common workspace (absolute when they share none) and the input's manifest hash."""
    root = workspace_root(out_dir)
    src = art.path.resolve()
    path = str(src)
    if root is not None and src.is_relative_to(root):
        path = src.relative_to(root).as_posix()
    return {"kind": art.kind, "name": art.name, "path": path, "manifest_sha256": art.manifest_sha256}


@dataclass(frozen=True)
class Artifact:
    """A complete artifact on disk (its manifest has been read and checked)."""

    path: Path
    manifest: dict

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    @property
    def config(self) -> dict:
        return self.manifest.get("config", {})

    @property
    def created(self) -> str:
        return self.manifest.get("created", "")

    @property
    def sequence(self) -> int:
        """The workspace's sequence number of the claim that made it (0: made outside a workspace, or
        by an rdpp that did not number claims)."""
        seq = self.manifest.get("sequence")
        return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0

    @property
    def inputs(self) -> list[dict]:
        return self.manifest.get("inputs", [])

    @property
    def name(self) -> str:
        return self.path.name

    @functools.cached_property
    def manifest_sha256(self) -> str:
        """sha256 of ``manifest.json``'s bytes: the artifact's identity wherever it is moved."""
        return sha256_file(self.path / MANIFEST)

    def input_path(self, entry: dict) -> Path:
        """Where an input entry says the input is: relative paths are relative to this artifact's
        workspace (older manifests hold absolute paths)."""
        return self.resolve_path(entry.get("path", ""))

    def resolve_path(self, recorded: str | Path) -> Path:
        """A path this manifest records (``file_ref``): relative to the artifact's workspace (its
        parent folder outside one), or absolute."""
        p = Path(recorded)
        if p.is_absolute():
            return p
        root = workspace_root(self.path)
        return (root if root is not None else self.path.parent) / p

    def file(self, name: str) -> Path:
        """Path of a listed file, after checking it is the file the manifest lists: its size, then
        its sha256 (hashed once per version of the file on disk: ``artifacts.verified``)."""
        from rdpp_cli.artifacts.verified import checked_hash

        entry = self.manifest.get("files", {}).get(name)
        p = self.path / name
        if entry is None:
            raise RdppError(f"{self.path / MANIFEST} lists no file '{name}'; rebuild this artifact")
        if not p.exists():
            raise RdppError(f"{p} is missing (listed in its manifest); rebuild this artifact")
        if p.stat().st_size != entry["bytes"]:
            raise RdppError(
                f"{p} has {p.stat().st_size} bytes but its manifest says {entry['bytes']}: "
                "the file changed after the artifact was written; rebuild it"
            )
        actual = checked_hash(self.path, name, entry.get("hash_of", "file"))
        if actual != entry["sha256"]:
            raise RdppError(
                f"{p} changed after its artifact was written: same size ({entry['bytes']:,} bytes) but sha256 "
                f"{actual[:12]}…, not the {entry['sha256'][:12]}… its manifest records; restore the file or remake "
                f"{self.path.parent.name}/{self.name} (`rdpp verify` lists every changed file and what was made from it)"
            )
        return p

    def problems(self, full: bool = True) -> list[str]:
        """Every listed file that is missing, has another size, or another sha256 than the manifest
        records; one line each, empty when the artifact is intact. ``full``: every file is hashed
        now (and the hash remembered); else only remembered hashes are compared, and a file changed
        on disk since it was last hashed is reported as not checked."""
        from rdpp_cli.artifacts.verified import checked_hash, remembered, stat_key

        out = []
        for name, entry in self.manifest.get("files", {}).items():
            p = self.path / name
            hash_of = entry.get("hash_of", "file")
            if not p.is_file():
                out.append(f"{name}: missing (listed in the manifest)")
            elif p.stat().st_size != entry["bytes"]:
                out.append(f"{name}: {p.stat().st_size} bytes but the manifest says {entry['bytes']}")
            elif (actual := checked_hash(self.path, name, hash_of, rehash=True) if full
                    else remembered(self.path, name, stat_key(p), hash_of)) is None:
                out.append(f"{name}: not checked since it last changed on disk (no hash remembered for its size, "
                           "mtime and inode); `rdpp verify` without --quick hashes it")
            elif actual != entry["sha256"]:
                out.append(f"{name}: sha256 {actual[:12]}… does not match the manifest ({entry['sha256'][:12]}…), "
                           "same size")
        return out

    def verify(self) -> None:
        """Full check: every listed file's size and sha256 (reads every byte); RdppError on the first problem."""
        for problem in self.problems(full=True):
            raise RdppError(f"{self.path}/{problem}: the file was modified after the artifact was written; rebuild it")

    def input_of_kind(self, kind: str) -> dict | None:
        for inp in self.inputs:
            if inp.get("kind") == kind:
                return inp
        return None


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_manifest(
    out_dir: Path,
    kind: str,
    config: dict,
    inputs: list[Artifact] = (),
    precomputed: dict[str, dict] | None = None,
    summary: dict | None = None,
) -> Artifact:
    """Finish an artifact: hash its files and write ``manifest.json`` atomically, last.

    ``precomputed`` maps a file name to ``{"sha256": ..., "hash_of": ...}`` for files hashed while
    they were written (large HDF5 files); every other regular file in ``out_dir`` (recursively,
    skipping hidden temp files) is hashed here. ``summary`` holds headline numbers for ``rdpp ls``.
    """
    from rdpp_cli.artifacts.verified import remember, stat_key

    if kind not in KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}")
    out_dir = Path(out_dir)
    precomputed = precomputed or {}
    files: dict[str, dict] = {}
    seen: dict[str, tuple] = {}  # remembered as verified (artifacts.verified): just hashed
    for p in sorted(out_dir.rglob("*")):
        rel = p.relative_to(out_dir).as_posix()
        if not p.is_file() or rel == MANIFEST or any(part.startswith(".") for part in Path(rel).parts):
            continue
        if rel in precomputed:
            entry = {"sha256": precomputed[rel]["sha256"], "bytes": p.stat().st_size,
                     "hash_of": precomputed[rel].get("hash_of", "file")}
        else:
            entry = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        files[rel] = entry
        seen[rel] = (stat_key(p), entry.get("hash_of", "file"), entry["sha256"])
    manifest = {
        "kind": kind,
        "schema": SCHEMAS[kind],
        "rdpp_version": __version__,
        "created": now_utc(),
        "config": _jsonable(config),
        "inputs": [input_ref(a, out_dir) for a in inputs],
        "files": files,
    }
    if summary:
        manifest["summary"] = _jsonable(summary)
    if (seq := claimed_sequence(out_dir)) is not None:
        manifest["sequence"] = seq  # the workspace's order of claims: what "newest" means, whatever the clock
    remember(out_dir, seen)
    atomic_write_json(out_dir / MANIFEST, manifest)
    return Artifact(out_dir, manifest)


def read_artifact(path: Path | str, kind: str | tuple[str, ...] | None = None) -> Artifact:
    """Open an artifact, checking that it is complete, of the expected kind and a known schema."""
    path = Path(path)
    mpath = path / MANIFEST
    kinds = (kind,) if isinstance(kind, str) else kind
    want = f"an artifact of kind {' or '.join(kinds)}" if kinds else "an rdpp artifact"
    if not path.exists():
        raise RdppError(f"{path} does not exist; expected {want}")
    if not path.is_dir():
        raise RdppError(f"{path} is a file; expected {want} (a directory with manifest.json)")
    if not mpath.exists():
        raise RdppError(
            f"{path} has no manifest.json: it is not {want}, or a stage writing it did not finish; "
            "rerun the stage that makes it"
        )
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RdppError(f"{mpath} is not valid JSON ({e}); rerun the stage that makes it") from None
    except OSError as e:
        raise RdppError(f"{mpath} cannot be read ({e.strerror or e}); check its permissions and disk") from None
    if not isinstance(manifest, dict) or "kind" not in manifest or "schema" not in manifest:
        raise RdppError(f"{mpath} is not an rdpp manifest (no kind/schema); expected {want}")
    if (damage := manifest_damage(manifest)) is not None:
        raise RdppError(f"{mpath}: {damage}; the manifest is damaged: restore it, or rerun the stage that makes "
                        "this artifact (into another --out)")
    if kinds and manifest["kind"] not in kinds:
        raise RdppError(f"{path} is a {manifest['kind']} artifact; expected {want}")
    kind_ = manifest["kind"]
    current = SCHEMAS.get(kind_)
    if current is None:
        raise RdppError(f"{mpath} is of unknown kind {kind_!r}; expected {want}")
    schema = manifest["schema"]
    if not isinstance(schema, int) or isinstance(schema, bool) or schema > current:
        raise RdppError(
            f"{mpath} has schema {schema}, newer than this rdpp ({__version__}) reads "
            f"(schema {current}); upgrade rdpp"
        )
    if schema < OLDEST_READ[kind_]:
        raise RdppError(f"{path} is an {kind_} artifact of schema {schema}, older than this rdpp reads (schema "
                        f"{OLDEST_READ[kind_]} to {current}); remake it with `{REMAKE[kind_]}`")
    return Artifact(path, manifest)


def _what(value: Any) -> str:
    """How a damaged manifest field is described: ``null``, ``a list``, ``the text 'x'``."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    return {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a mapping"}.get(
        type(value), type(value).__name__)


def _file_entry_damage(name: str, entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"files['{name}'] is {_what(entry)}, not a mapping of sha256 and bytes"
    if not isinstance(entry.get("sha256"), str):
        return f"files['{name}'].sha256 is {_what(entry.get('sha256'))}, not a hash"
    size = entry.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"files['{name}'].bytes is {_what(size)}, not a size"
    if not isinstance(entry.get("hash_of", "file"), str):
        return f"files['{name}'].hash_of is {_what(entry.get('hash_of'))}, not a text"
    if Path(name).is_absolute() or ".." in Path(name).parts or not name:
        return f"files lists {name!r}, which is not a file inside its folder"
    return None


def manifest_damage(manifest: dict) -> str | None:
    """What in a manifest's structure is not as rdpp writes it (``"config": null``, ``"inputs": "x"``,
    ``"files": []``, a file entry without its size), else None: readers use it without looking again."""
    shapes = {"kind": str, "config": dict, "inputs": list, "files": dict, "summary": dict, "created": str}
    names = {str: "a text", dict: "a mapping", list: "a list"}
    for key, shape in shapes.items():
        if key in manifest and not isinstance(manifest[key], shape):
            return f"'{key}' is {_what(manifest[key])}, not {names[shape]}"
    for k, entry in enumerate(manifest.get("inputs", [])):
        if not isinstance(entry, dict):
            return f"inputs[{k}] is {_what(entry)}, not a mapping"
        for key in ("kind", "name", "path", "manifest_sha256"):
            if key in entry and not isinstance(entry[key], str):
                return f"inputs[{k}].{key} is {_what(entry[key])}, not a text"
    for name, entry in manifest.get("files", {}).items():
        if (damage := _file_entry_damage(name, entry)) is not None:
            return damage
    return None


def is_complete(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if hasattr(obj, "value"):  # enums
        return obj.value
    return str(obj)
