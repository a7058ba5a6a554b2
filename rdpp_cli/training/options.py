"""The options of `rdpp train-xe` and `rdpp finetune`, declared once (rdpp_cli.options).

``TrainLoopOptions`` holds what the two stages share, the training loop's settings
(rdpp_cli.training.loop reads them); ``XEOptions`` and ``FinetuneOptions`` add each stage's own. From
these classes come the commands (``--help`` shows the loop's options in a panel of their own), the
keys of ``--config`` and of ``<workspace>/rdpp.yaml``, the arguments of ``train_xe`` and
``finetune``, the settings a rerun must share to resume (``identity``) and the manifest's config
(``recorded``). No torch here: ``rdpp --help`` builds the commands from these classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rdpp_cli.checks import DEFAULT_FAST, FAST_CHOICES
from rdpp_cli.errors import RdppError
from rdpp_cli.options import (Options, all_of, argument, at_least, device_option, finite, force_option,
                              learning_rate, one_of, option, out_option, precision_option, workspace_option)
from rdpp_cli.options import seed as seed_check
from rdpp_cli.training.reward_table import REWARDS as REWARD_TABLE

LOOP_CLI = {"rich_help_panel": "Training loop"}  # --help shows the loop's options in a panel of their own
GRAD_CLIP_MODES = ("value", "norm")  # self-critical.pytorch's clamp of every entry, or the global L2 norm

# `train-xe --model`: the names of rdpp_cli.models.registry.MODELS, and `--preset`: each model's sizes
# (its PRESETS); spelled out here because the options load without torch (a test keeps them equal)
MODEL_NAMES = ("att2in", "updown", "transformer", "hf")
MODEL_PRESETS = ("paper", "small")
LR_SCHEDULES = ("step", "noam")

# `train-xe --preset`'s recipe per model: the defaults of the loop's settings that a value given wins
# over (docs/training.md, "The published recipes", says where each comes from). `small`: the bundled
# data on a CPU. `paper`: att2in as the authors' R-DPP XE pre-training (run_att.sh: batch 128, lr 5e-4
# x0.8 every 15 epochs from the start, scheduled sampling from epoch 0, 30 epochs); updown and
# transformer as self-critical.pytorch's updown.yml and transformer.yml (with its option defaults:
# decay x0.8 every 3 epochs; the transformer's Noam schedule with 20,000 warm-up steps, Adam
# betas (0.9, 0.98), eps 1e-9, 15 epochs).
_SMALL = {"epochs": 30, "batch_size": 50, "lr": 4e-4, "lr_decay_every": 3, "lr_decay_rate": 0.8, "ss_start": -1,
          "lr_schedule": "step", "warmup": 0, "adam_beta2": 0.999, "adam_eps": 1e-8}
XE_RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    "att2in": {"paper": {**_SMALL, "batch_size": 128, "lr": 5e-4, "lr_decay_every": 15, "ss_start": 0},
               "small": _SMALL},
    "updown": {"paper": {**_SMALL, "batch_size": 10, "lr": 5e-4, "ss_start": 0}, "small": _SMALL},
    "transformer": {"paper": {**_SMALL, "epochs": 15, "batch_size": 10, "lr": 1.0, "lr_schedule": "noam",
                              "warmup": 20000, "adam_beta2": 0.98, "adam_eps": 1e-9},
                    "small": {**_SMALL, "lr": 1.0, "lr_schedule": "noam", "warmup": 400, "adam_beta2": 0.98,
                              "adam_eps": 1e-9}},
    # a pretrained captioner continued with XE: a small learning rate, few epochs (both presets)
    "hf": {p: {**_SMALL, "epochs": 3, "batch_size": 16, "lr": 2e-5, "lr_decay_every": 0} for p in MODEL_PRESETS},
}

REWARDS = tuple(REWARD_TABLE)
BASELINES = ("none", "mean")
SAMPLE_MODES = ("train", "eval")
CHECKPOINTS = ("best", "last")
# `finetune --preset`: defaults of the optimisation settings (docs/rewards.md says where each comes from)
FINETUNE_PRESETS: dict[str, dict[str, Any]] = {
    # tuned on the bundled synthetic set (docs/experiments.md): 6 epochs from `train-xe --preset small`
    "toy": {"epochs": 6, "batch_size": 50, "lr": 1e-4, "lr_decay_every": 0, "lr_decay_rate": 0.8},
    # the authors' COCO run: train_dpp.sh (lr 5e-4, batch 128, decay x0.8 every 15 epochs from the
    # start) and the paper's 100 fine-tuning epochs (Sec. 4)
    "paper": {"epochs": 100, "batch_size": 128, "lr": 5e-4, "lr_decay_every": 15, "lr_decay_rate": 0.8},
}


def _probability(flag: str, value: float | None) -> None:
    if value is not None and not 0 <= value <= 1:
        raise RdppError(f"{flag} must be in [0, 1] (got {value})")


def _decay_rate(flag: str, value: float | None) -> None:
    if value is not None and not 0 < value <= 1:
        raise RdppError(f"{flag} must be in (0, 1] (got {value})")


def loop_option(default: Any, help: str, *flags: str, **kw: Any) -> Any:
    """An option of the training loop, shown in ``--help``'s "Training loop" panel."""
    return option(default, help, *flags, cli=LOOP_CLI, **kw)


@dataclass
class TrainLoopOptions(Options):
    """The training loop's settings, shared by `rdpp train-xe` and `rdpp finetune`."""

    epochs: int = loop_option(30, "Passes over the training images.", check=at_least(1))
    batch_size: int = loop_option(50, "Images per optimizer step, all processes together.", check=at_least(1))
    lr: float = loop_option(4e-4, "Adam learning rate.", check=learning_rate)
    grad_clip: float = loop_option(0.1, "Gradient clipping threshold (0 = off).", check=all_of(finite, at_least(0)))
    grad_clip_mode: str = loop_option(
        "value", "value: clamp each gradient entry (self-critical.pytorch); norm: global L2.",
        check=one_of(*GRAD_CLIP_MODES, what="a clipping mode"))
    lr_decay_every: int = loop_option(3, "Multiply the LR by --lr-decay-rate every k epochs (0 = never).",
                                      check=at_least(0))
    lr_decay_rate: float = loop_option(0.8, "LR decay factor, in (0, 1].", check=_decay_rate)
    val_images: int | None = loop_option(
        None, "Validate on the first N val images (default: all; 0 = no validation).", check=at_least(0))
    val_batch_size: int = loop_option(100, "Images per validation decoding batch.", check=at_least(1))
    save_every_steps: int = loop_option(
        0, "Also save last.pt and the resume state every K steps (0 = per epoch).", identity=False, check=at_least(0))
    seed: int = loop_option(123, "Seed of everything random in the run: initial weights, batch order, sampling, "
                            "dropout.", check=seed_check)
    device: str = device_option(cli=LOOP_CLI)
    precision: str = precision_option(cli=LOOP_CLI)
    fast: str = loop_option(
        DEFAULT_FAST, "The fast path for GPUs: the teacher-forced pass compiled at fixed shapes with dropout drawn "
        "before it, the reward on the model's device, fused Adam, the loss read every few steps; the same numbers "
        "(docs/training.md). auto: on where measured faster and equal (so far nowhere), on, off.",
        identity=False, check=one_of(*FAST_CHOICES, what="a --fast setting"))
    workers: int = loop_option(0, "Threads reading the next batches while a step runs (0: read in the loop; "
                               "docs/data.md).", identity=False, check=at_least(0))
    resume: bool = loop_option(True, "Continue an unfinished run with the same settings, or start it over.",
                               "--resume/--no-resume", identity=False, record=False)

    seq_per_img: ClassVar[int] = 5  # captions per image in a batch: an option of train-xe, finetune's follows its reward
    lr_schedule: ClassVar[str] = "step"  # train-xe's option; finetune decays by steps of epochs
    warmup: ClassVar[int] = 0
    adam_beta2: ClassVar[float] = 0.999
    adam_eps: ClassVar[float] = 1e-8


def _from_preset(name: str) -> Any:
    """The loop's option ``name``, left unset (None) for finetune's ``--preset`` to fill."""
    f = TrainLoopOptions.__dataclass_fields__[name]
    help_ = f.metadata["help"].removesuffix(".") + " (default: the preset's)."
    return loop_option(None, help_, check=f.metadata["check"])


@dataclass
class XEOptions(TrainLoopOptions):
    """`rdpp train-xe`. The loop settings left unset (None) take the values of ``preset``'s recipe
    for ``model`` (``XE_RECIPES``; ``with_preset``)."""

    section = "train_xe"

    data: str | None = option(
        None, "Data artifact folder, or its name in the workspace (default: the newest). --from is the same "
        "option: a run's parent is its data (docs/workspace.md).", "--data", "--from", identity=False, positional=True)
    model: str = option("att2in", "Captioner: att2in (Rennie et al. 2017), updown (Anderson et al. 2018), "
                        "transformer, or hf (a pretrained Hugging Face captioner, --hf-model; docs/model.md).",
                        check=one_of(*MODEL_NAMES, what="a model"))
    hf_model: str | None = option(
        None, "--model hf: the local save_pretrained folder of a Hugging Face VisionEncoderDecoderModel (ViT-GPT2 "
        "style) to continue; its weights, config and tokenizer go into the checkpoints.")
    preset: str = option("paper", "Model size and training recipe: paper (the published ones of --model) or small "
                         "(CPU, the bundled data); options given explicitly win.",
                         check=one_of(*MODEL_PRESETS, what="a preset"))
    init_from: str | None = option(
        None, "Start from this model artifact's best.pt (or a .pt file); same vocabulary.", identity=False)
    seq_per_img: int = loop_option(5, "Captions per image in a batch.", check=at_least(1))
    epochs: int | None = _from_preset("epochs")
    batch_size: int | None = _from_preset("batch_size")
    lr: float | None = _from_preset("lr")
    lr_decay_every: int | None = _from_preset("lr_decay_every")
    lr_decay_rate: float | None = _from_preset("lr_decay_rate")
    ss_start: int | None = loop_option(
        None, "Scheduled sampling after this epoch: each input word is, with probability ss, the model's own "
        "sample (-1 = off; default: the preset's).", check=at_least(-1))
    ss_every: int = loop_option(5, "Scheduled sampling: ss grows every k epochs.", check=at_least(1))
    ss_step: float = loop_option(0.05, "Scheduled sampling: how much ss grows each time.", check=all_of(finite, at_least(0)))
    ss_max: float = loop_option(0.25, "Scheduled sampling: the largest ss.", check=_probability)
    label_smoothing: float = loop_option(0.0, "Label smoothing of the XE loss (0 = off).", check=_probability)
    lr_schedule: str | None = loop_option(
        None, "step: x --lr-decay-rate every --lr-decay-every epochs; noam: --lr x d_model^-0.5 x min(s^-0.5, "
        "s x warmup^-1.5) at step s (the transformer's). Default: the preset's.",
        check=one_of(*LR_SCHEDULES, what="an LR schedule"))
    warmup: int | None = loop_option(None, "Noam schedule: warm-up steps (default: the preset's).", check=at_least(0))
    adam_beta2: float | None = loop_option(None, "Adam's beta2 (default: the preset's).", check=_probability)
    adam_eps: float | None = loop_option(None, "Adam's eps (default: the preset's).", check=all_of(finite, at_least(0)))
    out: Path | None = out_option("a new version <workspace>/xe/<model>-<preset>-v<k>")
    force: bool = force_option()
    workspace: Path | None = workspace_option()

    def with_preset(self) -> "XEOptions":
        """These options with the recipe's values where none was given."""
        recipe = XE_RECIPES[self.model][self.preset]
        return self.replace(**{k: v for k, v in recipe.items() if getattr(self, k) is None})

    # settings at these values change nothing in today's att2in run: left out of the identity (and so of
    # the manifest's config), so that a run from before they existed still resumes
    NEUTRAL: ClassVar[dict[str, Any]] = {"model": "att2in", "hf_model": None, "ss_start": -1, "label_smoothing": 0.0,
                                         "lr_schedule": "step", "warmup": 0, "adam_beta2": 0.999, "adam_eps": 1e-8}
    SS_SETTINGS: ClassVar[tuple[str, ...]] = ("ss_every", "ss_step", "ss_max")

    def identity(self) -> dict[str, Any]:
        ident = super().identity()
        neutral = {k for k, v in self.NEUTRAL.items() if ident.get(k, v) == v}
        if "ss_start" in neutral:  # the schedule's shape matters only when it runs
            neutral |= set(self.SS_SETTINGS)
        if ident.get("lr_schedule", "step") == "step":
            neutral.add("warmup")
        return {k: v for k, v in ident.items() if k not in neutral}

    def recorded(self) -> dict[str, Any]:
        ident, rec = super().identity(), super().recorded()
        dropped = set(ident) - set(self.identity())
        return {k: v for k, v in rec.items() if k not in dropped}

    @property
    def scheduled_sampling(self) -> bool:
        """Whether scheduled sampling runs at all (``ss_start`` set and not -1)."""
        return self.ss_start is not None and self.ss_start >= 0

    def ss_prob(self, epoch: int) -> float:
        """The scheduled-sampling probability of 0-based ``epoch``, as self-critical.pytorch's
        train.py sets it: ``min(ss_step x ((epoch - ss_start) // ss_every), ss_max)`` after
        ``ss_start`` (0 before it, and when ``ss_start`` is -1)."""
        if not self.scheduled_sampling or epoch <= self.ss_start:
            return 0.0
        return min(self.ss_step * ((epoch - self.ss_start) // self.ss_every), self.ss_max)


@dataclass
class FinetuneOptions(TrainLoopOptions):
    """`rdpp finetune`. ``epochs``, ``batch_size``, ``lr``, ``lr_decay_every`` and ``lr_decay_rate``
    not given (None) take the values of ``preset`` (``with_preset``)."""

    section = "finetune"

    model: str | None = argument(
        "XE model artifact folder, or its name in the workspace (default: the newest XE model).", from_alias=True)
    data: str | None = option(
        None, "Data artifact (default: the one the XE model was trained on; another is refused).", identity=False)
    reward: str = option("dpp", ", ".join(f"{r.name} ({r.help})" for r in REWARD_TABLE.values()) + ".",
                         check=one_of(*REWARDS, what="a reward"))
    m: int = option(5, "Captions sampled per image each step (R-DPP: the DPP's set size). Under torchrun write "
                    "--samples: torchrun reads --m as an abbreviation of its own options.", "--m", "--samples",
                    check=at_least(1))
    baseline: str = option("none", "R-DPP only: none (as the published code) or mean (w minus its mean over the m "
                           "samples).", check=one_of(*BASELINES, what="a baseline"))
    lam: float = option(5.0, "xe-cider: weight of the SCST loss added to the XE loss.", check=finite)
    preset: str = option(
        "toy", "Defaults of --epochs, --batch-size, --lr, --lr-decay-every, --lr-decay-rate: toy (6, 50, 1e-4, 0, "
        "0.8; tuned on the bundled set) or paper (100, 128, 5e-4, 15, 0.8; the authors' COCO run). Options given "
        "explicitly win.", check=one_of(*FINETUNE_PRESETS, what="a preset"))
    sample_mode: str = option(
        "train", "train: sample with dropout on and replay the same dropout in the loss (on-policy, as the "
        "published code); eval: sample without dropout and score with fresh dropout (off-policy).",
        check=one_of(*SAMPLE_MODES, what="a sample mode"))
    checkpoint: str = option("best", "Start from the XE model's best or last checkpoint.",
                             check=one_of(*CHECKPOINTS, what="a checkpoint"))
    epochs: int | None = _from_preset("epochs")
    batch_size: int | None = _from_preset("batch_size")
    lr: float | None = _from_preset("lr")
    lr_decay_every: int | None = _from_preset("lr_decay_every")
    lr_decay_rate: float | None = _from_preset("lr_decay_rate")
    out: Path | None = out_option("a new version <workspace>/finetune/<reward>-v<k>")
    force: bool = force_option()
    workspace: Path | None = workspace_option()

    @property
    def seq_per_img(self) -> int:
        """A reward with an XE term (xe-cider) reads the 5 references of each image; the others none."""
        return 5 if REWARD_TABLE[self.reward].xe_mix else 1

    def reward_setting(self, name: str) -> Any:
        """The option ``name`` (baseline, lam) when it belongs to this run's reward, else None."""
        return getattr(self, name) if name in REWARD_TABLE[self.reward].settings else None

    def with_preset(self) -> "FinetuneOptions":
        """These options with the preset's values where none was given."""
        preset = FINETUNE_PRESETS[self.preset]
        return self.replace(**{k: v for k, v in preset.items() if getattr(self, k) is None})

    def validate(self) -> None:
        spec = REWARD_TABLE[self.reward]
        if self.baseline != "none" and "baseline" not in spec.settings:
            with_baseline = [r.name for r in REWARD_TABLE.values() if "baseline" in r.settings]
            raise RdppError(f"--baseline {self.baseline} applies to --reward {' or '.join(with_baseline)} only; for "
                            "SCST with a mean baseline use --reward scst-mean")
        if self.m < spec.min_m:
            raise RdppError(f"--m {self.m} with --reward {self.reward}: {spec.min_m_why}")
        if "lam" in spec.settings and not 0 <= self.lam < float("inf"):
            raise RdppError(f"--lam must be ≥ 0 and finite (got {self.lam})")
