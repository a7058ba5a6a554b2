"""The `rdpp` command: a table of commands, each a thin wrapper in its own module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.markup import escape
from typer.core import TyperGroup

from rdpp_cli import __version__
from rdpp_cli.cli import (caption, compare, demo, export_hf, finetune, ls, plot, prepro, sample, score, table, train_xe,
                          verify)
from rdpp_cli.console import err_console

# Click's base of every command-line error (vendored inside newer Typer, the click package in older)
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def parse_error_line(e: Exception) -> str:
    """A command-line error as one line: ``Invalid value for '--n': ...; see `rdpp sample --help```."""
    ctx = getattr(e, "ctx", None)
    see = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
    return " ".join(e.format_message().split()).rstrip(".") + see


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    try:
        yield
    except ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `rdpp` alone: the help, as Click prints it
            raise
        err_console.print(f"[red]error:[/red] {escape(parse_error_line(e))}", soft_wrap=True, highlight=False)
        raise typer.Exit(e.exit_code) from None


class OneLineErrors(TyperGroup):
    """The root command: a bad option, value or argument is one ``error:`` line (exit 2), like
    every other refusal, instead of Click's usage box."""

    def make_context(self, info_name, args, parent=None, **extra):
        with _one_line_errors():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx):  # the subcommands parse their options in here
        with _one_line_errors():
            return super().invoke(ctx)


app = typer.Typer(
    cls=OneLineErrors,
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
app.command("export-hf")(export_hf.command)
app.command("plot")(plot.command)
app.command("table")(table.command)
app.command("compare")(compare.command)
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
