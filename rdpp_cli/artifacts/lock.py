"""The lock a run holds on the folder it writes, from the moment it claims it until it finishes.

``<folder>/.rdpp-lock`` holds ``{"pid", "host", "started", "command"}`` of the run writing the
folder, and that process holds an exclusive ``flock`` on it for as long as it runs: the kernel drops
the ``flock`` when the process ends, however it ends, so a folder whose lock file is not locked
was left by a run that died. Acquiring:

- the ``flock`` is held by another live process: refused with one line naming it;
- this process claimed it before and its stage failed without finishing: claimed afresh (stages
  run one at a time in a process);
- the file is there but unlocked, written on this host: its process is dead; taken over (a note);
- the file is there but unlocked, written on another host: that run may still be alive on a
  filesystem whose locks do not cross machines; refused, with the file to delete if it is dead.

``finish`` (``artifacts.workspace``) releases the lock once the manifest is written; a stage that
fails releases it through ``released_on_error`` (or ``release_all`` when a CLI command ends). Under torchrun only
rank 0 claims the folder, so only rank 0 holds the lock.

Choosing a new version folder is serialised by ``claiming``: a short-lived ``flock``ed claim file in
the group folder, one per run identity, held from looking at the existing versions until the chosen
folder is locked. Two identical commands started in the same instant thus see each other: the
second finds the first one's folder locked and is refused, instead of both taking a new version.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from rdpp_cli.errors import RdppError

try:  # POSIX; elsewhere the record alone decides (pid liveness on this host)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

LOCK = ".rdpp-lock"
CLAIM = ".rdpp-claim-"  # + a hash of the run's identity: in a group folder while a run picks its version

_held: dict[str, tuple[int, int]] = {}  # resolved folder -> (fd, inode of the lock file)


def _key(folder: Path) -> str:
    return str(Path(folder).resolve())


def _host() -> str:
    return socket.gethostname()


def _read(path: Path) -> dict:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OverflowError, ValueError):
        return False
    return True


def describe(rec: dict) -> str:
    """``pid 123 on host h since 2026-11-26 10:00:00 (rdpp train-xe)``."""
    since = str(rec.get("started", "?"))[:19].replace("T", " ")
    cmd = rec.get("command")
    return f"pid {rec.get('pid', '?')} on host {rec.get('host', '?')} since {since}" + (f" ({cmd})" if cmd else "")


def _busy(folder: Path, rec: dict) -> RdppError:
    return RdppError(f"{folder} is being written by another run ({describe(rec)}); wait for it to finish, "
                     "or stop it and rerun this command to resume")


def acquire(folder: Path | str) -> None:
    """Lock ``folder`` (which exists) for this process; RdppError when another run holds it."""
    folder = Path(folder)
    key = _key(folder)
    path = folder / LOCK
    if key in _held:  # claimed earlier by this process, whose stage then failed: stages run one at a time
        release(folder)
    fd = _open_locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB if fcntl is not None else 0)
    if fd is None:
        raise _busy(folder, _read(path))
    prev = _read(path)
    if prev:
        if prev.get("host") != _host():
            _release_fd(fd)
            raise RdppError(f"{folder} is locked by a run on another machine ({describe(prev)}); if that run is no "
                            f"longer running, delete {path} and rerun")
        pid = prev.get("pid")
        if fcntl is None and isinstance(pid, int) and pid != os.getpid() and _alive(pid):
            _release_fd(fd)
            raise _busy(folder, prev)
        from rdpp_cli.console import note

        note(f"taking over {folder}: the run that held it ({describe(prev)}) is no longer running")
    _write_record(fd)
    _held[key] = (fd, os.fstat(fd).st_ino)


def _write_record(fd: int) -> None:
    """This run's record (pid, host, start, command) into the lock file ``fd``."""
    rec = {"pid": os.getpid(), "host": _host(),
           "started": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join(["rdpp", *sys.argv[1:]]) if Path(sys.argv[0]).name in ("rdpp", "__main__.py") else None}
    data = (json.dumps(rec) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def beside(target: Path | str) -> Path:
    """The lock file of an output that is replaced whole by a rename and so cannot hold its lock
    inside (``rdpp export-hf``'s folder): ``<parent>/.<name>.rdpp-lock``."""
    target = Path(target)
    return target.parent / f".{target.name}{LOCK}"


@contextlib.contextmanager
def locked_beside(target: Path | str) -> Iterator[None]:
    """Hold ``beside(target)`` (an exclusive ``flock`` with this run's record) for the block, then
    remove it; RdppError naming the holder while another live run holds it. The kernel drops the
    ``flock`` of a process that dies, so a lock file left behind is taken over."""
    path = beside(target)
    fd = _open_locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB if fcntl is not None else 0)
    if fd is None:
        raise _busy(Path(target), _read(path))
    try:
        _write_record(fd)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        _release_fd(fd)


def _open_locked(path: Path, flags: int) -> int | None:
    """An fd of ``path`` (created if missing) holding ``flock(flags)``; None when ``LOCK_NB`` is in
    ``flags`` and another process holds it. Retries when the file was removed between the open and
    the flock (its holder finished), so the lock held is always on the file at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, flags)
            except OSError:  # BlockingIOError: a live process holds it
                os.close(fd)
                return None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextlib.contextmanager
def claiming(parent: Path | str, key: str) -> Iterator[None]:
    """Hold ``<parent>/.rdpp-claim-<key>`` (an exclusive ``flock``, waited for: a claim lasts
    milliseconds) for the block, then remove it. The kernel drops the flock of a process that dies
    holding it, so a claim never outlives its run."""
    path = Path(parent) / f"{CLAIM}{key}"
    fd = _open_locked(path, fcntl.LOCK_EX if fcntl is not None else 0)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # before unlocking: a waiter then finds its file gone and opens a fresh one
        _release_fd(fd)


def next_number(path: Path | str) -> int:
    """One more than the number in file ``path`` (1 when it is missing or unreadable), written back
    under an exclusive ``flock``: a counter that runs started together share without a race."""
    fd = _open_locked(Path(path), fcntl.LOCK_EX if fcntl is not None else 0)
    try:
        raw = os.read(fd, 64).decode("ascii", "replace").strip()
        n = int(raw) + 1 if raw.isdigit() else 1
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, f"{n}\n".encode())
        os.fsync(fd)
        return n
    finally:
        _release_fd(fd)


def _release_fd(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def holds(folder: Path | str) -> bool:
    """Whether this process holds the lock on ``folder``."""
    return _key(Path(folder)) in _held


def release(folder: Path | str) -> None:
    """Remove the lock file and drop the lock (no-op when this process does not hold it)."""
    folder = Path(folder)
    entry = _held.pop(_key(folder), None)
    if entry is None:
        return
    fd, ino = entry
    path = folder / LOCK
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_ino == ino:
            path.unlink()
    _release_fd(fd)


def held() -> frozenset[str]:
    """The folders this process holds locks on (resolved paths)."""
    return frozenset(_held)


def release_all(keep: frozenset[str] = frozenset()) -> None:
    """Drop every lock this process holds except those in ``keep`` (the CLI calls it when a command
    ends, however it ends, keeping the locks that were held before the command started)."""
    for key in list(_held):
        if key not in keep:
            release(Path(key))


@contextlib.contextmanager
def released_on_error(folder: Path | str) -> Iterator[None]:
    """Release ``folder``'s lock if the block raises, so that a later call in this process may resume it."""
    try:
        yield
    except BaseException:
        release(folder)
        raise
