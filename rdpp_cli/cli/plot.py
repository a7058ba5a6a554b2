"""`rdpp plot`: thin wrapper over ``rdpp_cli.scoring.plot.plot``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rdpp_cli.cli.common import ConfigOpt, WorkspaceOpt, resolve_options, stage


@stage
def command(
    ctx: typer.Context,
    scores: Optional[list[str]] = typer.Argument(
        None, help="Scores artifacts (folders or workspace names; default: every one in the workspace)."),
    out: Optional[Path] = typer.Option(
        None, "--out", help="PNG to write (default: <workspace>/plots/diversity-accuracy.png).", dir_okay=False),
    labels: Optional[str] = typer.Option(None, "--labels", help="Comma-separated point labels, one per artifact."),
    config: Optional[Path] = ConfigOpt,
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Plot scores artifacts on the diversity-accuracy plane (the paper's Fig. 1) with the human point.

    Example: rdpp plot runs/scores/att2in-small-v1.random-n20-v1 runs/scores/dpp-m5-v1.random-n20-v1 --labels XE,R-DPP
    """
    from rdpp_cli.scoring.plot import plot

    plot(**resolve_options(ctx, "plot"))
