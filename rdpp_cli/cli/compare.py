"""`rdpp compare`: the command made from ``CompareOptions``; the work is ``rdpp_cli.reporting.compare.compare``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.reporting.options import CompareOptions

command = command_for(CompareOptions, "rdpp_cli.reporting.compare:compare", """Put the models' caption sets side by side, per image: one HTML page (and a figure for a paper).

    Per image: the photo, the references, each model's captions with their CIDEr-D, the set's oracle and self-CIDEr; at the top the numbers and the diversity-accuracy plot; sort and filter in the page (docs/compare.md).

    Example: rdpp compare runs/samples/updown-small-v1.random-n10-v1 runs/samples/scst-v1.random-n10-v1 runs/samples/dpp-m5-v1.random-n10-v1 --labels XE,SCST,R-DPP

    Example: rdpp compare --models updown-small-v1.random-n10-v1,dpp-m5-v1.random-n10-v1 --figure ids.txt --format pdf
    """)
