"""Numeric precision of the model's arithmetic, as it runs: ``--precision fp32|tf32|bf16|fp16``.

The leaf of precision: autocast, the dtypes, the loss scaler, TensorFloat-32 and whether a device
computes bfloat16 natively. It imports torch and nothing of rdpp above the bottom layer, so decoding,
the training loop and a benchmark that want autocast load no model. ``--precision auto`` is resolved
by measuring a step of the run's own model: ``rdpp_cli.precision_probe``, a layer up, beside the models.

``bf16`` and ``fp16`` run the model under ``torch.autocast``: its matrix products (the linear
layers, the attention context) take bfloat16/float16 inputs and accumulate in float32, while
everything else stays float32 -- the weights and Adam's state (the "master" copy the optimizer
updates), the checkpoints, the LSTM cell state, the attention scores and their softmax, every
log-softmax and log-probability, and the rewards and metrics (CIDEr-D in float64 numpy, the DPP
algebra in float64). Backward runs each product in the precision its forward ran in. ``fp16``
scales the loss with a ``torch.amp.GradScaler`` (float16's range is too small for small gradients),
whose state is part of the resume state.

``tf32`` (CUDA only; refused on a CPU, which has no TensorFloat-32 arithmetic) keeps every tensor
float32 and lets the GPU's float32 matrix products and convolutions round their inputs to
TensorFloat-32 (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``),
switched on only while the run's forward and backward run (``autocast``, ``tf32_matmuls``) and
only when chosen: never by ``auto``, never silently.
"""

from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path

import torch

from rdpp_cli.checks import DEFAULT_PRECISION, PRECISIONS  # noqa: F401  (DEFAULT_PRECISION: for callers)
from rdpp_cli.errors import RdppError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
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
        return bool({"avx512_bf16", "amx_bf16", "bf16"} & _cpu_flags())  # x86 flags; Arm's "Features"
    return False


def check_precision(precision: str) -> None:
    """RdppError unless ``precision`` is one of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise RdppError(f"--precision {precision!r} is not a precision; use one of {', '.join(PRECISIONS)}")


def fixed_precision(precision: str, device: torch.device | str) -> str | None:
    """The precision a run on ``device`` uses for ``--precision precision`` where no measurement is
    needed: fp32, tf32, bf16 or fp16 as given (tf32 refused off CUDA); for ``auto``, fp32 on a device
    that lists no bf16 arithmetic (``native_bf16``: bf16 would be converted to float32, never faster)
    or is neither a CPU nor a CUDA GPU. None: ``auto`` must measure (``rdpp_cli.precision_probe``)."""
    check_precision(precision)
    device = torch.device(device)
    if precision == "tf32" and device.type != "cuda":
        raise RdppError(f"--precision tf32 is a CUDA GPU's TensorFloat-32 matrix arithmetic; on {device.type} use "
                        "fp32 (the same numbers tf32 would give there)")
    if precision != "auto":
        return precision
    if device.type not in ("cpu", "cuda"):
        return "fp32"
    if device.type == "cpu" and _cpu_flags() and not native_bf16("cpu"):
        return "fp32"
    if device.type == "cuda" and not native_bf16(device):
        return "fp32"
    return None


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context to run the model's forward in (nothing for fp32; TensorFloat-32 matrix products
    for tf32). ``precision`` is resolved."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "tf32":
        return tf32_matmuls(precision)
    return torch.autocast(device_type=torch.device(device).type, dtype=_DTYPES[precision])


@contextlib.contextmanager
def tf32_matmuls(precision: str):
    """With ``precision`` tf32: float32 matrix products and convolutions in TensorFloat-32 inside the
    block, the previous settings restored after it; otherwise nothing."""
    if precision != "tf32":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def full_precision(device: torch.device | str) -> contextlib.AbstractContextManager:
    """A context in which autocast is off (the rewards are computed in it)."""
    return torch.autocast(device_type=torch.device(device).type, enabled=False)


def grad_scaler(precision: str, device: torch.device | str) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 (None otherwise): bf16 has float32's range and needs none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)
