"""`rdpp demo`: thin wrapper over rdpp_cli.demo.demo."""

from __future__ import annotations

from pathlib import Path

import typer

from rdpp_cli.cli.common import ConfigOpt, resolve_options, stage


@stage
def command(
    ctx: typer.Context,
    out: Path = typer.Option(None, "--out", "--workspace",
                             help="Workspace for the demo's artifacts [default: $RDPP_WORKSPACE or ./runs]."),
    quick: bool = typer.Option(False, "--quick", help="A smoke run of the same chain (under 2 minutes)."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or auto."),
    config: Path = ConfigOpt,
) -> None:
    """Run the whole chain on the bundled dataset and compare XE, SCST and R-DPP.

    prepro toy -> train-xe -> finetune scst -> finetune dpp (m=5) -> sample -> score -> plot;
    complete artifacts are reused, so a second run is fast.

    Example: rdpp demo --quick
    """
    from rdpp_cli.demo import demo

    opts = resolve_options(ctx, "demo")
    demo(opts["out"], quick=opts["quick"], device=opts["device"])
