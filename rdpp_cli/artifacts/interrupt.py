"""SIGINT and SIGTERM during a stage: an exception at a safe point, never inside a file write.

``stopping_on_signals`` (the CLI's stage wrapper, ``cli.common.stage``) makes both signals raise
``Interrupted`` (a ``KeyboardInterrupt``) in the main thread, so the stage unwinds: its lock is
released and its unfinished folder stays resumable. The exception carries where the stage was when
the signal came (``where()``, asked before anything unwinds). Inside ``uninterrupted`` (every atomic write,
``manifest.atomic_write``) a signal is held and raised when the block ends: ``torch.save`` writes
through Python callbacks from C++, which would turn the exception into a RuntimeError mid-file.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; ``exit_code`` is the shell's 128 + its number (130, 143),
    ``position`` where it was (``"at epoch 2, step 37"``) when known."""

    def __init__(self, signum: int, position: str | None = None):
        super().__init__(signum)
        self.exit_code = 128 + signum
        self.position = position


_held = 0  # depth of ``uninterrupted`` blocks in the main thread
_pending: int | None = None  # a signal that arrived inside one
_where: Callable[[], str | None] = lambda: None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _stop(signum: int, frame) -> None:
    global _pending
    if _held:
        _pending = signum
        return
    raise Interrupted(signum, _where())


@contextlib.contextmanager
def stopping_on_signals(where: Callable[[], str | None] = lambda: None) -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` for the block, with ``where()`` as its position
    (outside the main thread: no change)."""
    global _pending, _where
    if not _main_thread():
        yield
        return
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    _where = where
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _pending, _where = None, lambda: None


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends (main thread; elsewhere signals never arrive)."""
    global _held, _pending
    if not _main_thread():
        yield
        return
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending is not None:
            signum, _pending = _pending, None
            raise Interrupted(signum, _where())
