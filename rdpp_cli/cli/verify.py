"""`rdpp verify`: the command made from ``VerifyOptions``; the work is ``rdpp_cli.artifacts.verify.verify``.
It exits with status 1 when any artifact has a problem."""

from __future__ import annotations

import typer

from rdpp_cli.artifacts.options import VerifyOptions
from rdpp_cli.cli.common import command_for


def exit_on_problems(results) -> None:
    """Status 1 when any artifact checked has a problem (the table lists every one)."""
    if not all(r.ok for r in results):
        raise typer.Exit(1)


command = command_for(VerifyOptions, "rdpp_cli.artifacts.verify:verify", """Check artifacts against their manifests: missing or changed files, changed or missing inputs.

    An artifact made (directly or through others) from one with a problem is reported too, naming
    it; a folder of the workspace without a manifest is a problem (an unfinished run is listed as
    such). Exits with status 1 when any artifact has a problem (every problem is listed).

    Example: rdpp verify
    """, after=exit_on_problems)
