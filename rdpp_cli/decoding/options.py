"""The options of `rdpp sample`, declared once (rdpp_cli.options); the decoding ones are
``DecodingOptions``'s (rdpp_cli.decoding.config), shared with `rdpp caption`. No torch here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.decoding.config import DecodingOptions, method_option
from rdpp_cli.errors import RdppError
from rdpp_cli.options import (argument, at_least, device_option, force_option, option, out_option,
                              precision_option, workspace_option)
from rdpp_cli.options import seed as seed_check

SELECT_CLI = {"rich_help_panel": "Selection (--select)"}


@dataclass
class SampleOptions(DecodingOptions):
    """`rdpp sample`: ``n`` captions per image of a split; with ``select``, ``candidates`` captions
    decoded per image of which ``n`` are kept."""

    section = "sample"

    model: str | None = argument("Model artifact (path or name); default: the newest fine-tuned, else XE model.",
                                 from_alias=True)
    method: str = method_option("random")
    data: str | None = option(None, "Data artifact; default: the one the model was trained on.", identity=False,
                              record=False)
    split: str = option("test", "train, val or test.")
    n: int = option(20, "Captions per image.", check=at_least(1))
    batch_size: int = option(50, "Images per decoding batch.", check=at_least(1))
    max_images: int | None = option(None, "Only the first N images of the split.", check=at_least(1))
    seed: int = option(0, "Seed of the sampling generator.", check=seed_check)
    select: str | None = option(None, "Keep n of --candidates per image: dpp, mbr, logprob or consensus.",
                                cli=SELECT_CLI)
    candidates: int = option(50, "Captions decoded per image for --select.", cli=SELECT_CLI)
    quality: str | None = option(None, "--select dpp's quality: consensus (default) or logprob.", cli=SELECT_CLI)
    # recorded with the selection's settings (SelectConfig.settings), only for --select consensus
    neighbours: int | None = option(None, "--select consensus: rank against the captions of this many nearest "
                                    "training images (default 60).", record=False, cli=SELECT_CLI)
    keep_candidates: bool = option(False, "Also write every candidate of --select.", cli=SELECT_CLI)
    device: str = device_option()
    precision: str = precision_option()
    out: Path | None = out_option("<workspace>/samples/<model name>.<method>-n<n>-v<k>")
    force: bool = force_option()
    workspace: Path | None = workspace_option()

    def validate(self) -> None:
        if self.keep_candidates and self.select is None:
            raise RdppError("--keep-candidates keeps the candidates of --select; add --select dpp|mbr|logprob|consensus")
        self.selection()
        self.decode_config(self.decoded_per_image)  # the decoding settings make sense, before any work

    @property
    def decoded_per_image(self) -> int:
        """Captions the decoder makes per image: the ``candidates`` with ``select``, else the ``n`` captions."""
        return self.candidates if self.select is not None else self.n

    def selection(self):
        """The checked ``SelectConfig`` of ``select`` (None without it); RdppError (one line)."""
        if self.select is None:
            return None
        from rdpp_cli.decoding.select import SelectConfig  # torch: only when a stage runs

        try:
            return SelectConfig(self.select, self.candidates, self.quality, self.neighbours).check(self.n)
        except ValueError as e:
            raise RdppError(str(e)) from None
