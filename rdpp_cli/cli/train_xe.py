"""`rdpp train-xe`: thin wrapper over ``rdpp_cli.training.xe.train_xe``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rdpp_cli.cli.common import ConfigOpt, ForceOpt, WorkspaceOpt, resolve_options, stage
from rdpp_cli.training.xe import train_xe


@stage
def command(
    ctx: typer.Context,
    data: Optional[str] = typer.Option(
        None, "--data", "--from", help="Data artifact folder, or its name in the workspace (default: the newest)."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Folder to write (default: a new version <workspace>/xe/att2in-<preset>-v<k>)."),
    preset: str = typer.Option("paper", "--preset", help="Model size: paper (512, dropout 0.5) or small (CPU)."),
    init_from: Optional[str] = typer.Option(
        None, "--init-from", help="Start from this model artifact's best.pt (or a .pt file); same vocabulary."),
    epochs: int = typer.Option(30, "--epochs", help="Passes over the training images."),
    batch_size: int = typer.Option(50, "--batch-size", help="Images per optimizer step (all processes together)."),
    seq_per_img: int = typer.Option(5, "--seq-per-img", help="Captions per image in a batch."),
    lr: float = typer.Option(4e-4, "--lr", help="Adam learning rate (paper: 4e-4)."),
    grad_clip: float = typer.Option(0.1, "--grad-clip", help="Gradient clipping threshold (0 = off)."),
    grad_clip_mode: str = typer.Option(
        "value", "--grad-clip-mode", help="value: clamp each gradient entry (self-critical.pytorch); norm: global L2."),
    lr_decay_every: int = typer.Option(3, "--lr-decay-every", help="Multiply the LR by --lr-decay-rate every k epochs (0 = never)."),
    lr_decay_rate: float = typer.Option(0.8, "--lr-decay-rate", help="LR decay factor."),
    val_images: Optional[int] = typer.Option(
        None, "--val-images", help="Validate on the first N val images (default: all; 0 = no validation)."),
    val_batch_size: int = typer.Option(100, "--val-batch-size", help="Images per validation decoding batch."),
    save_every_steps: int = typer.Option(
        0, "--save-every-steps", help="Also save last.pt and the resume state every K steps (0 = per epoch)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    workers: int = typer.Option(0, "--workers", help="DataLoader worker processes reading batches."),
    seed: int = typer.Option(123, "--seed", help="Seed of the weights, the batch order and dropout."),
    resume: bool = typer.Option(
        True, "--resume/--no-resume", help="Continue an unfinished run with the same settings, or start it over."),
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
    train_xe(**resolve_options(ctx, "train_xe"))
