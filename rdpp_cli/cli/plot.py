"""`rdpp plot`: the command made from ``PlotOptions``; the work is ``rdpp_cli.scoring.plot.plot``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.scoring.options import PlotOptions

command = command_for(PlotOptions, "rdpp_cli.scoring.plot:plot", """Plot scores artifacts on the diversity-accuracy plane (the paper's Fig. 1) with the human point.

    Example: rdpp plot runs/scores/updown-small-v1.random-n20-v1 runs/scores/dpp-m5-v1.random-n20-v1 --labels XE,R-DPP
    """)
