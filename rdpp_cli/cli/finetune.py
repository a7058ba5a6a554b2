"""`rdpp finetune`: thin wrapper over ``rdpp_cli.training.finetune.finetune``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rdpp_cli.cli.common import (ConfigOpt, DeviceOpt, ForceOpt, GradClipModeOpt, GradClipOpt, ResumeOpt,
                                 SaveEveryStepsOpt, ValBatchSizeOpt, ValImagesOpt, WorkersOpt, WorkspaceOpt,
                                 resolve_options, stage)
from rdpp_cli.cli.common import PrecisionOpt


@stage
def command(
    ctx: typer.Context,
    model: Optional[str] = typer.Argument(
        None, help="XE model artifact folder, or its name in the workspace (default: the newest XE model)."),
    from_: Optional[str] = typer.Option(None, "--from", help="Same as MODEL: the XE model artifact to start from."),
    data: Optional[str] = typer.Option(
        None, "--data", help="Data artifact (default: the one the XE model was trained on; another is refused)."),
    reward: str = typer.Option("dpp", "--reward", help="dpp (R-DPP), scst (greedy baseline), scst-mean "
                               "(leave-one-out mean baseline) or xe-cider (XE + lam x SCST)."),
    m: int = typer.Option(5, "--m", "--samples", help="Captions sampled per image each step (R-DPP: the DPP's set "
                          "size). Under torchrun write --samples: torchrun reads --m as an abbreviation of its own options."),
    baseline: str = typer.Option(
        "none", "--baseline", help="R-DPP only: none (as the published code) or mean (w minus its mean over the m samples)."),
    lam: float = typer.Option(5.0, "--lam", help="xe-cider: weight of the SCST loss added to the XE loss."),
    preset: str = typer.Option(
        "toy", "--preset", help="Defaults of --epochs, --batch-size, --lr, --lr-decay-every, --lr-decay-rate: toy "
        "(6, 50, 1e-4, 0, 0.8; tuned on the bundled set) or paper (100, 128, 5e-4, 15, 0.8; the authors' COCO run). "
        "Options given explicitly win."),
    sample_mode: str = typer.Option(
        "train", "--sample-mode", help="train: sample with dropout on and replay the same dropout in the loss "
        "(on-policy, as the published code); eval: sample without dropout and score with fresh dropout (off-policy)."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Passes over the training images (default: the preset's)."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", help="Images per optimizer step, all processes together (default: the preset's)."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Adam learning rate (default: the preset's)."),
    grad_clip: float = GradClipOpt,
    grad_clip_mode: str = GradClipModeOpt,
    lr_decay_every: Optional[int] = typer.Option(
        None, "--lr-decay-every", help="Multiply the LR by --lr-decay-rate every k epochs, 0 = never (default: the preset's)."),
    lr_decay_rate: Optional[float] = typer.Option(None, "--lr-decay-rate", help="LR decay factor (default: the preset's)."),
    val_images: Optional[int] = ValImagesOpt,
    val_batch_size: int = ValBatchSizeOpt,
    save_every_steps: int = SaveEveryStepsOpt,
    checkpoint: str = typer.Option("best", "--checkpoint", help="Start from the XE model's best or last checkpoint."),
    device: str = DeviceOpt,
    precision: str = PrecisionOpt,
    workers: int = WorkersOpt,
    seed: int = typer.Option(123, "--seed", help="Seed of the batch order, the sampling and dropout."),
    resume: bool = ResumeOpt,
    out: Optional[Path] = typer.Option(
        None, "--out", help="Folder to write (default: a new version <workspace>/finetune/<reward>-v<k>)."),
    force: bool = ForceOpt,
    config: Optional[Path] = ConfigOpt,
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Fine-tune an XE model with RL: R-DPP (diverse and accurate), SCST, or XE + lam x CIDEr.

    Each step samples --m captions per image from the policy (dropout on, replayed in the loss),
    scores them with CIDEr-D (training df, the end token counted, as the published code) and, for
    R-DPP, with pairwise CIDEr-D among them, and follows the policy gradient. Validates each epoch
    (greedy CIDEr-D, and mean CIDEr-D / self-CIDEr of 5 samples per val image).

    --preset paper gives the authors' COCO settings (docs/rewards.md).

    Rerunning the same command continues an interrupted run.

    Multi-GPU: torchrun --nproc-per-node N -m rdpp_cli finetune --samples 5 ...

    Example: rdpp finetune --reward dpp --m 5
    """
    from rdpp_cli.cli.common import parent_option
    from rdpp_cli.training.finetune import finetune

    opts = resolve_options(ctx, "finetune")
    finetune(parent_option(opts, "model", "models"), **opts)
