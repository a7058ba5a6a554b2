"""The captioners rdpp trains, by name: ``train-xe --model NAME``.

One line per model: its name (what the command line, manifests and ``rdpp ls`` say), its class and
config dataclass, and its presets (``--preset``: the model's sizes; ``paper`` is the published
setting, ``small`` one for CPUs and the bundled data). Checkpoints record the class name and the
config (``models.checkpoint``), so a checkpoint finds its class here. Adding a model: its file in
this folder with the ``CaptionModel`` interface (``models.base``), one line in ``MODELS``, its test
(CONTRIBUTING.md, "A new model").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch import nn

from rdpp_cli.errors import RdppError
from rdpp_cli.models.att2in import PRESETS as ATT2IN_PRESETS
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.models.updown import PRESETS as UPDOWN_PRESETS
from rdpp_cli.models.updown import UpDown, UpDownConfig
from rdpp_cli.models.transformer import PRESETS as TRANSFORMER_PRESETS
from rdpp_cli.models.transformer import Transformer, TransformerConfig
from rdpp_cli.models.hf import PRESETS as HF_PRESETS
from rdpp_cli.models.hf import HFCaptioner, HFCaptionerConfig


@dataclass(frozen=True)
class ModelSpec:
    """A model rdpp can build: ``cls(config_cls(**fields))``."""

    name: str  # the --model name
    cls: type[nn.Module]
    config_cls: type
    presets: dict[str, dict[str, Any]]
    title: str  # how tables and docs name it
    # the train-xe option naming the folder the model is read from (``cls.from_folder``), for a
    # pretrained model that is not built from a preset
    folder_option: str | None = None

    def config(self, preset: str, **fields: Any) -> Any:
        """The config of ``preset`` with ``fields`` (the data's sizes, overrides) set; a field the
        config does not have (e.g. ``fc_feat_size`` for a model that reads no fc features) is left out."""
        if preset not in self.presets:
            raise RdppError(f"--preset {preset!r} is not a preset of --model {self.name}; "
                            f"use one of {', '.join(self.presets)}")
        known = {f.name for f in dataclasses.fields(self.config_cls)}
        kw = {**self.presets[preset], **{k: v for k, v in fields.items() if v is not None}}
        return self.config_cls(**{k: v for k, v in kw.items() if k in known})

    def build(self, preset: str, **fields: Any) -> nn.Module:
        return self.cls(self.config(preset, **fields))


MODELS: dict[str, ModelSpec] = {
    "att2in": ModelSpec("att2in", Att2in, Att2inConfig, ATT2IN_PRESETS, "Att2in"),
    "updown": ModelSpec("updown", UpDown, UpDownConfig, UPDOWN_PRESETS, "UpDown"),
    "transformer": ModelSpec("transformer", Transformer, TransformerConfig, TRANSFORMER_PRESETS, "Transformer"),
    # read from a folder (``train-xe --hf-model DIR``: ``HFCaptioner.from_folder``), not built from a preset
    "hf": ModelSpec("hf", HFCaptioner, HFCaptionerConfig, HF_PRESETS, "HF captioner", folder_option="hf_model"),
}


def model_spec(name: str) -> ModelSpec:
    """The model called ``name``; RdppError naming the known ones otherwise."""
    if name not in MODELS:
        raise RdppError(f"--model {name!r} is not a model rdpp knows; use one of {', '.join(MODELS)}")
    return MODELS[name]


def spec_of_class(class_name: str) -> ModelSpec | None:
    """The model whose class is called ``class_name`` (what a checkpoint records), or None."""
    return next((s for s in MODELS.values() if s.cls.__name__ == class_name), None)


def model_name(model: nn.Module) -> str:
    """The registry name of ``model`` (DDP-unwrapped by the caller)."""
    spec = spec_of_class(type(model).__name__)
    if spec is None:
        raise ValueError(f"{type(model).__name__} is not a registered model (rdpp_cli.models.registry.MODELS)")
    return spec.name
