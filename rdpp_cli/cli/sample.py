"""`rdpp sample`: thin wrapper over rdpp_cli.decoding.sample.sample."""

from __future__ import annotations

from pathlib import Path

import typer

from rdpp_cli.cli import common as C
from rdpp_cli.cli.common import ConfigOpt, DeviceOpt, ForceOpt, WorkspaceOpt, resolve_options, stage
from rdpp_cli.cli.common import PrecisionOpt


@stage
def command(
    ctx: typer.Context,
    model: str = typer.Argument(None, help="Model artifact (path or name); default: the newest fine-tuned, else XE model."),
    from_: str = typer.Option(None, "--from", help="Same as MODEL: an artifact name (see `rdpp ls`) or path."),
    data: str = typer.Option(None, "--data", help="Data artifact; default: the one the model was trained on."),
    split: str = typer.Option("test", "--split", help="train, val or test."),
    n: int = typer.Option(20, "--n", help="Captions per image."),
    method: str = typer.Option("random", "--method", help=C.MethodHelp),
    temperature: float = C.TemperatureOpt,
    top_k: int = C.TopKOpt,
    top_p: float = C.TopPOpt,
    beam: int = C.BeamOpt,
    groups: int = C.GroupsOpt,
    diversity_lambda: float = C.DiversityLambdaOpt,
    length_norm: float = C.LengthNormOpt,
    max_len: int = typer.Option(None, "--max-len", help="Most words per caption (default: the data's caption length)."),
    allow_unk: bool = C.AllowUnkOpt,
    batch_size: int = typer.Option(50, "--batch-size", help="Images per decoding batch."),
    max_images: int = typer.Option(None, "--max-images", help="Only the first N images of the split."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling generator."),
    select: str = typer.Option(None, "--select", help="Keep n of --candidates per image: dpp, mbr, logprob or consensus."),
    candidates: int = typer.Option(50, "--candidates", help="Captions decoded per image for --select."),
    quality: str = typer.Option(None, "--quality", help="--select dpp's quality: consensus (default) or logprob."),
    neighbours: int = typer.Option(None, "--neighbours", help="--select consensus: rank against the captions of "
                                   "this many nearest training images (default 60)."),
    keep_candidates: bool = typer.Option(False, "--keep-candidates", help="Also write every candidate of --select."),
    device: str = DeviceOpt,
    precision: str = PrecisionOpt,
    out: Path = typer.Option(None, "--out", help="Write the samples artifact exactly here."),
    force: bool = ForceOpt,
    workspace: Path = WorkspaceOpt,
    config: Path = ConfigOpt,
) -> None:
    """Decode n captions per image (greedy, beam, random, topk, nucleus, dbs).

    Example: rdpp sample --n 20 --method random

    Example: rdpp sample --n 5 --select dpp --candidates 50

    Example: rdpp sample --n 5 --select consensus --candidates 100
    """
    from rdpp_cli.decoding.sample import sample

    from rdpp_cli.cli.common import parent_option

    opts = resolve_options(ctx, "sample")
    sample(parent_option(opts, "model", "models"), **opts)
