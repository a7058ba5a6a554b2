"""`rdpp caption`: the command made from ``CaptionOptions``; the work is ``rdpp_cli.captioning.caption.caption``."""

from __future__ import annotations

from rdpp_cli.captioning.options import CaptionOptions
from rdpp_cli.cli.common import command_for

command = command_for(CaptionOptions, "rdpp_cli.captioning.caption:caption", """Caption your own photos: results JSON + an HTML contact sheet (thumbnails with their captions).

    Features are extracted exactly as the model's data artifact did (backbone, weights, size, grid).

    Example: rdpp caption photos/ --method random --n 5
    """)
