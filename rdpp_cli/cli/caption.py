"""`rdpp caption`: thin wrapper over rdpp_cli.captioning.caption.caption."""

from __future__ import annotations

from pathlib import Path

import typer

from rdpp_cli.cli import common as C
from rdpp_cli.cli.common import ConfigOpt, DeviceOpt, ForceOpt, WorkspaceOpt, resolve_options, stage


@stage
def command(
    ctx: typer.Context,
    paths: list[Path] = typer.Argument(..., help="Image files, or folders of them (searched recursively)."),
    from_: str = typer.Option(None, "--from", help="Model artifact (name or path); default: the newest fine-tuned, "
                                                  "else XE model."),
    method: str = typer.Option("beam", "--method", help=C.MethodHelp),
    n: int = typer.Option(1, "--n", help="Captions per photo."),
    temperature: float = C.TemperatureOpt,
    top_k: int = C.TopKOpt,
    top_p: float = C.TopPOpt,
    beam: int = C.BeamOpt,
    groups: int = C.GroupsOpt,
    diversity_lambda: float = C.DiversityLambdaOpt,
    length_norm: float = C.LengthNormOpt,
    max_len: int = typer.Option(None, "--max-len", help="Most words per caption (default: the model's)."),
    allow_unk: bool = C.AllowUnkOpt,
    weights: Path = typer.Option(None, "--weights", dir_okay=False,
                                 help="The backbone's weights file, when it moved since prepro (same sha256)."),
    batch_size: int = typer.Option(None, "--batch-size", help="Images per extraction batch (default: the data's)."),
    workers: int = typer.Option(None, "--workers", help="Processes decoding images (default: on a GPU the cores but one; on a CPU a quarter of them)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling generator."),
    device: str = DeviceOpt,
    out: Path = typer.Option(None, "--out", help="Write the captions artifact exactly here."),
    force: bool = ForceOpt,
    workspace: Path = WorkspaceOpt,
    config: Path = ConfigOpt,
) -> None:
    """Caption your own photos: results JSON + an HTML contact sheet (thumbnails with their captions).

    Features are extracted exactly as the model's data artifact did (backbone, weights, size, grid).

    Example: rdpp caption photos/ --method random --n 5
    """
    from rdpp_cli.captioning.caption import caption

    opts = resolve_options(ctx, "caption")
    caption(opts.pop("paths"), model=opts.pop("from_"), **opts)
