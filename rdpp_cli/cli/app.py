"""The `rdpp` command: a table of commands, each a thin wrapper in its own module."""

from __future__ import annotations

import typer

from rdpp_cli import __version__
from rdpp_cli.cli import finetune
from rdpp_cli.cli import ls
from rdpp_cli.cli import plot
from rdpp_cli.cli import prepro
from rdpp_cli.cli import score
from rdpp_cli.cli import train_xe

app = typer.Typer(
    name="rdpp",
    help="Diverse and accurate image captioning with reinforced determinantal point processes (R-DPP).\n\n"
    "Pipeline: prepro -> train-xe -> finetune -> sample -> score. Every stage reads the newest "
    "suitable artifact from the workspace (./runs) when no path is given.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# name -> (module with `command` or `app`). Add a row only when the command works.
app.command("ls")(ls.command)
app.add_typer(prepro.app, name="prepro")
app.command("train-xe")(train_xe.command)
app.command("score")(score.command)
app.command("plot")(plot.command)
app.command("finetune")(finetune.command)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rdpp {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass


def main() -> None:
    app(prog_name="rdpp")


if __name__ == "__main__":
    main()
