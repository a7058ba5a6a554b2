"""`rdpp export-hf`: the command made from ``ExportHFOptions``; the work is ``rdpp_cli.captioning.export_hf.export_hf``."""

from __future__ import annotations

from rdpp_cli.captioning.options import ExportHFOptions
from rdpp_cli.cli.common import command_for

command = command_for(ExportHFOptions, "rdpp_cli.captioning.export_hf:export_hf", """Write a --model hf model artifact as a Hugging Face folder (VisionEncoderDecoderModel.from_pretrained loads it).

    The vision encoder and image processor are those of the folder the model was trained from; the decoder is the trained one. --force replaces only an earlier export; --out never names what the export reads.

    Example: rdpp export-hf finetune/dpp-m5-v1 --out my-captioner
    """)
