"""`rdpp score`: accuracy, best-of-n oracle and diversity of generated captions.

Reads captions from a samples artifact (``samples.json``), a plain JSON
``[{"image_id", "captions": [...]}]`` or coco-caption results ``[{"image_id", "caption"}]``;
references from a data artifact's split (``captions.h5`` ``raw``) or a COCO caption-annotation
file (``--refs``). Writes a scores artifact: ``scores.json`` (sections ``accuracy``, ``oracle``,
``average``, ``top1``, ``diversity``, ``human``, ``settings``), ``per_image.csv`` and optionally ``plot.png``.
See docs/scoring.md for every definition.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rdpp_cli.artifacts import (
    Artifact,
    atomic_write_json,
    entry_name,
    finish,
    follow_input,
    is_complete,
    prepare_output,
    read_artifact,
    ref_name,
    resolve_input,
    sha256_file,
    write_manifest,
)
from rdpp_cli.artifacts.workspace import refuse_overlap, refuse_unwritable
from rdpp_cli.console import console, info, note, summary_table, warning
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics import coco_eval
from rdpp_cli.metrics import diversity as divstats
from rdpp_cli.metrics.cider import CiderD, DocFreq
from rdpp_cli.metrics.self_cider import self_cider_ragged
from rdpp_cli.options import takes
from rdpp_cli.scoring.options import ScoreOptions, metric_list

MAKE_SAMPLES = "rdpp sample --n 20 --method random"
# the longest caption scored: METEOR's Java process runs out of memory long before 20,000 words, and
# no caption (generated or written by a person) comes near this
MAX_CAPTION_WORDS = 1000


# ----------------------------------------------------------------------------------------------
# inputs
# ----------------------------------------------------------------------------------------------

@dataclass
class Samples:
    """Captions to score: ``captions[i]`` are the captions of image ``image_ids[i]``."""

    image_ids: list[int]
    captions: list[list[str]]
    source: Path
    artifact: Artifact | None = None

    @property
    def name(self) -> str:
        """The scores artifact's stem: the samples artifact's name (``dpp-m5-v1.random-n20-v1``: the
        scores say which samples, and so which model, they score), or the JSON file's stem."""
        return self.artifact.name if self.artifact is not None else (self.source.stem or "scores")


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise RdppError(f"{what} {path} does not exist; pass an existing JSON file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RdppError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); "
                        "fix the file or regenerate it") from None
    except UnicodeDecodeError:
        raise RdppError(f"{what} {path} is not UTF-8 text; save it as UTF-8 JSON") from None


def _image_id(entry: dict, path: Path, k: int) -> int:
    iid = entry.get("image_id")
    digits = isinstance(iid, str) and re.fullmatch(r"[0-9]+", iid.strip()) is not None  # not "²" nor "٣"
    if isinstance(iid, bool) or not (isinstance(iid, int) or digits):
        raise RdppError(f"{path}: entry {k} has no integer image_id (got {iid!r}); every entry needs one")
    return int(iid)


def _checked_caption(c: Any, path: Path, iid: int, what: str) -> str:
    """``c``, a caption of image ``iid`` in ``path``, when it is a string of at most ``MAX_CAPTION_WORDS`` words."""
    if not isinstance(c, str):
        raise RdppError(f"{path}: image {iid}: {what} must be a string")
    if len(c.split()) > MAX_CAPTION_WORDS:
        raise RdppError(f"{path}: image {iid} has a caption of {len(c.split()):,} words ({c[:40]!r}...), over the "
                        f"{MAX_CAPTION_WORDS:,} rdpp scores; shorten or remove it")
    return c


def parse_samples(data: Any, path: Path, merge_duplicates: bool = False) -> tuple[list[int], list[list[str]]]:
    """``[{"image_id", "captions": [...]}]`` or ``[{"image_id", "caption"}]``. An image named twice is
    refused, unless ``merge_duplicates``: then the ``caption`` entries of an image are grouped, in order."""
    if not isinstance(data, list) or not data:
        raise RdppError(f"{path} must hold a non-empty JSON list of {{\"image_id\", \"captions\": [...]}} "
                        "or {\"image_id\", \"caption\"} entries")
    order: list[int] = []
    caps: dict[int, list[str]] = {}
    form = None
    for k, e in enumerate(data):
        if not isinstance(e, dict):
            raise RdppError(f"{path}: entry {k} is a {type(e).__name__}, not an object with image_id and captions")
        this = "captions" if "captions" in e else "caption" if "caption" in e else None
        if this is None:
            raise RdppError(f"{path}: entry {k} has neither 'captions' (a list) nor 'caption' (a string)")
        if form is None:
            form = this
        elif this != form:
            raise RdppError(f"{path}: entries mix 'captions' and 'caption'; use one form for the whole file")
        iid = _image_id(e, path, k)
        if form == "captions":
            c = e["captions"]
            if not isinstance(c, list):
                raise RdppError(f"{path}: image {iid}: 'captions' must be a list of strings")
            c = [_checked_caption(x, path, iid, "each of 'captions'") for x in c]
            if not c:
                raise RdppError(f"{path}: image {iid} has an empty caption list; every image needs at least one caption")
            if iid in caps:
                raise RdppError(f"{path}: image {iid} appears twice; give each image one entry with all its captions")
            caps[iid] = list(c)
            order.append(iid)
        else:
            c = _checked_caption(e["caption"], path, iid, "'caption'")
            if iid in caps and not merge_duplicates:
                raise RdppError(f"{path}: entry {k} names image {iid} again; pass --merge-duplicates to score "
                                "its captions together, or give each image one entry")
            if iid not in caps:
                caps[iid] = []
                order.append(iid)
            caps[iid].append(c)
    return order, [caps[i] for i in order]


def load_samples(samples: str | Path | None, workspace: Path | str | None, merge_duplicates: bool = False) -> Samples:
    """A samples artifact (folder, workspace name or the ``samples.json`` inside it; default: the
    newest) or a plain JSON file of captions."""
    if samples is not None and Path(samples).is_file():
        path = Path(samples)
        art = _artifact_holding(path)
        if art is None:
            ids, caps = parse_samples(_read_json(path, "samples file"), path, merge_duplicates)
            return Samples(ids, caps, path)
    else:
        art = resolve_input(samples, workspace=workspace, groups=("samples",), kind="rdpp.samples",
                            what="samples", make_with=MAKE_SAMPLES)
    path = art.file("samples.json")
    ids, caps = parse_samples(_read_json(path, "samples file"), path, merge_duplicates)
    return Samples(ids, caps, path, art)


def _artifact_holding(path: Path) -> Artifact | None:
    """The samples artifact whose manifest lists the file ``path`` (its ``samples.json``), else None:
    a samples.json inside a samples artifact is that artifact, with its lineage."""
    folder = path.parent if path.parent != Path(".") else Path.cwd()
    if not is_complete(folder):
        return None
    art = read_artifact(folder)
    if art.kind == "rdpp.samples" and path.name == "samples.json" and path.name in art.manifest.get("files", {}):
        return art
    return None


def load_coco_refs(path: Path) -> dict[int, list[str]]:
    """A COCO caption-annotation file: ``{"annotations": [{"image_id", "caption"}, ...]}``."""
    data = _read_json(path, "references file")
    anns = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(anns, list) or not anns:
        raise RdppError(f"{path} is not a COCO caption-annotation file (no 'annotations' list); "
                        "pass e.g. captions_val2014.json to --refs")
    refs: dict[int, list[str]] = {}
    for k, a in enumerate(anns):
        if not isinstance(a, dict) or not isinstance(a.get("caption"), str):
            raise RdppError(f"{path}: annotation {k} has no 'caption' string")
        iid = _image_id(a, path, k)
        refs.setdefault(iid, []).append(_checked_caption(a["caption"], path, iid, "'caption'"))
    return refs


@dataclass
class References:
    refs: list[list[str]]  # per scored image
    source: str  # for the settings
    data: Any = None  # DataArtifact when read from one
    artifact: Artifact | None = None


def _data_artifact(data: str | Path | None, samples: Samples, workspace) -> Artifact:
    """The data artifact the samples record (found by its manifest hash), or ``--data``: another
    one than the samples' own is used with a warning line naming both; for a plain JSON file,
    ``--data`` or else the newest."""
    make = "rdpp prepro toy` or `rdpp prepro coco"
    entry = samples.artifact.input_of_kind("rdpp.data") if samples.artifact is not None else None
    if entry is not None and data is None:
        return follow_input(samples.artifact, "rdpp.data", None, workspace=workspace, what="data artifact",
                            make_with=make, refused="")
    art = resolve_input(data, workspace=workspace, groups=("data",), kind="rdpp.data", what="data artifact",
                        make_with=f"{make} (or pass --refs captions_val2014.json)", option="--data")
    if entry is not None and art.manifest_sha256 != entry.get("manifest_sha256"):
        warning(f"scoring {ref_name(samples.artifact)}, made from data artifact {entry_name(entry)}, against the "
                f"references of --data {ref_name(art)}, another data artifact; the scores record {ref_name(art)}")
    return art


def load_references(samples: Samples, *, data, split: str, refs: Path | None, workspace) -> References:
    ids = samples.image_ids
    if refs is not None:
        table = load_coco_refs(Path(refs))
        missing = [i for i in ids if i not in table]
        if missing:
            raise RdppError(f"{len(missing)} image ids of {samples.source} are not in {refs} "
                            f"(e.g. {', '.join(map(str, missing[:3]))}); score captions of those images")
        return References([table[i] for i in ids], f"{refs} (COCO annotations)")
    from rdpp_cli.data.dataset import DataArtifact

    art = _data_artifact(data, samples, workspace)
    ds = DataArtifact(art)
    rows = ds.split_indices(split)
    row_of = {int(i): int(r) for i, r in zip(ds.image_ids[rows], rows)}
    missing = [i for i in ids if i not in row_of]
    if missing:
        raise RdppError(f"{len(missing)} image ids of {samples.source} are not in split '{split}' of {art.path} "
                        f"(e.g. {', '.join(map(str, missing[:3]))}); pass the split they come from with --split, "
                        "or the data artifact they come from with --data")
    if len(ids) < len(rows):
        info(f"scoring {len(ids)} of the {len(rows)} '{split}' images of {art.path}")
    return References(ds.references_raw([row_of[i] for i in ids]), f"{art.path} split {split}", ds, art)


def training_captions(ds) -> list[str]:
    """Raw reference sentences of the data artifact's training images."""
    import h5py

    rows = np.flatnonzero(ds.split == "train")
    with h5py.File(ds.path / "captions.h5", "r") as f:
        raw = f["raw"][:]
    out = []
    for i in rows:
        out.extend(v.decode() if isinstance(v, bytes) else str(v) for v in raw[ds.label_start[i]:ds.label_end[i]])
    return out


# ----------------------------------------------------------------------------------------------
# the stage
# ----------------------------------------------------------------------------------------------

def _nanmean(x) -> float | None:
    x = np.asarray(x, dtype=np.float64)
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else None


def self_cider_df(data, tok_refs: list[list[str]]) -> tuple[DocFreq, str]:
    """The document frequencies of self-CIDEr and where they come from: the training references of
    the data artifact ``data`` (a DataArtifact), else (None) the PTB-tokenized references ``tok_refs``."""
    if data is not None:
        # PTB tokens are lower case: match the vocabulary's words in lower case ("UNK" -> "unk")
        words = [w.lower() for w in data.words]
        if len(set(words)) != len(words):
            words = list(data.words)
        return (DocFreq.from_h5(data.cider_df_path, words=words),
                f"train ({data.cider_df_path})")
    return DocFreq.from_references(tok_refs), "references of the scored images (corpus)"


@takes(ScoreOptions)
def score(opts: ScoreOptions) -> Path:
    """Score generated captions and write a scores artifact; returns its folder.

    ``opts.samples``: a samples artifact (folder or workspace name; None = the newest) or a JSON file.
    References: ``opts.refs`` (a COCO caption-annotation file) or the split of the data artifact
    ``opts.data`` (default: the one recorded in the samples manifest). ``oracle``, ``self_cider``
    (``self_cider_variant``), ``diversity`` and ``plot`` add those sections; ``metrics`` picks a
    subset of the coco-caption metrics ("CIDEr,Bleu_4" or a list). See docs/scoring.md.
    """
    wanted = metric_list(opts.metrics)
    smp = load_samples(opts.samples, opts.workspace, opts.merge_duplicates)
    split = opts.split or (smp.artifact.config.get("split") if smp.artifact is not None else None) or "test"
    ref = load_references(smp, data=opts.data, split=split, refs=opts.refs, workspace=opts.workspace)
    refuse_overlap(opts.out, _reads(smp, ref, opts))  # now, not after the evaluation
    refuse_unwritable(opts.out, workspace=opts.workspace, group="scores")
    coco_eval.java()  # one clear line before any work when Java is missing
    ev = coco_eval.evaluate(smp.captions, ref.refs, metrics=wanted)
    names = [m for m in coco_eval.METRICS if m in wanted]
    sections, per_image = _accuracy(ev, names, opts.oracle)
    selected = smp.artifact.config.get("select") if smp.artifact is not None else None
    sections["top1"], per_top1 = _top1(ev, names) if opts.top1 or selected == "consensus" else ({}, {})
    div, per_div, human, df_source = _diversity(smp, ref, ev, opts)
    settings = _settings(opts, smp, ref, split, names, ev, df_source, bool(sections["top1"]))
    result = {**sections, "diversity": div, "human": human, "settings": settings}
    frame = _per_image_frame(smp, ev, *per_image, {**per_top1, **per_div})
    path = _write(opts, smp, ref, result, names, frame)
    _print(result, names, path, smp)
    return path


def _reads(smp: Samples, ref: References, opts: ScoreOptions) -> list:
    """What score reads, which --out may not overwrite: the samples and data artifacts, a samples file, --refs."""
    return [*(a.path for a in (smp.artifact, ref.artifact) if a), smp.source, opts.refs]


def _accuracy(ev, names: list[str], oracle: bool) -> tuple[dict, tuple[dict, dict]]:
    """The accuracy, average and oracle sections, and the per-image mean and best of each metric."""
    per_mean = {m: divstats.oracle(ev.per_caption[m])[1] for m in ev.per_caption}
    per_best = {m: divstats.oracle(ev.per_caption[m])[0] for m in ev.per_caption}
    sections = {
        "accuracy": {m: ev.corpus.get(m) for m in names},
        "oracle": {m: _nanmean(per_best[m]) if m in per_best else None for m in names} if oracle else {},
        "average": {m: _nanmean(per_mean[m]) if m in per_mean else None for m in names},
    }
    return sections, (per_mean, per_best if oracle else {})


def _top1(ev, names: list[str]) -> tuple[dict, dict]:
    """The top1 section: coco-caption's evaluation of each image's first caption alone (the
    standard one-caption-per-image evaluation: BLEU and METEOR aggregated over those captions),
    and its per-image columns ``<metric>_top1``. Reuses the tokenized captions and references."""
    first = coco_eval.evaluate([c[:1] for c in ev.captions], ev.refs, tokenize=False,
                               metrics=tuple(m for m in names if m not in ev.skipped))
    cols = {f"{m}_top1": np.array([c[0] for c in first.per_caption[m]]) for m in names if m in first.per_caption}
    return {m: first.corpus.get(m) for m in names}, cols


def _diversity(smp: Samples, ref: References, ev, opts: ScoreOptions) -> tuple[dict, dict, dict | None, str | None]:
    """The diversity section, its per-image columns, the human point and the df self-CIDEr used."""
    div: dict[str, Any] = dict.fromkeys(("self_cider", "div1", "div2", "mbleu4", "distinct", "vocab", "novel",
                                         "bad_ending", "unk_ending"))
    per_div: dict[str, np.ndarray] = {}
    human = df_source = None
    if opts.self_cider or opts.plot:  # the plot's x axis is self-CIDEr
        df, df_source = self_cider_df(ref.data, ev.refs)
        n_per = np.array([len(c) for c in smp.captions])
        if n_per.max() < 2:
            note("self-CIDEr needs at least 2 captions per image; these samples have 1, so it is left out")
        else:
            per_div["self_cider"] = self_cider_ragged(ev.captions, df, opts.self_cider_variant)
            div["self_cider"] = float(per_div["self_cider"][n_per >= 2].mean())
        human = human_point(ev.refs, df, opts.self_cider_variant)
    if opts.diversity:
        _lexical_diversity(ev, ref, div, per_div)
    return div, per_div, human, df_source


def _lexical_diversity(ev, ref: References, div: dict, per_div: dict) -> None:
    """Div-1/2, mBLEU-4, distinct captions, vocabulary, endings and novel captions, into ``div``/``per_div``."""
    for key, fn in (("div1", lambda c: divstats.div_n(c, 1)), ("div2", lambda c: divstats.div_n(c, 2)),
                    ("mbleu4", divstats.mbleu4), ("distinct", divstats.distinct_captions),
                    ("bad_ending", divstats.ending_share)):  # PTB-tokenized: lower case
        per_div[key] = fn(ev.captions)
        div[key] = _nanmean(per_div[key])
    div["vocab"] = divstats.vocabulary_size(ev.captions)
    if ref.data is None:
        note("novel-caption fraction needs the training captions of a data artifact; left out with --refs")
        return
    per_div["unk_ending"] = divstats.ending_share(ev.captions, {"unk"})
    div["unk_ending"] = _nanmean(per_div["unk_ending"])
    # training references are sentences as written: both sides in Karpathy's tokens (lower case,
    # letters and digits), without sending every training caption through Java
    from rdpp_cli.data.karpathy import tokenize

    train = [" ".join(tokenize(c)) for c in training_captions(ref.data)]
    mine = [[" ".join(tokenize(c)) for c in caps] for caps in ev.captions]
    div["novel"] = divstats.novel_fraction(mine, train)


def _settings(opts: ScoreOptions, smp: Samples, ref: References, split: str, names: list[str], ev,
              df_source: str | None, top1: bool) -> dict:
    n_per = np.array([len(c) for c in smp.captions])
    self_cider = opts.self_cider or opts.plot
    return {
        "references": ref.source,
        "split": split if ref.data is not None else None,
        "images": len(smp.image_ids),
        "captions_per_image": int(n_per[0]) if (n_per == n_per[0]).all() else [int(n_per.min()), int(n_per.max())],
        "tokenizer": "ptb (coco-caption PTBTokenizer -lowerCase, punctuation removed)",
        "metrics": list(names),
        "skipped": ev.skipped,
        "cider": "CIDEr-D, document frequencies of the references (one document per image), as coco-caption",
        "df_source": df_source,
        "self_cider_variant": opts.self_cider_variant if self_cider else None,
        "oracle": "best of n per image, mean over images" if opts.oracle else None,
        "top1": "each image's first caption alone, coco-caption's evaluation" if top1 else None,
    }


def _write(opts: ScoreOptions, smp: Samples, ref: References, result: dict, names: list[str], frame) -> Path:
    """The scores artifact: scores.json, per_image.csv, plot.png (``--plot``) and the manifest."""
    self_cider = opts.self_cider or opts.plot
    options = {"split": result["settings"]["split"], "oracle": opts.oracle, "self_cider": self_cider,
               "self_cider_variant": opts.self_cider_variant if self_cider else None, "diversity": opts.diversity,
               "plot": opts.plot, "metrics": list(names), **({"top1": True} if result["top1"] else {})}
    refs = str(opts.refs) if opts.refs is not None else None
    config = {"samples": ref_name(smp.artifact) if smp.artifact is not None else str(smp.source),
              "data": ref_name(ref.artifact) if ref.artifact is not None else None, "refs": refs, **options}
    identity = {"samples_sha256": smp.artifact.manifest_sha256 if smp.artifact is not None else sha256_file(smp.source),
                "data_sha256": ref.artifact.manifest_sha256 if ref.artifact is not None else None,
                "refs": refs, **options}
    path = prepare_output(opts.out, workspace=opts.workspace, group="scores", name=smp.name, kind="rdpp.scores",
                          config=identity, force=opts.force, reads=_reads(smp, ref, opts))
    atomic_write_json(path / "scores.json", result)
    frame.to_csv(path / "per_image.csv", index=False)
    div, accuracy = result["diversity"], result["accuracy"]
    if opts.plot:
        from rdpp_cli.scoring.plot import ONE_CAPTION, plot_points

        plot_points([(smp.name, div["self_cider"], accuracy.get("CIDEr"))], result["human"], path / "plot.png",
                    why={smp.name: ONE_CAPTION})  # --plot computes self-CIDEr: None means one caption per image
    summary = {"CIDEr": accuracy.get("CIDEr"), "oracle_CIDEr": result["oracle"].get("CIDEr"),
               "top1_CIDEr": result["top1"].get("CIDEr"), "self_cider": div["self_cider"]}
    write_manifest(path, "rdpp.scores", config, inputs=[a for a in (smp.artifact, ref.artifact) if a is not None],
                   summary={k: v for k, v in summary.items() if v is not None})
    finish(path)
    return path


def human_point(tok_refs: list[list[str]], df: DocFreq, variant: str) -> dict | None:
    """The human references as a point of the plane: leave-one-out CIDEr-D (each reference against
    the image's other references, the evaluation's corpus document frequencies) and their own
    self-CIDEr (same df and variant as the samples)."""
    keep = [i for i, r in enumerate(tok_refs) if len(r) >= 2]
    if not keep:
        return None
    refs = [tok_refs[i] for i in keep]
    hyps, sets = [], []
    for rs in refs:
        for j in range(len(rs)):
            hyps.append(rs[j])
            sets.append(rs[:j] + rs[j + 1:])
    corpus_df = DocFreq.from_references(refs)
    loo = CiderD(corpus_df).score(hyps, sets)
    sc = self_cider_ragged(refs, df, variant)
    return {"cider_leave_one_out": float(loo.mean()), "self_cider": float(sc.mean()), "images": len(keep)}


def _per_image_frame(smp: Samples, ev, per_mean: dict, per_best: dict, per_div: dict):
    import pandas as pd

    cols: dict[str, Any] = {"image_id": smp.image_ids, "captions": [len(c) for c in smp.captions]}
    for m in coco_eval.METRICS:
        if m in per_mean:
            cols[m] = per_mean[m]
        if m in per_best:
            cols[f"{m}_oracle"] = per_best[m]
    for k, v in per_div.items():
        cols[k] = v
    return pd.DataFrame(cols)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def _print(result: dict, names: list[str], path: Path, smp: Samples) -> None:
    from rich.table import Table

    table = Table(title=f"scores of {smp.source if smp.artifact is None else smp.artifact.path}",
                  title_justify="left")
    cols = [("all captions (coco-caption)", result["accuracy"])]
    if result["oracle"]:
        cols += [("mean per caption", result["average"]), ("oracle (best of n)", result["oracle"])]
    if result["top1"]:
        cols.append(("top-1 (first caption)", result["top1"]))
    table.add_column("metric", style="bold")
    for title, _ in cols:
        table.add_column(title)
    pad = [""] * (len(cols) - 1)
    for m in names:
        table.add_row(m, *[_fmt(section.get(m)) for _, section in cols])
    for k, v in result["diversity"].items():
        if v is not None:
            table.add_row(k, _fmt(v), *pad)
    if result["human"]:
        h = result["human"]
        table.add_row("human: CIDEr (leave-one-out) / self-CIDEr",
                      f"{h['cider_leave_one_out']:.4f} / {h['self_cider']:.4f}", *pad)
    console.print(table)
    s = result["settings"]
    console.print(summary_table("rdpp score", [
        ("artifact", path), ("images", s["images"]), ("captions per image", s["captions_per_image"]),
        ("references", s["references"]), ("files", "scores.json, per_image.csv" + (
            ", plot.png" if (path / "plot.png").exists() else "")),
    ]))
