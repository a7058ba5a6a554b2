"""`rdpp score`: the command made from ``ScoreOptions``; the work is ``rdpp_cli.scoring.score.score``."""

from __future__ import annotations

from rdpp_cli.cli.common import command_for
from rdpp_cli.scoring.options import ScoreOptions

command = command_for(ScoreOptions, "rdpp_cli.scoring.score:score", """Score generated captions: coco-caption accuracy, best-of-n oracle and diversity.

    References come from a data artifact's split or a COCO annotation file, so rdpp also works as a
    standalone evaluator. Writes a scores artifact (scores.json, per_image.csv, plot.png).

    Example: rdpp score --oracle --self-cider

    Example: rdpp score results.json --refs captions_val2014.json
    """)
