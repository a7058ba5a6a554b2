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
    quick: bool = typer.Option(
        False, "--quick", help="Read no file's bytes: check sizes, lineage (inputs by manifest hash) and the hashes "
        "remembered when each file was last hashed (by a stage or a full verify); a file changed on disk since "
        "(another mtime or inode) is reported as not checked. Without --quick every file is hashed."),
    workspace: Optional[Path] = WorkspaceOpt,
) -> None:
    """Check artifacts against their manifests: missing or changed files, changed or missing inputs.

    An artifact made (directly or through others) from one with a problem is reported too, naming
    it; a folder of the workspace without a manifest is a problem (an unfinished run is listed as
    such). Exits with status 1 when any artifact has a problem (every problem is listed).

    Example: rdpp verify
    """
    from rdpp_cli.artifacts.verify import verify

    if not all(r.ok for r in verify(artifacts, workspace=workspace, quick=quick)):
        raise typer.Exit(1)
