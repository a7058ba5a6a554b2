"""`rdpp ls`: the command made from ``LsOptions``; the work is ``rdpp_cli.artifacts.listing.show``."""

from __future__ import annotations

from rdpp_cli.artifacts.options import LsOptions
from rdpp_cli.cli.common import command_for

command = command_for(LsOptions, "rdpp_cli.artifacts.listing:show", """List the workspace's artifacts: kind, created, settings, headline metrics, model, lineage.

    Example: rdpp ls --workspace runs
    """)
