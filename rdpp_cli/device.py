"""``--device``: which torch device a command runs on.

Shared by training and decoding, so that neither imports the other for it.
"""

from __future__ import annotations

import torch

from rdpp_cli.errors import RdppError


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``; RdppError when
    CUDA is asked for and there is none."""
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise RdppError(f"--device {device} was asked for but torch sees no CUDA GPU "
                            "(torch.cuda.is_available() is False); use --device cpu or --device auto")
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RdppError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible; "
                            "pick another index")
        return dev
    raise RdppError(f"--device {device} is not a device; use auto, cpu or cuda")
