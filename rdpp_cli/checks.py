"""Option checks every stage runs before it touches the disk: one clear line per absurd value.

Each helper raises ``RdppError("--name ... (got value); what to pass")`` and accepts ``None`` where
the option is optional (None means "not given"). Stages call them before claiming an output folder.
"""

from __future__ import annotations

import math

from rdpp_cli.errors import RdppError

MAX_SEED = 2**63 - 1
# ``--precision``'s values and default (rdpp_cli.precision runs them; here, torch-free, for the CLI)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "auto")
DEFAULT_PRECISION = "fp32"
# ``--fast`` (the training fast path, rdpp_cli/training/fast.py): its values and default
FAST_CHOICES = ("auto", "on", "off")
DEFAULT_FAST = "auto"
# ``--resident`` (features held in memory by the training loader, rdpp_cli/data/loader.py)
RESIDENT_CHOICES = ("auto", "off")


def at_least(name: str, value: int | float | None, low: int | float) -> None:
    """``value ≥ low`` (None passes)."""
    if value is not None and not value >= low:
        raise RdppError(f"{name} must be at least {low} (got {value})")


def seed(value: int | None, name: str = "--seed") -> None:
    """A seed is an integer in [0, 2**63): numpy's and torch's generators take no negative seed."""
    if value is not None and not 0 <= value <= MAX_SEED:
        raise RdppError(f"{name} must be an integer from 0 to 2**63-1 (got {value})")


def finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise RdppError(f"{name} must be a finite number (got {value})")


def learning_rate(value: float, name: str = "--lr") -> None:
    """Adam learning rates for these models lie around 1e-5..1e-2; above 1 every run diverges."""
    if not 0 < value <= 1:
        raise RdppError(f"{name} must be in (0, 1] (got {value:g}); captioning models train with 1e-5 to 1e-2 "
                        "(the paper: 4e-4 for XE)")


def one_of(name: str, value, choices, what: str | None = None) -> None:
    """``value`` is one of ``choices`` (None passes). ``what`` names the kind of value in the message
    ("a preset": ``--preset 'huge' is not a preset; use one of paper, small``)."""
    if value is None or value in choices:
        return
    if what is None:
        raise RdppError(f"{name} {value!r} is not one of: {', '.join(map(str, choices))}")
    raise RdppError(f"{name} {value!r} is not {what}; use one of {', '.join(map(str, choices))}")
