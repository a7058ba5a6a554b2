"""`rdpp demo`: the command made from ``DemoOptions``; the work is ``rdpp_cli.demo.demo``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.demo import DemoOptions

command = command_for(DemoOptions, "rdpp_cli.demo:demo", """Run the whole chain on the bundled dataset and compare XE, SCST and R-DPP.

    prepro toy -> train-xe -> finetune scst -> finetune dpp (m=5) -> sample -> score -> plot;
    complete artifacts are reused, so a second run is fast.

    Example: rdpp demo --quick
    """)
