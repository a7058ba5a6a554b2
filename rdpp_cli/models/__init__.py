"""rdpp models: the captioner interface (base), the registry of models by name, Att2in and the
others, and their checkpoints."""

from rdpp_cli.models.att2in import PRESETS, Att2in, Att2inConfig, Encoded, config_from_preset
from rdpp_cli.models.base import CaptionModel, DropoutMasks, select_rows, sequence_logprobs
from rdpp_cli.models.checkpoint import load_checkpoint, load_model, model_from_checkpoint, save_checkpoint
from rdpp_cli.models.registry import MODELS, ModelSpec, model_spec

__all__ = [
    "PRESETS", "Att2in", "Att2inConfig", "Encoded", "config_from_preset", "sequence_logprobs",
    "CaptionModel", "DropoutMasks", "select_rows", "MODELS", "ModelSpec", "model_spec",
    "load_checkpoint", "load_model", "model_from_checkpoint", "save_checkpoint",
]
