"""`rdpp verify`: thin wrapper over ``rdpp_cli.artifacts.verify.verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rdpp_cli.cli.common import WorkspaceOpt, stage


@stage
def command(
    artifacts: Optional[list[str]] = typer.Argument(
        None, help="Artifacts to check (folders, names or group/name as `rdpp ls` shows; default: every one)."),
    quick: bool = typer.Option(False, "--quick", help="Check sizes and lineage only, not the files' sha256."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Check artifacts against their manifests: missing or changed files, changed or missing inputs.

    Exits with status 1 when any artifact has a problem (every problem is listed).

    Example: rdpp verify
    """
    from rdpp_cli.artifacts.verify import verify

    if not all(r.ok for r in verify(artifacts, workspace=workspace, quick=quick)):
        raise typer.Exit(1)
