"""The captioners rdpp trains, by name: ``train-xe --model NAME``. One line per model.

A line (``ModelSpec``) says everything the rest of rdpp needs to know about a model without
importing it: its name (what the command line, manifests and ``rdpp ls`` say), its class and config
dataclass as ``"module:Name"`` strings (imported on first use, as ``training/reward_table.py`` names
its functions, so the options and ``rdpp --help`` read this table without torch), how tables and
help texts name it, its sizes per ``--preset`` (``paper``: the published ones; ``small``: a CPU
size for the bundled data) and its training recipes per stage and preset (``train-xe`` and
``finetune``, each ``paper`` and ``small``: the defaults of the loop's settings, which a value
given explicitly wins over; docs/training.md, "The published recipes", gives each setting's source).

Checkpoints record the class name and the config (``models.checkpoint``), so a checkpoint finds its
line here by ``class_name``. Adding a model: its file in this folder with the ``CaptionModel``
interface (``models.base``), one line in ``MODELS``, its test (CONTRIBUTING.md, "A new model").
No torch in this module.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any

from rdpp_cli.errors import RdppError

STAGES = ("train-xe", "finetune")
PRESETS = ("paper", "small")
DEFAULT_MODEL = "att2in"


def _load(path: str) -> Any:
    """The object ``"module:Name"`` names."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class ModelSpec:
    """A model rdpp can build: ``cls(config_cls(**fields))``, with ``cls`` = the object ``model`` names."""

    name: str  # the --model name
    model: str  # "module:Class" of the nn.Module (the CaptionModel interface)
    config_class: str  # "module:Class" of its config dataclass (saved in checkpoints)
    title: str  # how tables, help texts and docs name it
    cite: str  # the paper it follows, for --model's help
    sizes: dict[str, dict[str, Any]]  # --preset -> config fields
    recipes: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)  # stage -> preset -> settings
    # the device types where `--fast auto` turns the fast path on: measured there faster than the eager
    # step and equal to it (docs/training.md, "The fast path"; benchmarks/cuda_check.sh measures it)
    fast_auto: tuple[str, ...] = ()
    # the train-xe option naming the folder the model is read from (``cls.from_folder``), for a
    # pretrained model that is not built from sizes
    folder_option: str | None = None

    @property
    def class_name(self) -> str:
        """The class's name, as checkpoints record it (no import)."""
        return self.model.split(":")[1]

    @property
    def cls(self) -> Any:
        return _load(self.model)

    @property
    def config_cls(self) -> type:
        return _load(self.config_class)

    def recipe(self, stage: str, preset: str) -> dict[str, Any]:
        """The loop settings of ``preset``'s recipe for ``stage`` (a copy)."""
        if preset not in self.recipes.get(stage, {}):
            raise RdppError(f"--preset {preset!r} is not a {stage} recipe of --model {self.name}; "
                            f"use one of {', '.join(self.recipes.get(stage, {}))}")
        return dict(self.recipes[stage][preset])

    def config(self, preset: str, **fields: Any) -> Any:
        """The config of ``preset`` with ``fields`` (the data's sizes, overrides) set; a field the
        config does not have (e.g. ``fc_feat_size`` for a model that reads no fc features) is left out."""
        if preset not in self.sizes:
            raise RdppError(f"--preset {preset!r} is not a preset of --model {self.name}; "
                            f"use one of {', '.join(self.sizes)}")
        config_cls = self.config_cls
        known = {f.name for f in dataclasses.fields(config_cls)}
        kw = {**self.sizes[preset], **{k: v for k, v in fields.items() if v is not None}}
        return config_cls(**{k: v for k, v in kw.items() if k in known})

    def build(self, preset: str, **fields: Any) -> Any:
        """The model at ``preset``'s sizes with ``fields`` set (its weights drawn from torch's global
        random state)."""
        return self.cls(self.config(preset, **fields))


# -- the recipes' shared parts (docs/training.md, "The published recipes", says where each comes from) --
# train-xe `small`: the bundled data on a CPU. finetune `small`: 6 epochs at batch 50 without decay; its lr per
# model is the one of 3e-5, 1e-4 and 3e-4 whose R-DPP m=5 run reached the best val CIDEr-D from the model's XE
# model on the bundled data (`bash examples/sweep.sh models-lr`; docs/experiments.md, "Across models").
_XE_SMALL = {"epochs": 30, "batch_size": 50, "lr": 4e-4, "lr_decay_every": 3, "lr_decay_rate": 0.8, "ss_start": -1,
             "lr_schedule": "step", "warmup": 0, "adam_beta2": 0.999, "adam_eps": 1e-8}
_NOAM = {"lr": 1.0, "lr_schedule": "noam", "adam_beta2": 0.98, "adam_eps": 1e-9}
_FT_SMALL = {"epochs": 6, "batch_size": 50, "lr": 1e-4, "lr_decay_every": 0, "lr_decay_rate": 0.8,
             "lr_schedule": "step"}

MODELS: dict[str, ModelSpec] = {s.name: s for s in (
    # run_att.sh / train_dpp.sh of the R-DPP authors' code (self-critical.pytorch's Att2in2)
    ModelSpec("att2in", "rdpp_cli.models.att2in:Att2in", "rdpp_cli.models.att2in:Att2inConfig", "Att2in",
              "Rennie et al. 2017",
              sizes={"paper": dict(input_encoding_size=512, rnn_size=512, att_hid_size=512, drop_prob_lm=0.5),
                     "small": dict(input_encoding_size=256, rnn_size=256, att_hid_size=256, drop_prob_lm=0.3)},
              recipes={"train-xe": {"paper": {**_XE_SMALL, "batch_size": 128, "lr": 5e-4, "lr_decay_every": 15,
                                              "ss_start": 0},
                                    "small": _XE_SMALL},
                       "finetune": {"paper": {"epochs": 100, "batch_size": 128, "lr": 5e-4, "lr_decay_every": 15,
                                              "lr_decay_rate": 0.8, "lr_schedule": "step"},
                                    "small": _FT_SMALL}},
              # on CUDA: benchmarks/README.md, "GPU figures", has the measurement behind it
              fast_auto=("cuda",)),
    # self-critical.pytorch configs/updown/updown.yml and updown_sc.yml
    ModelSpec("updown", "rdpp_cli.models.updown:UpDown", "rdpp_cli.models.updown:UpDownConfig", "UpDown",
              "Anderson et al. 2018",
              sizes={"paper": dict(input_encoding_size=1000, rnn_size=1000, att_hid_size=512, drop_prob_lm=0.5),
                     "small": dict(input_encoding_size=256, rnn_size=256, att_hid_size=256, drop_prob_lm=0.3)},
              recipes={"train-xe": {"paper": {**_XE_SMALL, "batch_size": 10, "lr": 5e-4, "ss_start": 0},
                                    "small": _XE_SMALL},
                       "finetune": {"paper": {"epochs": 20, "batch_size": 10, "lr": 5e-5, "lr_decay_every": 0,
                                              "lr_decay_rate": 0.8, "lr_schedule": "step"},
                                    "small": {**_FT_SMALL, "lr": 3e-5}}}),
    # self-critical.pytorch configs/transformer/transformer.yml and transformer_sc.yml
    ModelSpec("transformer", "rdpp_cli.models.transformer:Transformer",
              "rdpp_cli.models.transformer:TransformerConfig", "Transformer", "Vaswani et al. 2017",
              sizes={"paper": dict(N_enc=6, N_dec=6, d_model=512, d_ff=2048, num_att_heads=8, dropout=0.1,
                                   drop_prob_lm=0.5),
                     "small": dict(N_enc=2, N_dec=2, d_model=128, d_ff=512, num_att_heads=4, dropout=0.1,
                                   drop_prob_lm=0.1)},
              recipes={"train-xe": {"paper": {**_XE_SMALL, **_NOAM, "epochs": 15, "batch_size": 10, "warmup": 20000},
                                    "small": {**_XE_SMALL, **_NOAM, "warmup": 400}},
                       "finetune": {"paper": {"epochs": 35, "batch_size": 10, "lr": 1e-5, "lr_decay_every": 0,
                                              "lr_decay_rate": 0.8, "lr_schedule": "plateau"},
                                    "small": {**_FT_SMALL, "lr": 3e-4}}}),
    # a pretrained Hugging Face VisionEncoderDecoderModel (ViT-GPT2 style), read from a folder
    # (``train-xe --model hf --hf-model DIR``: ``HFCaptioner.from_folder``), not built from sizes. No
    # published R-DPP recipe exists for it: rdpp continues a pretrained decoder with a small learning rate
    # and few epochs, the usual practice for fine-tuning a pretrained GPT-2 (docs/training.md)
    ModelSpec("hf", "rdpp_cli.models.hf:HFCaptioner", "rdpp_cli.models.hf:HFCaptionerConfig", "HF captioner",
              "a pretrained Hugging Face VisionEncoderDecoderModel, --hf-model DIR",
              sizes={"paper": {}, "small": {}},
              recipes={"train-xe": {p: {**_XE_SMALL, "epochs": 3, "batch_size": 16, "lr": 2e-5, "lr_decay_every": 0}
                                    for p in PRESETS},
                       "finetune": {p: {**_FT_SMALL, "batch_size": 16, "lr": 1e-5} for p in PRESETS}},
              folder_option="hf_model"),
)}


def model_spec(name: str) -> ModelSpec:
    """The model called ``name``; RdppError naming the known ones otherwise."""
    if name not in MODELS:
        raise RdppError(f"--model {name!r} is not a model rdpp knows; use one of {', '.join(MODELS)}")
    return MODELS[name]


def spec_of_class(class_name: str) -> ModelSpec | None:
    """The model whose class is called ``class_name`` (what a checkpoint records), or None."""
    return next((s for s in MODELS.values() if s.class_name == class_name), None)


def model_name(model: Any) -> str:
    """The registry name of ``model`` (DDP-unwrapped by the caller)."""
    spec = spec_of_class(type(model).__name__)
    if spec is None:
        raise ValueError(f"{type(model).__name__} is not a registered model (rdpp_cli.models.registry.MODELS)")
    return spec.name


def build(name: str, preset: str, **fields: Any) -> Any:
    """``--model name`` at ``--preset preset``'s sizes with ``fields`` (the data's sizes) set."""
    return model_spec(name).build(preset, **fields)


def models_help() -> str:
    """``--model``'s choices with their papers, for help texts."""
    return ", ".join(f"{s.name} ({s.title}, {s.cite})" for s in MODELS.values())
