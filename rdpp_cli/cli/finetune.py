"""`rdpp finetune`: thin wrapper over ``rdpp_cli.training.finetune.finetune``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rdpp_cli.cli.common import (BatchSizeOpt, ConfigOpt, DeviceOpt, ForceOpt, GradClipModeOpt, GradClipOpt,
                                 LrDecayRateOpt, ResumeOpt, SaveEveryStepsOpt, ValBatchSizeOpt, ValImagesOpt,
                                 WorkersOpt, WorkspaceOpt, lr_decay_every_opt, resolve_options, stage)
from rdpp_cli.errors import RdppError


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
    epochs: int = typer.Option(6, "--epochs", help="Passes over the training images."),
    batch_size: int = BatchSizeOpt,
    lr: float = typer.Option(1e-4, "--lr", help="Adam learning rate (tuned on the bundled set; the paper used 4e-4 for 100 COCO epochs)."),
    grad_clip: float = GradClipOpt,
    grad_clip_mode: str = GradClipModeOpt,
    lr_decay_every: int = lr_decay_every_opt(0),
    lr_decay_rate: float = LrDecayRateOpt,
    val_images: Optional[int] = ValImagesOpt,
    val_batch_size: int = ValBatchSizeOpt,
    save_every_steps: int = SaveEveryStepsOpt,
    checkpoint: str = typer.Option("best", "--checkpoint", help="Start from the XE model's best or last checkpoint."),
    device: str = DeviceOpt,
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

    Each step samples --m captions per image, scores them with CIDEr-D (training df) and, for
    R-DPP, with pairwise CIDEr-D among them, and follows the policy gradient. Validates each epoch
    (greedy CIDEr-D, and mean CIDEr-D / self-CIDEr of 5 samples per val image).

    Rerunning the same command continues an interrupted run.

    Multi-GPU: torchrun --nproc-per-node N -m rdpp_cli finetune --samples 5 ...

    Example: rdpp finetune --reward dpp --m 5
    """
    from rdpp_cli.training.finetune import finetune

    opts = resolve_options(ctx, "finetune")
    chosen, alias = opts.pop("model"), opts.pop("from_")
    if chosen and alias and chosen != alias:
        raise RdppError(f"MODEL {chosen} and --from {alias} name different models; give one of them")
    finetune(chosen or alias, **opts)
