"""`rdpp table`: the command made from ``TableOptions``; the work is ``rdpp_cli.reporting.table.table``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.reporting.options import TableOptions

command = command_for(TableOptions, "rdpp_cli.reporting.table:table", """Print the comparison tables of a workspace's runs (Markdown, CSV or rich).

    Reads the scores, samples and model artifacts by the names examples/sweep.sh and examples/real_photos.sh give them (docs/scoring.md#comparison-tables); loads no torch.

    Example: rdpp table toy --workspace runs-sweep

    Example: rdpp table selection --workspace runs-sweep --plot runs-sweep/selection.png --format csv
    """)
