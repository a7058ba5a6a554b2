"""rdpp models: the captioner interface (``base``), the registry of models by name (``registry``,
torch-free), one file per model, and their checkpoints (``checkpoint``).

The names below are imported on first use, so ``import rdpp_cli.models.registry`` (the options and
``rdpp --help`` read it) loads no torch."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "CaptionModel": "base", "DropoutMasks": "base", "select_rows": "base", "sequence_logprobs": "base",
    "MODELS": "registry", "ModelSpec": "registry", "model_spec": "registry",
    "load_checkpoint": "checkpoint", "load_model": "checkpoint", "model_from_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'rdpp_cli.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rdpp_cli.models.{_WHERE[name]}"), name)
