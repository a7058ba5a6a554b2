"""The options of `rdpp caption`, declared once (rdpp_cli.options); the decoding ones are
``DecodingOptions``'s (rdpp_cli.decoding.config), shared with `rdpp sample`. No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.decoding.config import DecodingOptions, method_option
from rdpp_cli.errors import RdppError
from rdpp_cli.options import (Options, argument, at_least, device_option, force_option, option, out_option,
                              workspace_option)
from rdpp_cli.options import seed as seed_check


@dataclass
class CaptionOptions(DecodingOptions):
    """`rdpp caption PATH…`: ``n`` captions per photo (default: beam search, one caption)."""

    section = "caption"

    paths: list[Path] = argument("Image files, or folders of them (searched recursively).", required=True)
    model: str | None = option(None, "Model artifact (name or path); default: the newest fine-tuned, else XE model.",
                               "--from", identity=False, record=False)
    method: str = method_option("beam")
    n: int = option(1, "Captions per photo.", check=at_least(1))
    weights: Path | None = option(None, "The backbone's weights file (for an hf:DIR backbone, its folder), when it "
                                  "moved since prepro (same sha256).", identity=False, record=False)
    batch_size: int | None = option(None, "Images per extraction batch (default: the data's).", identity=False,
                                    record=False, check=at_least(1))
    workers: int | None = option(None, "Processes decoding images (default: on a GPU the cores but one; on a CPU a "
                                 "quarter of them).", identity=False, record=False, check=at_least(0))
    seed: int = option(0, "Seed of the sampling generator.", check=seed_check)
    device: str = device_option()
    out: Path | None = out_option("<workspace>/captions/<model name>.<method>-n<n>-v<k>")
    force: bool = force_option()
    workspace: Path | None = workspace_option()

    def validate(self) -> None:
        if not self.paths:
            raise RdppError("no photos given; pass image files or folders of them (rdpp caption PATH…)")
        self.decode_config(self.n)  # the decoding settings make sense, before any photo is read


@dataclass
class ExportHFOptions(Options):
    """`rdpp export-hf MODEL --out DIR`: a model artifact of ``--model hf`` as a Hugging Face folder."""

    section = "export_hf"

    model: str | None = argument("Model artifact (name or path) of a --model hf run.", required=True, from_alias=True)
    target: Path | None = argument("Same as --out (rdpp export-hf MODEL OUT).", cli={"metavar": "OUT"})
    out: Path | None = option(None, "The folder to write (VisionEncoderDecoderModel.from_pretrained loads it).",
                              identity=False, record=False)
    hf_model: str | None = option(None, "The save_pretrained folder whose vision encoder and image processor go with "
                                  "the decoder (default: the one the model was trained from).")
    replace: bool = option(False, "Replace an earlier export in --out.", "--force", identity=False, record=False)
    workspace: Path | None = workspace_option()

    def validate(self) -> None:
        if self.target is not None and self.out is not None and Path(self.target) != Path(self.out):
            raise RdppError(f"OUT {self.target} and --out {self.out} name different folders; give one of them")
        self.out = self.out if self.out is not None else self.target
        self.target = None
        if self.out is None:
            raise RdppError("no folder to write; pass --out DIR (rdpp export-hf MODEL --out DIR)")
