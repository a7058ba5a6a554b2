"""The `rdpp` command: a table of commands, each a thin wrapper in its own module."""

from __future__ import annotations

import typer

from rdpp_cli import __version__
from rdpp_cli.cli import caption, demo, finetune, ls, plot, prepro, sample, score, table, train_xe, verify

app = typer.Typer(
    name="rdpp",
    help="Diverse and accurate image captioning with reinforced determinantal point processes (R-DPP).\n\n"
    "Pipeline: prepro -> train-xe -> finetune -> sample -> score. Every stage reads the newest "
    "suitable artifact from the workspace (./runs) when no path is given.",
    epilog="Examples: rdpp demo · rdpp prepro toy · rdpp train-xe · rdpp finetune --reward dpp --m 5 · "
    "rdpp sample --n 20 --method random · rdpp score --oracle --self-cider · rdpp ls",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# The command table, in pipeline order. Add a row only when the command works.
app.add_typer(prepro.app, name="prepro")
app.command("train-xe")(train_xe.command)
app.command("finetune")(finetune.command)
app.command("sample")(sample.command)
app.command("score")(score.command)
app.command("caption")(caption.command)
app.command("plot")(plot.command)
app.command("table")(table.command)
app.command("demo")(demo.command)
app.command("ls")(ls.command)
app.command("verify")(verify.command)

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
