"""`rdpp score`: thin wrapper over ``rdpp_cli.scoring.score.score``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rdpp_cli.cli.common import ConfigOpt, ForceOpt, WorkspaceOpt, resolve_options, stage


@stage
def command(
    ctx: typer.Context,
    samples: Optional[str] = typer.Argument(
        None, help="Samples artifact (folder, workspace name or its samples.json; default: the newest), or a JSON file: "
                   '[{"image_id", "captions": [...]}] or coco-caption results [{"image_id", "caption"}].'),
    from_: Optional[str] = typer.Option(None, "--from", help="Same as SAMPLES: the samples artifact to score."),
    data: Optional[str] = typer.Option(
        None, "--data", help="Data artifact whose split gives the references (default: the one the samples were made "
                              "from; another is used with a warning line; for a JSON file: the newest)."),
    split: Optional[str] = typer.Option(
        None, "--split", help="Split of the data artifact (default: the samples' split, else test)."),
    refs: Optional[Path] = typer.Option(
        None, "--refs", help="COCO caption-annotation file (e.g. captions_val2014.json) instead of a data artifact.",
        dir_okay=False),
    oracle: bool = typer.Option(False, "--oracle", help="Also report best-of-n (oracle) scores for every metric."),
    self_cider: bool = typer.Option(False, "--self-cider", help="Self-CIDEr diversity of each image's captions."),
    self_cider_variant: str = typer.Option(
        "cider-d", "--self-cider-variant", help="cider-d (DESIGN: CIDEr-D kernel, svd) or cider (plain CIDEr, eigvalsh)."),
    diversity: bool = typer.Option(
        False, "--diversity", help="Div-1, Div-2, mBLEU-4, distinct captions, vocabulary, novel captions."),
    plot: bool = typer.Option(False, "--plot", help="Write plot.png: the diversity-accuracy plane (implies --self-cider)."),
    metrics: Optional[str] = typer.Option(
        None, "--metrics", help="Comma-separated subset of Bleu_1..Bleu_4,METEOR,ROUGE_L,CIDEr,SPICE (default: all)."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Folder to write (default: <workspace>/scores/<samples name>, then <samples name>-v2, ...)."),
    force: bool = ForceOpt,
    config: Optional[Path] = ConfigOpt,
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Score generated captions: coco-caption accuracy, best-of-n oracle and diversity.

    References come from a data artifact's split or a COCO annotation file, so rdpp also works as a
    standalone evaluator. Writes a scores artifact (scores.json, per_image.csv, plot.png).

    Example: rdpp score --oracle --self-cider

    Example: rdpp score results.json --refs captions_val2014.json
    """
    from rdpp_cli.cli.common import parent_option
    from rdpp_cli.scoring.score import score

    opts = resolve_options(ctx, "score")
    score(parent_option(opts, "samples", "samples"), **opts)
