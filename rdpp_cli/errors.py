"""The one exception type for bad input.

Raise ``RdppError("what, where, what to do")`` anywhere; the CLI prints it as a single line
and exits with status 2. Never raise it after partially overwriting something on disk.
"""


class RdppError(Exception):
    """A user-facing error: one clear line, non-zero exit."""
