"""The options of `rdpp score` and `rdpp plot`, declared once (rdpp_cli.options)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.coco_eval import METRICS
from rdpp_cli.metrics.self_cider import VARIANTS
from rdpp_cli.options import Options, argument, force_option, one_of, option, out_option, workspace_option


def metric_list(metrics: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``--metrics`` as a tuple in coco-caption's order of names given ("CIDEr,Bleu_4" or a list);
    every metric when None."""
    if not metrics:
        return tuple(METRICS)
    items = metrics if isinstance(metrics, (list, tuple)) else str(metrics).split(",")
    wanted = tuple(str(m).strip() for m in items if str(m).strip())
    bad = [m for m in wanted if m not in METRICS]
    if bad or not wanted:
        raise RdppError(f"unknown metric(s) {', '.join(bad) or '(none)'} in --metrics; choose from {','.join(METRICS)}")
    return wanted


@dataclass
class ScoreOptions(Options):
    section = "score"

    samples: str | None = argument(
        "Samples artifact (folder, workspace name or its samples.json; default: the newest), or a JSON file: "
        '[{"image_id", "captions": [...]}] or coco-caption results [{"image_id", "caption"}].', from_alias=True)
    data: str | None = option(
        None, "Data artifact whose split gives the references (default: the one the samples were made from; "
        "another is used with a warning line; for a JSON file: the newest).", identity=False)
    split: str | None = option(None, "Split of the data artifact (default: the samples' split, else test).")
    refs: Path | None = option(
        None, "COCO caption-annotation file (e.g. captions_val2014.json) instead of a data artifact.",
        identity=False, cli={"dir_okay": False})
    oracle: bool = option(False, "Also report best-of-n (oracle) scores for every metric.")
    top1: bool = option(False, "Also score each image's first caption alone (top-1); on by itself for samples made "
                        "with --select consensus, whose first caption is the best-ranked.")
    self_cider: bool = option(False, "Self-CIDEr diversity of each image's captions.")
    self_cider_variant: str = option(
        "cider-d", "cider-d (CIDEr-D kernel, singular values; docs/metrics.md#self-cider) or cider (plain CIDEr, "
        "eigenvalues).", check=one_of(*VARIANTS))
    diversity: bool = option(False, "Div-1, Div-2, mBLEU-4, distinct captions, vocabulary, novel captions.")
    plot: bool = option(False, "Write plot.png: the diversity-accuracy plane (implies --self-cider).")
    metrics: str | None = option(
        None, "Comma-separated subset of Bleu_1..Bleu_4,METEOR,ROUGE_L,CIDEr,SPICE (default: all).",
        check=lambda flag, value: metric_list(value))
    merge_duplicates: bool = option(
        False, 'Score the {"image_id", "caption"} entries that name one image again as that image\'s captions '
        "(default: an image named twice is refused).")
    out: Path | None = out_option("<workspace>/scores/<samples name>, then <samples name>-v2, ...")
    force: bool = force_option()
    workspace: Path | None = workspace_option()

    def validate(self) -> None:
        if self.refs is not None and self.data is not None:
            raise RdppError("give references either with --refs (a COCO annotation file) or --data, not both")


@dataclass
class PlotOptions(Options):
    """`rdpp plot`: scores artifacts on the diversity-accuracy plane."""

    section = "plot"

    scores: list[str] | None = argument(
        "Scores artifacts (folders or workspace names; default: every one in the workspace).")
    out: Path | None = option(None, "PNG to write (default: <workspace>/plots/diversity-accuracy.png).",
                              identity=False, record=False, cli={"dir_okay": False})
    labels: str | None = option(None, "Comma-separated point labels, one per artifact.")
    workspace: Path | None = workspace_option()

    def validate(self) -> None:
        labels = self.label_list()
        if labels is not None and self.scores and len(labels) != len(self.scores):
            raise RdppError(f"{len(labels)} labels for {len(self.scores)} scores artifacts; give one label each")

    def label_list(self) -> list[str] | None:
        return [x.strip() for x in self.labels.split(",")] if self.labels else None
