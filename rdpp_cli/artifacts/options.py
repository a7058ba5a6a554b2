"""The options of `rdpp ls` and `rdpp verify`, declared once (rdpp_cli.options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.options import Options, argument, option, workspace_option


@dataclass
class LsOptions(Options):
    """`rdpp ls`: the workspace's artifacts as a table."""

    section = "ls"

    workspace: Path | None = workspace_option()


@dataclass
class VerifyOptions(Options):
    """`rdpp verify`: the artifacts named (default: every one) checked against their manifests."""

    section = "verify"

    artifacts: list[str] | None = argument(
        "Artifacts to check (folders, names or group/name as `rdpp ls` shows; default: every one).")
    quick: bool = option(
        False, "Read no file's bytes: check sizes, lineage (inputs by manifest hash) and the hashes remembered when "
        "each file was last hashed (by a stage or a full verify); a file changed on disk since (another mtime or "
        "inode) is reported as not checked. Without --quick every file is hashed.")
    workspace: Path | None = workspace_option()
