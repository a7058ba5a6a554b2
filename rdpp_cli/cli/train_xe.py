"""`rdpp train-xe`: thin wrapper over ``rdpp_cli.training.xe.train_xe``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rdpp_cli.cli.common import (BatchSizeOpt, ConfigOpt, DeviceOpt, ForceOpt, GradClipModeOpt, GradClipOpt,
                                 LrDecayRateOpt, ResumeOpt, SaveEveryStepsOpt, ValBatchSizeOpt, ValImagesOpt,
                                 WorkersOpt, WorkspaceOpt, lr_decay_every_opt, resolve_options, stage)
from rdpp_cli.cli.common import PrecisionOpt


@stage
def command(
    ctx: typer.Context,
    data: Optional[str] = typer.Option(
        None, "--data", "--from", help="Data artifact folder, or its name in the workspace (default: the newest). "
                                       "--from is the same option: a run's parent is its data (docs/workspace.md)."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Folder to write (default: a new version <workspace>/xe/att2in-<preset>-v<k>)."),
    preset: str = typer.Option("paper", "--preset", help="Model size: paper (512, dropout 0.5) or small (CPU)."),
    init_from: Optional[str] = typer.Option(
        None, "--init-from", help="Start from this model artifact's best.pt (or a .pt file); same vocabulary."),
    epochs: int = typer.Option(30, "--epochs", help="Passes over the training images."),
    batch_size: int = BatchSizeOpt,
    seq_per_img: int = typer.Option(5, "--seq-per-img", help="Captions per image in a batch."),
    lr: float = typer.Option(4e-4, "--lr", help="Adam learning rate (paper: 4e-4)."),
    grad_clip: float = GradClipOpt,
    grad_clip_mode: str = GradClipModeOpt,
    lr_decay_every: int = lr_decay_every_opt(3),
    lr_decay_rate: float = LrDecayRateOpt,
    val_images: Optional[int] = ValImagesOpt,
    val_batch_size: int = ValBatchSizeOpt,
    save_every_steps: int = SaveEveryStepsOpt,
    device: str = DeviceOpt,
    precision: str = PrecisionOpt,
    workers: int = WorkersOpt,
    seed: int = typer.Option(123, "--seed", help="Seed of the weights, the batch order and dropout."),
    resume: bool = ResumeOpt,
    force: bool = ForceOpt,
    config: Optional[Path] = ConfigOpt,
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Train Att2in with cross-entropy (teacher forcing, 5 captions per image) on a data artifact.

    Validates each epoch by greedy decoding scored with CIDEr-D; keeps best.pt and last.pt.

    Rerunning the same command continues an interrupted run.

    Multi-GPU: torchrun --nproc-per-node N -m rdpp_cli train-xe ...

    Example: rdpp train-xe --preset small --epochs 15
    """
    from rdpp_cli.training.xe import train_xe

    train_xe(**resolve_options(ctx, "train_xe"))
