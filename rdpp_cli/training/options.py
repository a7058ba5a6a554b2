"""The options of `rdpp train-xe` and `rdpp finetune`, declared once (rdpp_cli.options).

``TrainLoopOptions`` holds what the two stages share, the training loop's settings
(rdpp_cli.training.loop reads them); ``XEOptions`` and ``FinetuneOptions`` add each stage's own. From
these classes come the commands (``--help`` shows the loop's options in a panel of their own), the
keys of ``--config`` and of ``<workspace>/rdpp.yaml``, the arguments of ``train_xe`` and
``finetune``, the settings a rerun must share to resume (``identity``) and the manifest's config
(``recorded``). No torch here: ``rdpp --help`` builds the commands from these classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from rdpp_cli import checks
from rdpp_cli.checks import DEFAULT_FAST, FAST_CHOICES, RESIDENT_CHOICES
from rdpp_cli.errors import RdppError
from rdpp_cli.options import (Options, all_of, argument, at_least, device_option, finite, force_option,
                              learning_rate, one_of, option, out_option, precision_option, resolved,
                              workspace_option)
from rdpp_cli.options import seed as seed_check
from rdpp_cli.models.registry import DEFAULT_MODEL, MODELS, model_spec, models_help
from rdpp_cli.models.registry import PRESETS as MODEL_PRESETS
from rdpp_cli.training.reward_table import REWARDS as REWARD_TABLE

LOOP_CLI = {"rich_help_panel": "Training loop"}  # --help shows the loop's options in a panel of their own
# --workers not given: per device type (the COCO epochs of docs/training.md were measured with 4 on CUDA)
WORKERS = {"cuda": 4, "cpu": 0}
GRAD_CLIP_MODES = ("value", "norm")  # self-critical.pytorch's clamp of every entry, or the global L2 norm

XE_SCHEDULES = ("step", "noam")  # train-xe --lr-schedule
FT_SCHEDULES = ("step", "plateau")  # finetune --lr-schedule
# the scheduled-sampling settings' defaults (self-critical.pytorch's train.py options); None in the options
# means "not given", so that giving one with scheduled sampling off is refused
SS_DEFAULTS: dict[str, Any] = {"ss_every": 5, "ss_step": 0.05, "ss_max": 0.25}
# --preset names as accepted: finetune's `toy` is the name `small` had before it followed --model
PRESET_ALIASES = {"toy": "small"}

REWARDS = tuple(REWARD_TABLE)
BASELINES = ("none", "mean")
SAMPLE_MODES = ("train", "eval")
CHECKPOINTS = ("best", "last")


def _probability(flag: str, value: float | None) -> None:
    if value is not None and not 0 <= value <= 1:
        raise RdppError(f"{flag} must be in [0, 1] (got {value})")


def _adam_beta2(flag: str, value: float | None) -> None:
    """Adam divides by 1 - beta2^t: beta2 = 1 divides by zero (torch refuses it), so [0, 1)."""
    if value is not None and not 0 <= value < 1:
        raise RdppError(f"{flag} must be in [0, 1) (got {value}): Adam divides by 1 - beta2^t; the usual values are "
                        "0.999, or 0.98 for the transformer")


def _adam_eps(flag: str, value: float | None) -> None:
    """Adam's eps keeps its step finite where the squared gradients' average is 0: it must be > 0."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise RdppError(f"{flag} must be a positive number (got {value}): it keeps Adam's step finite where a "
                        "gradient is 0; the usual values are 1e-8, or 1e-9 for the transformer")


def _decay_rate(flag: str, value: float | None) -> None:
    if value is not None and not 0 < value <= 1:
        raise RdppError(f"{flag} must be in (0, 1] (got {value})")


def _model(flag: str, value: str | None) -> None:
    """A name of rdpp_cli.models.registry.MODELS, read when checked (a line added is a --model)."""
    checks.one_of(flag, value, tuple(MODELS), "a model")


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
        "(docs/training.md). auto: on where measured faster and equal (the model's registry line: "
        "so far one model on CUDA, docs/training.md), on, off.",
        identity=False, check=one_of(*FAST_CHOICES, what="a --fast setting"))
    workers: int | None = loop_option(
        None, "Threads reading the next batches while a step runs (0: read in the loop; docs/data.md). Default: "
        f"{WORKERS['cuda']} on a CUDA GPU (the loader must keep up with it), {WORKERS['cpu']} on a CPU (the step is "
        "the limit there).", identity=False, check=at_least(0))
    resident: str = loop_option(
        "auto", "Hold the training features in memory where they fit: on the GPU, else in page-locked host memory "
        "(on a CPU: RAM); the same batches (auto, off: read every batch from the file).", identity=False,
        check=one_of(*RESIDENT_CHOICES, what="a --resident setting"))
    resume: bool = loop_option(True, "Continue an unfinished run with the same settings, or start it over.",
                               "--resume/--no-resume", identity=False, record=False)
    recipe: dict[str, Any] | None = resolved(
        "The recipe that filled in the options not given (``_fill``): its model, stage, preset and the values it "
        "supplied; None until then.")

    seq_per_img: ClassVar[int] = 5  # captions per image in a batch: an option of train-xe, finetune's follows its reward
    lr_schedule: ClassVar[str] = "step"  # an option of train-xe (step, noam) and finetune (step, plateau)
    warmup: ClassVar[int] = 0
    adam_beta2: ClassVar[float] = 0.999
    adam_eps: ClassVar[float] = 1e-8
    STAGE: ClassVar[str] = ""  # the registry's name of the stage (its recipes: rdpp_cli.models.registry)

    def loader_workers(self, device_type: str) -> int:
        """``workers``, or its default on a device of ``device_type`` (``WORKERS``)."""
        return self.workers if self.workers is not None else WORKERS.get(device_type, 0)

    def unused(self) -> set[str]:
        """The options that cannot act in this combination (resolved options): left out of the
        manifest's config, and refused when given explicitly (``validate``)."""
        return set()

    def complete(self) -> bool:
        """The values left unset (None) come from the recipe: known once it is recorded (``_fill``)."""
        return self.recipe is not None

    def given(self) -> set[str]:
        """The options set other than by the recipe: given explicitly, or changed since (``replace``)."""
        supplied = (self.recipe or {}).get("values", {})
        return {f for f in self.field_names() if (v := getattr(self, f)) is not None
                and not (f in supplied and supplied[f] == v)}

    def validate(self) -> None:
        """Once every value is known: an option given that cannot act is refused, in one line."""
        refused = sorted(self.unused() & self.given())
        if refused:
            raise RdppError(self.why_unused(refused[0]))

    def recipe_record(self) -> dict[str, Any] | None:
        """What the manifest records of the recipe the run used: its model, stage and preset and the
        values it supplied that can act (not ``unused``); None before ``with_preset``."""
        if self.recipe is None:
            return None
        return {**self.recipe, "values": {k: v for k, v in self.recipe["values"].items() if k not in self.unused()}}

    def _fill(self, model: str, preset: str, defaults: dict[str, Any] | None = None) -> Any:
        """These options with ``model``'s ``preset`` recipe for this stage (and ``defaults``) where
        no value was given, the recipe recorded with them (``recipe``); checked then, once every value
        is known (``validate``)."""
        if self.recipe is not None:
            return self  # already resolved
        recipe = {**model_spec(model).recipe(self.STAGE, preset), **(defaults or {})}
        fields = set(self.field_names())
        filled = {k: v for k, v in recipe.items() if k in fields and getattr(self, k) is None}
        return self.replace(**filled, recipe={"model": model, "stage": self.STAGE, "preset": preset, "values": filled})

    def why_unused(self, name: str) -> str:
        """The one-line refusal of option ``name`` that cannot act (``unused``): here the step schedule's
        decay, which both stages have; a stage's own options' messages are in its class."""
        if name not in ("lr_decay_every", "lr_decay_rate"):
            raise KeyError(f"{type(self).__name__} has no refusal of unused {name}")
        flag = "--" + name.replace("_", "-")
        return (f"{flag} sets the step schedule's decay, which --lr-schedule {self.lr_schedule} does not use; drop it "
                "or pass --lr-schedule step")


def _from_preset(name: str) -> Any:
    """The loop's option ``name``, left unset (None) for finetune's ``--preset`` to fill."""
    f = TrainLoopOptions.__dataclass_fields__[name]
    help_ = f.metadata["help"].removesuffix(".") + " (default: the preset's)."
    return loop_option(None, help_, check=f.metadata["check"])


@dataclass
class XEOptions(TrainLoopOptions):
    """`rdpp train-xe`. The loop settings left unset (None) take the values of ``preset``'s recipe
    for ``model`` (its line in rdpp_cli.models.registry; ``with_preset``)."""

    section = "train_xe"

    data: str | None = option(
        None, "Data artifact folder, or its name in the workspace (default: the newest). --from is the same "
        "option: a run's parent is its data (docs/workspace.md).", "--data", "--from", identity=False, positional=True)
    model: str = option(DEFAULT_MODEL, f"Captioner: {models_help()} (docs/model.md).",
                        check=_model)
    hf_model: str | None = option(
        None, "--model hf: the local save_pretrained folder of a Hugging Face captioner to continue (a "
        "VisionEncoderDecoderModel, BlipForConditionalGeneration or GitForCausalLM); its decoder's weights, config and "
        "tokenizer go into the checkpoints.")
    preset: str = option("paper", "Model size and training recipe: paper (the published ones of --model) or small "
                         "(CPU, the bundled data); options given explicitly win (docs/training.md).",
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
    ss_every: int | None = loop_option(None, "Scheduled sampling: ss grows every k epochs (default 5).",
                                       check=at_least(1))
    ss_step: float | None = loop_option(None, "Scheduled sampling: how much ss grows each time (default 0.05).",
                                        check=all_of(finite, at_least(0)))
    ss_max: float | None = loop_option(None, "Scheduled sampling: the largest ss (default 0.25).", check=_probability)
    label_smoothing: float = loop_option(0.0, "Label smoothing of the XE loss (0 = off).", check=_probability)
    lr_schedule: str | None = loop_option(
        None, "step: x --lr-decay-rate every --lr-decay-every epochs; noam: --lr x d_model^-0.5 x min(s^-0.5, "
        "s x warmup^-1.5) at step s (the transformer's). Default: the preset's.",
        check=one_of(*XE_SCHEDULES, what="an LR schedule"))
    warmup: int | None = loop_option(None, "Noam schedule: warm-up steps (default: the preset's).", check=at_least(0))
    adam_beta2: float | None = loop_option(None, "Adam's beta2, in [0, 1) (default: the preset's).", check=_adam_beta2)
    adam_eps: float | None = loop_option(None, "Adam's eps, > 0 (default: the preset's).", check=_adam_eps)
    out: Path | None = out_option("a new version <workspace>/xe/<model>-<preset>-v<k>")
    force: bool = force_option()
    workspace: Path | None = workspace_option()

    STAGE: ClassVar[str] = "train-xe"

    def with_preset(self) -> "XEOptions":
        """These options with ``preset``'s train-xe recipe for ``model`` (rdpp_cli.models.registry) and
        ``SS_DEFAULTS`` where none was given; an option given that cannot act is refused (``unused``)."""
        return self._fill(self.model, self.preset, SS_DEFAULTS)

    def unused(self) -> set[str]:
        """The Noam schedule has no step decay, the step schedule no warm-up, and scheduled sampling's
        shape does nothing while it is off."""
        out = set() if self.scheduled_sampling else set(self.SS_SETTINGS)
        return out | ({"lr_decay_every", "lr_decay_rate"} if self.lr_schedule == "noam" else {"warmup"})

    # settings at these values change nothing in a run of the default model as it always trained: left out of
    # the identity (and so of the manifest's config), so that a run from before they existed still resumes
    NEUTRAL: ClassVar[dict[str, Any]] = {"model": DEFAULT_MODEL, "hf_model": None, "ss_start": -1, "label_smoothing": 0.0,
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
        """The manifest records what ran: not the settings left out of the identity for being neutral,
        nor those that cannot act (``unused``: the Noam schedule's unused step decay stays in the identity
        so that a run from before this still resumes, but is not recorded)."""
        ident, rec = super().identity(), super().recorded()
        dropped = (set(ident) - set(self.identity())) | self.unused()
        return {k: v for k, v in rec.items() if k not in dropped}

    def why_unused(self, name: str) -> str:
        """The refusals of train-xe's own options that cannot act: the Noam schedule's warm-up and the
        scheduled-sampling shape (the step decay's: ``TrainLoopOptions.why_unused``)."""
        if name == "warmup":
            return ("--warmup is the noam schedule's warm-up, which --lr-schedule step has not; drop it or pass "
                    "--lr-schedule noam")
        if name in self.SS_SETTINGS:
            flag = "--" + name.replace("_", "-")
            return (f"{flag} shapes scheduled sampling, which is off (--ss-start -1); drop it or pass --ss-start K "
                    "to sample after epoch K")
        return super().why_unused(name)

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
    """`rdpp finetune`. ``epochs``, ``batch_size``, ``lr``, ``lr_decay_every``, ``lr_decay_rate`` and
    ``lr_schedule`` not given (None) take the values of ``preset``'s recipe for the XE model's
    architecture (``with_preset``, once the XE artifact is read)."""

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
        "small", "The fine-tuning recipe of the XE model's architecture (rdpp_cli.models.registry; docs/training.md): "
        "the defaults of --epochs, --batch-size, --lr, --lr-decay-every, --lr-decay-rate and --lr-schedule. small "
        "(alias toy): the bundled data on a CPU; paper: the published setting of the model (the R-DPP authors' "
        "train_dpp.sh, or self-critical.pytorch's _sc.yml). Options given explicitly win.",
        check=one_of(*MODEL_PRESETS, *PRESET_ALIASES, what="a preset"))
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
    lr_schedule: str | None = loop_option(
        None, "step: x --lr-decay-rate every --lr-decay-every epochs; plateau: x 0.5 when the validation CIDEr-D "
        "has not improved for 3 epochs (self-critical.pytorch's --reduce_on_plateau). Default: the preset's.",
        check=one_of(*FT_SCHEDULES, what="a fine-tuning LR schedule"))
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

    STAGE: ClassVar[str] = "finetune"

    def with_preset(self, model: str) -> "FinetuneOptions":
        """These options with ``preset``'s finetune recipe for ``model`` (the XE model's registry name,
        known once the XE artifact is read) where none was given; an option given that cannot act is
        refused (``unused``), as is the plateau schedule without validation (``validate``)."""
        return self._fill(model, PRESET_ALIASES.get(self.preset, self.preset))

    def unused(self) -> set[str]:
        """The plateau schedule has no step decay."""
        return {"lr_decay_every", "lr_decay_rate"} if self.lr_schedule == "plateau" else set()

    def identity(self) -> dict[str, Any]:
        """As recorded, with the plateau's unused decay left out, ``lr_schedule`` step (the only one
        before it was an option) left out and ``small`` under the name it had (``toy``), so that a run
        from before these still resumes."""
        ident = {k: v for k, v in super().identity().items() if k not in self.unused()}
        if ident.get("lr_schedule") == "step":
            del ident["lr_schedule"]
        if ident.get("preset") == "small":
            ident["preset"] = "toy"
        return ident

    def recorded(self) -> dict[str, Any]:
        return {k: v for k, v in super().recorded().items() if k not in self.unused()}

    def __post_init__(self) -> None:
        """The reward's settings never wait for the recipe: checked when the options are made (the
        schedule's, in ``validate``, once the recipe has filled it in)."""
        super().__post_init__()
        self.check_reward()

    def validate(self) -> None:
        super().validate()
        if self.lr_schedule == "plateau" and self.val_images == 0:
            raise RdppError("--lr-schedule plateau lowers the LR when the validation CIDEr-D stops improving, and "
                            "--val-images 0 turns validation off; validate, or pass --lr-schedule step")

    def check_reward(self) -> None:
        """The reward's settings together (none of them waits for the recipe)."""
        spec = REWARD_TABLE[self.reward]
        if self.baseline != "none" and "baseline" not in spec.settings:
            with_baseline = [r.name for r in REWARD_TABLE.values() if "baseline" in r.settings]
            raise RdppError(f"--baseline {self.baseline} applies to --reward {' or '.join(with_baseline)} only; for "
                            "SCST with a mean baseline use --reward scst-mean")
        if self.m < spec.min_m:
            raise RdppError(f"--m {self.m} with --reward {self.reward}: {spec.min_m_why}")
        if "lam" in spec.settings and not 0 <= self.lam < float("inf"):
            raise RdppError(f"--lam must be ≥ 0 and finite (got {self.lam})")
