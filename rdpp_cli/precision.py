"""Numeric precision of the model's arithmetic: ``--precision fp32|bf16|fp16|auto``.

``bf16`` and ``fp16`` run the model under ``torch.autocast``: its matrix products (the linear
layers, the attention context) take bfloat16/float16 inputs and accumulate in float32, while
everything else stays float32 -- the weights and Adam's state (the "master" copy the optimizer
updates), the checkpoints, the LSTM cell state, the attention scores and their softmax, every
log-softmax and log-probability, and the rewards and metrics (CIDEr-D in float64 numpy, the DPP
algebra in float64). Backward runs each product in the precision its forward ran in. ``fp16``
scales the loss with a ``torch.amp.GradScaler`` (float16's range is too small for small gradients),
whose state is part of the resume state. ``auto`` is bf16 where the hardware computes it natively
(a CPU with AVX-512 BF16 or AMX, a CUDA GPU of compute capability 8.0 or more) and fp32 elsewhere;
fp16 is never chosen by ``auto`` (on a CPU without float16 matrix units it is ~13x slower than
fp32). docs/training.md ("Precision") has the measurements behind the default.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path

import torch

from rdpp_cli.checks import DEFAULT_PRECISION, PRECISIONS
from rdpp_cli.errors import RdppError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` computes bfloat16 matrix products natively (not by conversion)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu":
        return bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
    return False


def check_precision(precision: str) -> None:
    """RdppError unless ``precision`` is one of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise RdppError(f"--precision {precision!r} is not a precision; use one of {', '.join(PRECISIONS)}")


def resolve_precision(precision: str, device: torch.device | str) -> str:
    """The precision a run on ``device`` uses for ``--precision precision``: fp32, bf16 or fp16."""
    check_precision(precision)
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context to run the model's forward in (nothing for fp32). ``precision`` is resolved."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=_DTYPES[precision])


def full_precision(device: torch.device | str) -> contextlib.AbstractContextManager:
    """A context in which autocast is off (the rewards are computed in it)."""
    return torch.autocast(device_type=torch.device(device).type, enabled=False)


def grad_scaler(precision: str, device: torch.device | str) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 (None otherwise): bf16 has float32's range and needs none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)
