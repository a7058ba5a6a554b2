"""`rdpp sample`: the command made from ``SampleOptions``; the work is ``rdpp_cli.decoding.sample.sample``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.decoding.options import SampleOptions

command = command_for(SampleOptions, "rdpp_cli.decoding.sample:sample", """Decode n captions per image (greedy, beam, random, topk, nucleus, dbs).

    Example: rdpp sample --n 20 --method random

    Example: rdpp sample --n 5 --select dpp --candidates 50

    Example: rdpp sample --n 5 --select consensus --candidates 100
    """)
