"""rdpp models: Att2in and its checkpoints."""

from rdpp_cli.models.att2in import PRESETS, Att2in, Att2inConfig, Encoded, config_from_preset, sequence_logprobs
from rdpp_cli.models.checkpoint import load_checkpoint, load_model, model_from_checkpoint, save_checkpoint

__all__ = [
    "PRESETS", "Att2in", "Att2inConfig", "Encoded", "config_from_preset", "sequence_logprobs",
    "load_checkpoint", "load_model", "model_from_checkpoint", "save_checkpoint",
]
