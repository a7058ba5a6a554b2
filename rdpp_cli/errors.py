"""The one exception type for bad input.

Raise ``RdppError("what, where, what to do")`` anywhere; the CLI prints it as a single line
and exits with status 2. Never raise it after partially overwriting something on disk.
"""


class RdppError(Exception):
    """A user-facing error: one clear line, non-zero exit."""


# errno values that say the disk, not the input, stopped a write (no import of errno's names needed)
_FULL = {28, 122}  # ENOSPC, EDQUOT
_READ_ONLY = {30, 13, 1}  # EROFS, EACCES, EPERM


def file_failure(e: OSError, folder: str | None = None) -> RdppError:
    """The one line for an operating-system failure of a file operation (a full disk, a read-only
    file system, an I/O error): the file (``e.filename``, else ``folder``: the folder the stage was
    writing) and what to do. A failed stage leaves its folder unfinished; a rerun resumes it."""
    where = e.filename or folder or "a file of this stage"
    why = e.strerror or str(e) or type(e).__name__
    if e.errno in _FULL:
        return RdppError(f"no space left writing {where} ({why}); free space on its disk (or pass --out DIR on "
                         "another), then rerun the same command to resume")
    if e.errno in _READ_ONLY:
        return RdppError(f"{where} cannot be written ({why}); pass --out DIR, a folder you can write")
    return RdppError(f"{where}: {why}; check the disk and rerun the same command to resume (RDPP_DEBUG=1 shows "
                     "the traceback)")
