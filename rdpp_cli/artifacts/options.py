"""The options of `rdpp ls` and `rdpp verify`, declared once (rdpp_cli.options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.options import Options, workspace_option


@dataclass
class LsOptions(Options):
    """`rdpp ls`: the workspace's artifacts as a table."""

    section = "ls"

    workspace: Path | None = workspace_option()
