"""``rdpp prepro coco``: Karpathy JSON + images -> data artifact (vocab, captions, features, df).

Everything that can be wrong with the input (caption file, image files, backbone, weights, imported
features) is checked by ``plan_prepro`` before the output folder is claimed; ``write_data_artifact``
then writes vocab.json, captions.h5 and cider_df.h5 (small, rewritten atomically on every run) and
features.h5 (large, resumable), then the manifest. ``rdpp prepro toy`` runs the same two steps on
the generated set. File formats: docs/architecture.md; decisions: docs/data.md.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from rdpp_cli.artifacts import Artifact, atomic_write_bytes, atomic_write_json, finish, is_complete, prepare_output, write_manifest
from rdpp_cli.artifacts.manifest import file_ref, workspace_root
from rdpp_cli.artifacts.workspace import workspace_dir
from rdpp_cli.console import console, info, note, progress, summary_table
from rdpp_cli.data import vocab as V
from rdpp_cli.data.backbones import Backbone, build_backbone
from rdpp_cli.data.caption_files import CaptionSource, read_caption_files
from rdpp_cli.data.options import PreproCocoOptions, parse_threshold
from rdpp_cli.data.dataset_paths import find_images_root, find_karpathy_json
from rdpp_cli.data.features import FeatureWriter, check_images, default_workers, extract_features
from rdpp_cli.data.importers import FeatureSource
from rdpp_cli.data.karpathy import ImageRecord, load_karpathy, records_from_dataset
from rdpp_cli.device import resolve_device
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.cider import DocFreq
from rdpp_cli.metrics.train_cider import doc_freq_with_eos, eos_id
from rdpp_cli.options import takes

KIND = "rdpp.data"
RUNTIME_ONLY = ("workers", "device")


@dataclass
class PreproPlan:
    """Checked inputs of a data artifact: what ``write_data_artifact`` turns into files."""

    records: list[ImageRecord]
    karpathy_json: Path
    word_count_threshold: int  # resolved (``auto`` -> vocab.auto_threshold of the training images)
    max_length: int
    dtype: str
    batch_size: int
    workers: int
    device: str
    images_root: Path | None = None
    image_paths: list[Path] = field(default_factory=list)
    backbone: Backbone | None = None
    features_from: FeatureSource | None = None
    source: CaptionSource | None = None  # --captions: the files read and the Karpathy-form dataset made of them


def plan_prepro(opts: PreproCocoOptions) -> PreproPlan:
    """Read and check every input ``opts`` names; raises RdppError (one line) on the first problem.
    Writes nothing. ``word_count_threshold="auto"``: ``vocab.auto_threshold`` of the training images;
    ``workers=None``: ``features.default_workers()`` for the device."""
    threshold = parse_threshold(opts.word_count_threshold)
    json_path, records, source = read_captions(opts.karpathy_json, opts.captions, opts.images_root,
                                               restval_to_train=opts.restval_to_train,
                                               need_files=opts.features_from is None, workspace=opts.workspace)
    splits = Counter(r.split for r in records)
    if not splits.get("train"):
        raise RdppError(f"{json_path} has no training images (split train or restval); the vocabulary is built from them")
    if threshold is None:
        threshold = V.auto_threshold(splits["train"])
    # imported features decode no image: no workers, and --device is not used
    plan = PreproPlan(records, json_path, threshold, opts.max_length, opts.dtype, opts.batch_size, opts.workers or 0,
                      opts.device, source=source)
    if opts.features_from is not None:
        plan.features_from = FeatureSource(opts.features_from, [r.image_id for r in records])
        return plan
    dev = resolve_device(opts.device)
    if opts.workers is None:
        plan.workers = default_workers(dev.type)
    plan.backbone = build_backbone(opts.backbone, att_size=opts.att_size, image_size=opts.image_size,
                                   weights=opts.weights, pretrained=opts.pretrained)
    plan.images_root = (source.images_root if source is not None and source.images_root is not None
                        else find_images_root(opts.images_root, json_path, records[0].relpath))
    plan.image_paths = [plan.images_root / r.relpath for r in records]
    check_images(plan.image_paths, plan.images_root, workers=max(1, plan.workers))
    return plan


def read_captions(karpathy_json: Path | None, captions: Sequence[Path] | None, images_root: Path | None, *,
                  restval_to_train: bool, need_files: bool,
                  workspace: Path | None) -> tuple[Path, list[ImageRecord], CaptionSource | None]:
    """The caption file named first, its checked records, and with ``--captions`` the files read
    (``caption_files``: any format, turned into a Karpathy-form dataset read by the same code as a
    ``--karpathy-json``; a ``--karpathy-json`` given beside them gives their splits)."""
    if not captions:
        json_path = find_karpathy_json(karpathy_json, workspace)
        return json_path, load_karpathy(json_path, restval_to_train=restval_to_train, need_files=need_files), None
    files = [*captions, *([karpathy_json] if karpathy_json is not None else [])]
    source = read_caption_files(files, images_root, need_files=need_files)
    first = source.files[0][0]
    where = f"the dataset made of {first}" if source.derived else first
    return first, records_from_dataset(source.dataset, where, restval_to_train, need_files), source


FILES = ("vocab.json", "captions.h5", "features.h5", "cider_df.h5")
DATASET_JSON = "dataset.json"  # with --captions in another format than Karpathy's: the dataset made of them


def write_data_artifact(out_dir: Path, plan: PreproPlan, config: dict, *, title: str = "rdpp prepro",
                        keep: tuple[str, ...] = ()) -> Artifact:
    """Write every file of the data artifact into the claimed ``out_dir`` and its manifest.

    Anything else in the folder (left by an artifact replaced with ``--force``) is removed first,
    except the names in ``keep`` (the toy's ``source/``).
    """
    out_dir = Path(out_dir)
    derived = plan.source is not None and plan.source.derived
    _drop_strangers(out_dir, set(FILES) | set(keep) | ({DATASET_JSON} if derived else set()))
    if derived:  # where the captions came from: the Karpathy-form dataset the caption files made
        atomic_write_json(out_dir / DATASET_JSON, plan.source.dataset, indent=None)
    text = _write_text_side(out_dir, plan)
    features_hash, feat_desc, speed = _write_features(out_dir / "features.h5", plan, text.image_ids)

    splits = Counter(r.split for r in plan.records)
    summary = {"images": len(plan.records), "captions": text.captions, "vocab": len(text.words),
               **{s: splits.get(s, 0) for s in ("train", "val", "test")},
               "word_count_threshold": plan.word_count_threshold, "unk_rate": round(text.unk_all, 6),
               "unk_rate_train": round(text.unk_train, 6), "clipped": round(text.clipped, 6)}
    artifact = write_manifest(out_dir, KIND, config, precomputed={"features.h5": features_hash}, summary=summary)
    finish(out_dir)
    console.print(summary_table(title, [
        ("artifact", out_dir),
        *([("captions from", f"{DATASET_JSON}, made of "
                             + ", ".join(f"{p.name} ({fmt})" for p, fmt in plan.source.files))] if derived else []),
        ("images", f"{len(plan.records):,} (train {splits.get('train', 0):,} · val {splits.get('val', 0):,} · "
                   f"test {splits.get('test', 0):,})"),
        ("captions", f"{text.captions:,} (max length {plan.max_length}, {text.clipped:.1%} clipped)"),
        ("vocabulary", f"{len(text.words):,} words (count > {plan.word_count_threshold}; UNK {text.unk_train:.2%} "
                       f"of training tokens, {text.unk_all:.2%} of all)"),
        ("features", feat_desc),
        *([("extraction", f"{speed:,.1f} images/s ({plan.workers} image-reading worker process(es))")] if speed else []),
        ("cider df", f"{len(text.df.df):,} n-grams over {text.df.num_docs:,} training images"),
    ]))
    return artifact


@dataclass
class TextSide:
    """What ``_write_text_side`` wrote, for the summary."""

    words: list[str]
    image_ids: np.ndarray
    df: DocFreq
    captions: int
    unk_all: float
    unk_train: float
    clipped: float


def _write_text_side(out_dir: Path, plan: PreproPlan) -> TextSide:
    """vocab.json, captions.h5 and cider_df.h5 of the plan's records (each written atomically)."""
    recs = plan.records
    captions = [c for r in recs for c in r.captions]
    words = V.build_vocab((c for r in recs if r.split == "train" for c in r.captions), plan.word_count_threshold)
    w2i = V.word_to_id(words)
    labels, lengths = V.encode_all(captions, w2i, plan.max_length)
    counts = np.array([len(r.captions) for r in recs], dtype=np.int64)
    label_end = np.cumsum(counts)
    label_start = label_end - counts
    image_ids = np.array([r.image_id for r in recs], dtype=np.int64)

    atomic_write_json(out_dir / "vocab.json", {"words": words})
    raws = [_raw(r, j) for r in recs for j in range(len(r.captions))]
    _write_h5_atomic(out_dir / "captions.h5", lambda f: _fill_captions(f, labels, lengths, label_start, label_end,
                                                                       image_ids, recs, raws))
    # the training reward's document frequencies, as self-critical.pytorch's prepro_ngrams.py counts
    # them: each training reference's UNK-mapped tokens, not clipped, plus the end token; an n-gram
    # once per image (docs/rewards.md)
    unk = w2i[V.UNK]
    train_refs = [[[w2i.get(t, unk) for t in c] for c in r.captions] for r in recs if r.split == "train"]
    eos = eos_id(len(words))
    df = doc_freq_with_eos(train_refs, eos, words=words)
    _write_h5_atomic(out_dir / "cider_df.h5", lambda f: _fill_df(f, df, eos))

    unk_all = V.unk_rate(labels, lengths, unk)
    train_caps = np.concatenate([np.arange(label_start[i], label_end[i])
                                 for i, r in enumerate(recs) if r.split == "train"])
    unk_train = V.unk_rate(labels[train_caps], lengths[train_caps], unk)
    clipped = float(np.mean([len(c) > plan.max_length for c in captions]))
    if unk_train > V.HIGH_UNK:
        note(f"{unk_train:.1%} of the training tokens are UNK at --word-count-threshold {plan.word_count_threshold} "
             f"({len(words) - 1:,} words kept); a model learns to say UNK that often. A lower threshold keeps "
             "more words (see docs/data.md, Vocabulary)")
    return TextSide(words, image_ids, df, len(captions), unk_all, unk_train, clipped)


def _raw(rec: ImageRecord, j: int) -> str:
    """Caption j of ``rec`` as written (``raw``), else its tokens joined."""
    return rec.raws[j] if j < len(rec.raws) else " ".join(rec.captions[j])


def weights_ref(weights: Path | None, out: Path | None, workspace: Path | None) -> str | None:
    """``--weights`` as the manifest records it (``artifacts.file_ref``): relative to the workspace
    the artifact is written to when the file lies inside it, else absolute."""
    if weights is None:
        return None
    root = workspace_root(out) if out is not None else workspace_dir(workspace)
    return file_ref(weights, root)


def claim_output(out: Path | None, *, workspace: Path | None, name: str, config: dict, force: bool,
                 reads: list[Path | str | None] = ()) -> Path:
    """``prepare_output`` for a data artifact. An unfinished run with the same options (``workers`` and
    ``device`` aside) is resumed. Replacing a complete artifact (``--force``) starts from an empty
    folder: its old features are never taken for a resumable run of this one."""
    replacing = out is not None and is_complete(Path(out))
    # options that do not change a single byte of the output do not stop a rerun from resuming
    same_output = {k: v for k, v in config.items() if k not in RUNTIME_ONLY}
    out_dir = prepare_output(out, workspace=workspace, group="data", name=name, kind=KIND, config=same_output,
                             force=force, reads=reads)
    if replacing:
        _drop_strangers(out_dir, set())
    return out_dir


def _drop_strangers(out_dir: Path, keep: set[str]) -> None:
    from rdpp_cli.artifacts.workspace import RESERVED  # the partial marker and the run's lock

    for p in out_dir.iterdir():
        if p.name in keep or p.name in RESERVED:
            continue
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _write_h5_atomic(path: Path, fill) -> None:
    """``fill(f)`` on an HDF5 file built in memory, then its bytes written to ``path`` by
    ``atomic_write_bytes`` (a temp file, fsync, rename: a reader never sees a half-written file; a
    full disk is one line naming ``path``). HDF5 never writes to the disk itself: on a full disk it
    can lose a write while printing and ignoring the error, and crash. The bytes are the same as a
    file HDF5 writes to the disk."""
    with h5py.File(path.name, "w", driver="core", backing_store=False) as f:
        fill(f)
        f.flush()
        image = f.id.get_file_image()
    atomic_write_bytes(path, image)


def _fill_df(f, df: DocFreq, eos: int) -> None:
    df.fill_h5(f)
    f.attrs["eos_id"] = eos  # the end token's id: counted in every training reference


def _fill_captions(f, labels, lengths, label_start, label_end, image_ids, recs, raws) -> None:
    kw = {"track_times": False}  # the same input gives the same bytes
    f.create_dataset("labels", data=labels, **kw)
    f.create_dataset("lengths", data=lengths, **kw)
    f.create_dataset("label_start", data=label_start.astype(np.int64), **kw)
    f.create_dataset("label_end", data=label_end.astype(np.int64), **kw)
    f.create_dataset("image_ids", data=image_ids, **kw)
    f.create_dataset("split", data=np.array([r.split.encode() for r in recs], dtype="S5"), **kw)
    # the sentences as written: scoring sends them through coco-caption's PTB tokenizer
    f.create_dataset("raw", data=np.array(raws, dtype=object), dtype=h5py.string_dtype("utf-8"), **kw)


def _write_features(path: Path, plan: PreproPlan, image_ids: np.ndarray) -> tuple[dict, str, float | None]:
    if plan.features_from is not None:
        src = plan.features_from
        writer = FeatureWriter(path, image_ids, fc_dim=src.dim, regions=src.regions, dtype=plan.dtype,
                               block=plan.batch_size, with_att_len=src.varying,
                               attrs={"backbone": f"imported:{src.path.name}", "att_size": 0, "source": str(src.path)})
        try:
            with progress("images") as bar:
                task = bar.add_task("import features", total=writer.n, completed=writer.done, info="")
                for fc, att, lens in src.batches(writer.done, writer.block):
                    writer.write(fc, att, lens if src.varying else None)
                    bar.advance(task, len(fc))
            digest = writer.finish()
        finally:
            writer.close()
        regions = f"up to {src.regions} regions (att_len)" if src.varying else f"{src.regions} regions"
        return digest, f"imported from {src.path}: {regions} × {src.dim} ({plan.dtype})", None
    bb = plan.backbone
    writer = FeatureWriter(path, image_ids, fc_dim=bb.dim, regions=bb.regions, dtype=plan.dtype,
                           block=plan.batch_size,
                           attrs={"backbone": bb.name, "att_size": bb.att_size, "image_size": bb.image_size,
                                  "weights": bb.weights})
    speed = None
    try:
        if writer.done < writer.n:
            speed = extract_features(writer, plan.image_paths, bb, device=plan.device, workers=plan.workers)
        digest = writer.finish()
    finally:
        writer.close()
    head = f"; no head keys ({', '.join(bb.missing_head)}): unused" if bb.missing_head else ""
    return digest, (f"{bb.name} ({bb.weights}{head}) on {bb.image_size}×{bb.image_size} images: fc {bb.dim}, "
                    f"att {bb.att_size}×{bb.att_size}×{bb.dim} ({plan.dtype})" if bb.tokens is None
                    else f"att {bb.tokens}×{bb.dim} ({plan.dtype})"), speed


@takes(PreproCocoOptions)
def prepro_coco(opts: PreproCocoOptions) -> Artifact:
    """A caption file + images -> a data artifact: ``<workspace>/data/<name>-v<k>`` or ``out``.

    The captions come from ``karpathy_json`` (a Karpathy split file), or from ``captions``: caption
    files in any format ``caption_files`` recognises (Karpathy JSON, COCO caption files, Flickr token
    files, CSV/JSON Lines), turned into the same Karpathy-form dataset and kept in the artifact as
    ``dataset.json``. The name is coco (Karpathy, COCO), flickr or captions (CSV, JSON Lines).
    Rerunning the same command after an interruption resumes the feature extraction.
    """
    plan = plan_prepro(opts)
    bb = plan.backbone
    given = parse_threshold(opts.word_count_threshold)
    src = plan.source
    config = {
        "source": "coco", "karpathy_json": None if src is not None and src.derived else str(plan.karpathy_json),
        # --captions: every source file (caption files, split lists) with its format and sha256
        **({"captions": src.describe()} if src is not None else {}),
        "images_root": str(plan.images_root) if plan.images_root else None,
        "word_count_threshold": "auto" if given is None else given, "max_length": opts.max_length,
        "restval_to_train": opts.restval_to_train,
        "backbone": bb.name if bb else "imported", "att_size": bb.att_size if bb else None,
        # where `rdpp caption` finds the file from any folder, and what it checks to extract with the same weights
        "image_size": bb.image_size if bb else None, "weights": weights_ref(opts.weights, opts.out, opts.workspace),
        "weights_sha256": bb.weights_sha256 if bb else None,
        "weights_missing_head": bb.missing_head if bb else [],
        "pretrained": opts.pretrained, "device": opts.device, "batch_size": opts.batch_size, "workers": plan.workers,
        "dtype": opts.dtype, "features_from": str(opts.features_from) if opts.features_from else None,
    }
    given_json = None if src is not None and src.derived else plan.karpathy_json
    reads = [given_json, plan.images_root, opts.features_from, opts.weights, *(opts.captions or [])]
    out_dir = claim_output(opts.out, workspace=opts.workspace, name=src.name if src is not None else "coco",
                           config=config, force=opts.force, reads=reads)
    info(f"writing the data artifact to [bold]{out_dir}[/bold]")
    return write_data_artifact(out_dir, plan, config, title="rdpp prepro coco")
