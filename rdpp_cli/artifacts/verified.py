"""The content check on read: a file of an artifact is used only if its sha256 is the manifest's.

``Artifact.file(name)`` (every stage reads an artifact's files through it) checks the file's size,
then its content: the sha256 (or, for a large HDF5 file hashed while written, the row-block hash of
``artifacts.content_hash``) that the manifest records. Hashing a 90 GB ``features.h5`` on every run
would cost more than an epoch on a GPU, so a verified hash is remembered:

``<artifact>/.rdpp-verified.json`` maps a file name to the hash it was found to have and the file's
``(size, mtime_ns, inode)`` then. A file whose size, modification time and inode are unchanged is
the file that was hashed (an edit changes its mtime; a copy, its inode), and its remembered hash is
compared with the manifest; any other file is hashed again (with a progress bar) and remembered.
``write_manifest`` remembers every file it lists (it has just hashed them, or their writer did while
writing), so an artifact made on this filesystem is never hashed again at read time; a copied
workspace is hashed once per file on first use. The file is hidden, so no manifest lists it; in a
folder rdpp cannot write to nothing is remembered and every read hashes. ``rdpp verify`` always
hashes every file (and remembers what it finds); ``rdpp verify --quick`` only reads what is
remembered. docs/workspace.md, "Content checks on read".
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

VERIFIED = ".rdpp-verified.json"
_SEEN: dict[str, tuple[list[int], str, str]] = {}  # this process's verdicts: path -> (key, hash_of, sha256)
_BARS = [True]  # off while a caller shows its own progress bar (rich < 14 allows one live display)


@contextlib.contextmanager
def own_progress_bar():
    """While the caller shows a progress bar of its own (``rdpp verify``), hashing shows none."""
    _BARS.append(False)
    try:
        yield
    finally:
        _BARS.pop()


def stat_key(p: Path) -> list[int]:
    """What identifies one version of a file on disk: size, modification time (ns), inode and
    status-change time (ns). The ctime is what ``touch -r`` or ``os.utime`` cannot set back: an edit
    whose mtime was restored afterwards still changes it (git's index keeps it for the same reason)."""
    st = p.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def _load(folder: Path) -> dict:
    try:
        data = json.loads((folder / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remembered(folder: Path, name: str, key: list[int], hash_of: str) -> str | None:
    """The hash remembered for file ``name`` of ``folder`` when it still has ``key``, else None."""
    p = str(folder / name)
    seen = _SEEN.get(p)
    if seen is not None and seen[0] == key and seen[1] == hash_of:
        return seen[2]
    entry = _load(folder).get(name)
    if isinstance(entry, dict) and entry.get("key") == key and entry.get("hash_of") == hash_of:
        _SEEN[p] = (key, hash_of, str(entry.get("sha256")))
        return str(entry.get("sha256"))
    return None


def remember(folder: Path, found: dict[str, tuple[list[int], str, str]]) -> None:
    """Add ``{name: (key, hash_of, sha256)}`` to the folder's remembered hashes (atomically); a
    folder rdpp cannot write to keeps none."""
    from rdpp_cli.artifacts.files import atomic_write_json

    for name, (key, hash_of, sha) in found.items():
        _SEEN[str(folder / name)] = (key, hash_of, sha)
    data = _load(folder)
    data.update({name: {"key": key, "hash_of": hash_of, "sha256": sha} for name, (key, hash_of, sha) in found.items()})
    try:
        atomic_write_json(folder / VERIFIED, data, indent=None)
    except OSError:  # read-only folder or file system: check by hashing every time
        pass


def hash_now(p: Path, hash_of: str, label: str | None = None) -> str:
    """The file's hash as the manifest defines it (``hash_of``: ``file`` or an ``h5rows:`` spec),
    read from disk now; a progress bar for files over 256 MB (``label`` names it)."""
    import rdpp_cli.artifacts.content_hash as content_hash
    from rdpp_cli.artifacts.files import sha256_file
    from rdpp_cli.console import progress

    big = p.stat().st_size > (256 << 20)
    if hash_of == "file":
        if not big or not _BARS[-1]:
            return sha256_file(p)
        with progress("MB") as bar:
            task = bar.add_task(f"check {label or p.name}", total=p.stat().st_size >> 20, info="")
            return sha256_file(p, advance=lambda n: bar.advance(task, n / (1 << 20)))
    if not _BARS[-1]:
        return content_hash.recompute(p, hash_of)
    import h5py

    with h5py.File(p, "r") as f:
        rows = f[content_hash.parse(hash_of)[0][0]].shape[0]
    with progress("rows", transient=not big) as bar:
        task = bar.add_task(f"check {label or p.name}", total=rows, info="")
        return content_hash.recompute(p, hash_of, advance=lambda n: bar.advance(task, n))


def checked_hash(folder: Path, name: str, hash_of: str, *, rehash: bool = False) -> str:
    """The hash of file ``name`` of ``folder``: the remembered one when the file is unchanged on
    disk (unless ``rehash``), else hashed now and remembered."""
    p = folder / name
    key = stat_key(p)
    if not rehash:
        known = remembered(folder, name, key, hash_of)
        if known is not None:
            return known
    sha = hash_now(p, hash_of, label=f"{folder.name}/{name}")
    if stat_key(p) == key:  # not changed while it was read
        remember(folder, {name: (key, hash_of, sha)})
    return sha
