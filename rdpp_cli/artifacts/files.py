"""Files written whole or not at all, and their hashes: the writes every artifact uses.

``atomic_write`` (and its ``_bytes`` and ``_json`` forms) writes a temp file in the same folder,
fsyncs it and renames it over the target, so a reader sees the old file or the whole new one;
What was written is read back from the temp file before the rename (``LostWrite`` when the disk
holds other bytes than the writer passed: a write lost while reporting success); ``write_failure`` turns a failed write (a full disk, torch's stream errors) into an ``OSError``
naming the file; ``json_bytes`` refuses what is not strict JSON; ``sha256_file`` hashes a file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from rdpp_cli.artifacts.interrupt import uninterrupted
from rdpp_cli.errors import RdppError

_CHUNK = 1 << 20


def sha256_file(path: Path, advance: Callable[[int], None] | None = None) -> str:
    """sha256 of the file's bytes; ``advance(n)`` after each n bytes read (a progress bar)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
            if advance:
                advance(len(block))
    return h.hexdigest()


class LostWrite(OSError):
    """The file on disk is not what was written to it (a write reported done that never landed)."""


class _Hashing:
    """The file object a writer gets: what it writes is hashed on the way (``digest``), so that the
    file can be read back and compared. A writer that seeks back makes the stream hash meaningless
    (``sequential`` turns False) and its file is not compared."""

    def __init__(self, f: BinaryIO):
        self._f, self._h, self.size, self.sequential = f, hashlib.sha256(), 0, True

    def write(self, data) -> int:
        n = self._f.write(data)
        view = memoryview(data).cast("B")
        self._h.update(view if n is None else view[:n])
        self.size += len(view) if n is None else n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        if (whence, offset) not in ((0, self.size), (1, 0), (2, 0)):
            self.sequential = False
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def digest(self) -> str:
        return self._h.hexdigest()

    def __getattr__(self, name: str):
        return getattr(self._f, name)


def _read_back(tmp: str, written: _Hashing, path: Path) -> None:
    """LostWrite unless the temp file ``tmp`` holds exactly the bytes written to it."""
    if not written.sequential:
        return
    size = os.stat(tmp).st_size
    if size != written.size or sha256_file(Path(tmp)) != written.digest():
        got = f"{size:,} bytes" if size != written.size else "other bytes of the same size"
        raise LostWrite(5, f"read back after writing, the disk holds {got}, not the {written.size:,} bytes written (a "
                           "write was lost although it reported success); nothing was replaced", str(path))


def atomic_write(path: Path, write: Callable[[BinaryIO], None], durable: bool = True) -> None:
    """Call ``write(f)`` on a temp file in the same folder, fsync, read it back (``LostWrite`` unless
    the disk holds what was written), then rename it over ``path``: readers see the old file or the
    whole new one, never a half-written or a damaged one. Ctrl-C and SIGTERM wait for it to end
    (``artifacts.interrupt``). ``durable=False`` skips the fsync (the read-back stays): for many small
    files that a rerun makes again (the toy set's images), where an fsync each costs more than the
    file."""
    path = Path(path)
    with uninterrupted():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                hashing = _Hashing(f)
                write(hashing)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            _read_back(tmp, hashing, path)
            os.replace(tmp, path)
        except BaseException as e:
            failed = write_failure(e, path)  # before the temp file goes: the free space of the disk that failed
            Path(tmp).unlink(missing_ok=True)
            if failed is None:
                raise
            raise failed from e


# what torch.save raises when the file object under it fails (a full disk): a RuntimeError, no path
_TORCH_WRITE_FAILED = ("PytorchStreamWriter failed", "unexpected pos", "file write failed")


def write_failure(e: BaseException, path: Path, needed: int | None = None) -> OSError | None:
    """``e``, an error while writing ``path``, as an ``OSError`` naming ``path`` (what the stage wrapper
    prints as one line), with the free space left on its disk (and ``needed``, the bytes the file
    still needs, when the writer knows them); None for an error that is not a failed write (a bug,
    Ctrl-C), to be raised as it is."""
    if isinstance(e, OSError) and e.filename:
        return None  # names its file already
    if type(e).__name__ == "SafetensorError":  # safetensors' writer (save_pretrained): "... (os error 28)"
        code = re.search(r"os error (\d+)", str(e))
        errno = int(code.group(1)) if code else None
        why = os.strerror(errno) if errno else "safetensors could not write the whole file"
    elif isinstance(e, OSError):
        # HDF5 puts a many-line report in strerror: the errno says it in a few words
        errno, why = e.errno, os.strerror(e.errno) if e.errno else (str(e.strerror or e) or 'OSError').splitlines()[0]
    elif isinstance(e, RuntimeError) and any(t in str(e) for t in _TORCH_WRITE_FAILED):
        code = re.search(r"errno = (\d+)", str(e))  # HDF5's report of a failed flush (h5py raises RuntimeError)
        errno = int(code.group(1)) if code else None
        why = os.strerror(errno) if errno else "torch.save could not write the whole file"
    else:
        return None
    try:
        free = shutil.disk_usage(path.parent).free
        why += f"; {free / 2**20:,.1f} MiB free there"
    except OSError:
        free = None
    if needed:
        why += f", about {needed / 2**20:,.1f} MiB more needed"
    if errno is None and free is not None and free < 2**20:
        errno = 28  # torch says no more than "unexpected pos": a full disk, as the free space shows
    return OSError(errno, why, str(path))


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    atomic_write(path, lambda f: f.write(data), durable)


def figure_bytes(save: Callable[[BinaryIO], None]) -> bytes:
    """What ``save(buffer)`` writes (a matplotlib ``savefig``, a PIL ``Image.save``), to be written
    with ``atomic_write_bytes`` and read back like every file."""
    import io

    buf = io.BytesIO()
    save(buf)
    return buf.getvalue()


def _non_finite(obj: Any, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in ``obj`` (None when there is none)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "(top level)"
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for k, v in items:
        found = _non_finite(v, f"{where}.{k}" if where else str(k))
        if found:
            return found
    return None


def json_bytes(obj: Any, path: Path | str, indent: int | None = 2) -> bytes:
    """``obj`` as strict JSON (NaN and infinity are not JSON): RdppError naming the key otherwise."""
    try:
        text = json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False)
    except ValueError:
        raise RdppError(f"{path}: {_non_finite(obj)} is not a finite number and JSON cannot hold it; nothing was "
                        "written (a bug in rdpp: please report the command)") from None
    return (text + "\n").encode()


def atomic_write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as strict JSON (no NaN/Infinity), atomically."""
    atomic_write_bytes(path, json_bytes(obj, path, indent))


def cache_dir(name: str) -> Path:
    """rdpp's cache folder ``name`` (not created): ``$XDG_CACHE_HOME/rdpp/NAME``, else
    ``~/.cache/rdpp/NAME``; where the precision probe, compiled code and SPICE keep what they reuse."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rdpp" / name
