"""`rdpp caption PATH…`: caption your own photos with a model artifact.

Features are extracted exactly as the model's data artifact extracted them: the backbone, weights
file (checked by its sha256), image size, grid and storage precision are read from that
artifact's manifest, and the images go through the same reader and extraction loop
(``rdpp_cli.data.features``). The captions come from ``decode`` with any of `rdpp sample`'s
methods (default: beam 3, one caption), UNK suppressed unless ``allow_unk``; images are decoded
in batches of 50 in the order given, as `rdpp sample` does, so that the val photos of a data
artifact captioned here get the captions `rdpp sample --split val` gives them.

Writes a captions artifact (``<workspace>/captions/<model>-<method>-v<k>`` or ``--out``):

- ``results.json``: one entry per photo, coco-caption's results form
  ``{"image_id", "caption"}`` (the best caption) plus ``"captions"`` (all n), ``"logprobs"`` and
  ``"file"``; `rdpp score results.json --refs …` reads it;
- ``contact_sheet.html``: every photo as a thumbnail with its caption set, self-contained.

Image ids: the digits that end each file name (COCO's ``000000000139.jpg`` -> 139) when every photo
has distinct ones, else 1..N in the order of the photos (``data.caption_files.ids_from_names``, the
rule ``rdpp prepro coco --captions`` numbers images by).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from rdpp_cli.artifacts import Artifact, atomic_write_bytes, atomic_write_json, finish, write_manifest
from rdpp_cli.captioning.contact_sheet import SheetEntry, render_html
from rdpp_cli.captioning.options import CaptionOptions
from rdpp_cli.console import console, info, summary_table
from rdpp_cli.data.backbones import HF_PREFIX, Backbone, build_backbone, file_sha256
from rdpp_cli.data.caption_files import IMAGE_SUFFIXES, ids_from_names
from rdpp_cli.data.features import DTYPES, check_images, default_workers, iter_features
from rdpp_cli.decoding.config import DecodeConfig
from rdpp_cli.decoding.decode import decode
from rdpp_cli.decoding.sample import Decoder, claim_output, decoding_summary, load_decoder, run_name
from rdpp_cli.errors import RdppError
from rdpp_cli.options import takes

DECODE_BATCH = 50  # images per decoding batch, as `rdpp sample`'s default --batch-size


def find_images(paths: Sequence[str | Path]) -> list[Path]:
    """Image files named by ``paths`` (files, or folders searched recursively for image suffixes,
    sorted), in the order given, each once; RdppError for a missing path or no image at all."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() in IMAGE_SUFFIXES)
        elif p.is_file():
            found.append(p)
        else:
            raise RdppError(f"{p} does not exist; pass image files or folders that hold them")
    seen: set[Path] = set()
    unique = [p for p in found if not (p.resolve() in seen or seen.add(p.resolve()))]
    if not unique:
        raise RdppError(f"no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) in {', '.join(map(str, paths))}; "
                        "pass photos or folders of photos")
    return unique


def backbone_of(data: Artifact, weights: Path | None = None) -> tuple[Backbone, str]:
    """The backbone the data artifact extracted its features with (and the feature dtype), rebuilt
    from its manifest: the weights file at the recorded path (relative to the workspace, or
    absolute), or ``weights`` where it moved; either must have the recorded sha256."""
    cfg = data.config
    name = cfg.get("backbone")
    if not name or name == "imported" or not cfg.get("att_size"):
        raise RdppError(f"data artifact {data.path} holds imported features ({cfg.get('features_from')}), not a CNN's; "
                        "rdpp caption needs a model trained on features rdpp extracted (prepro with --backbone)")
    if name.startswith(HF_PREFIX):
        return _hf_backbone_of(data, weights), cfg.get("dtype", "float16")
    if weights is not None and Path(weights).is_dir():
        raise RdppError(f"--weights {weights} is a folder; data artifact {data.path} was made with {name}: pass its "
                        "weights file")
    recorded, want = cfg.get("weights"), cfg.get("weights_sha256")
    path = Path(weights) if weights is not None else (data.resolve_path(recorded) if recorded else None)
    needs = f"the file with sha256 {want}" if want else "the same file"
    if path is not None and not path.is_file():
        where = "--weights" if weights is not None else f"(recorded in {data.path / 'manifest.json'})"
        raise RdppError(f"weights file {path} {where} does not exist; pass --weights PATH to {needs}")
    if path is not None and want and (got := file_sha256(path)) != want:
        raise RdppError(f"weights file {path} is not the one data artifact {data.path} was made with (its sha256 is "
                        f"{got[:12]}…, the manifest records {want[:12]}…); pass --weights PATH to {needs}")
    bb = build_backbone(name, att_size=int(cfg["att_size"]), image_size=cfg.get("image_size"), weights=path,
                        pretrained=bool(cfg.get("pretrained", False)))
    if want and bb.weights_sha256 and bb.weights_sha256 != want:  # ImageNet weights from the hub cache
        raise RdppError(f"the {name} weights found ({bb.weights}) are not the ones data artifact {data.path} was "
                        "made with; pass --weights PATH to that file")
    return bb, cfg.get("dtype", "float16")


def _hf_backbone_of(data: Artifact, folder: Path | None) -> Backbone:
    """The vision encoder of a data artifact made with ``--backbone hf:DIR``: the recorded folder, or
    ``folder`` (``--weights DIR``) where it moved; either must hold the weights file of the recorded sha256."""
    from rdpp_cli.hf_folder import check_same_encoder

    cfg = data.config
    recorded, want = cfg["backbone"][len(HF_PREFIX):], cfg.get("weights_sha256")
    needs = f"the folder whose weights file has sha256 {want[:12]}…" if want else "the folder it moved to"
    if folder is None and not Path(recorded).is_dir():
        raise RdppError(f"the vision encoder folder {recorded} that data artifact {data.path} was made with is gone "
                        f"(or relative to another folder); pass --weights DIR, {needs}")
    if folder is not None and not Path(folder).is_dir():
        raise RdppError(f"--weights {folder}: data artifact {data.path} was made with the vision encoder of a folder "
                        f"(hf:{recorded}); pass --weights DIR, {needs}")
    where = Path(folder) if folder is not None else Path(recorded)
    check_same_encoder(where, want, f"data artifact {data.path}", "--weights " if folder is not None else "hf:")
    return build_backbone(HF_PREFIX + str(where), att_size=int(cfg["att_size"]), image_size=cfg.get("image_size"))


@takes(CaptionOptions)
def caption(opts: CaptionOptions) -> Artifact:
    """Caption the image files (or folders) ``opts.paths`` with a model artifact (default: the newest
    fine-tuned, else XE model); returns the captions artifact. Decoding settings left as None take
    the method's defaults (``decoding.config.DEFAULTS``: beam search of width max(n, 3), ...)."""
    files = find_images(opts.paths)
    check_images(files, what="leave it out or replace it")  # every photo readable before anything is written
    dec = load_decoder(opts.model, None, opts.workspace, opts.device)
    bb, dtype = backbone_of(dec.data, opts.weights)
    if dec.net.config.att_feat_size != bb.dim:
        raise RdppError(f"model {dec.model.path} expects {dec.net.config.att_feat_size}-d features but {bb.name} "
                        f"gives {bb.dim}-d ones; the model was not trained on data artifact {dec.data.path}")
    bridge = dec.bridge()  # decoding in the model's ids, captions as words
    cfg = dec.decode_config(opts, opts.n, bridge)
    settings = {"files": [str(f) for f in files], **cfg.to_dict(), "seed": opts.seed, "weights": str(bb.weights),
                "device": str(dec.device)}
    out_dir, config = claim_output(opts, dec, group="captions", kind="rdpp.captions", name=run_name(cfg, opts.n),
                                   settings=settings, reads=[*opts.paths, opts.weights])
    info(f"captioning {len(files)} photo(s) with {dec.model.path}: {bb.name} on {bb.image_size}×{bb.image_size} "
         f"images, {bb.att_size}×{bb.att_size} grid, as {dec.data.path}")
    t0 = time.perf_counter()
    records = _caption_photos(opts, dec, bb, DTYPES[dtype], cfg, files, bridge)
    elapsed = time.perf_counter() - t0
    art = _write(out_dir, dec, bb, cfg, records, config)
    console.print(summary_table("rdpp caption", {
        "artifact": out_dir,
        "model": dec.model.path,
        "decoding": decoding_summary(cfg, f"n={cfg.n}"),
        "photos": f"{len(records)} ({len(records) / max(elapsed, 1e-9):.1f} photos/s)",
        "results": out_dir / "results.json",
        "contact sheet": out_dir / "contact_sheet.html",
        **{f"e.g. {Path(r['file']).name}": " | ".join(r["captions"][:3]) for r in records[:3]},
    }))
    return art


def regroup(batches: Iterable[tuple[np.ndarray, ...]], size: int) -> Iterator[tuple[np.ndarray, ...]]:
    """The rows of ``batches`` (tuples of arrays that share their first dimension, e.g. (fc, att)) in
    the same order, in batches of ``size`` (the last one smaller)."""
    pending: list[tuple[np.ndarray, ...]] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += len(batch[0])
        while held >= size:
            rows = tuple(np.concatenate(parts) for parts in zip(*pending))
            pending, held = [tuple(r[size:] for r in rows)], held - size
            yield tuple(r[:size] for r in rows)
    if held:
        yield tuple(np.concatenate(parts) for parts in zip(*pending))


def _caption_photos(opts: CaptionOptions, dec: Decoder, bb: Backbone, store, cfg: DecodeConfig,
                    files: list[Path], bridge) -> list[dict]:
    """One ``results.json`` record per photo: features extracted as the data artifact extracted them
    (stored in its precision, as the model saw them in training), decoded in batches of
    ``DECODE_BATCH`` photos with one seeded generator, as `rdpp sample` decodes a split."""
    ids = ids_from_names(files)
    gen = torch.Generator(device=dec.device).manual_seed(opts.seed)
    batch_size = opts.batch_size or int(dec.data.config.get("batch_size") or 32)
    workers = default_workers(dec.device.type) if opts.workers is None else opts.workers
    features = (tuple(x.astype(store).astype(np.float32) for x in (fc, att))
                for fc, att in iter_features(files, bb, batch_size=batch_size, device=str(dec.device), workers=workers))
    records: list[dict] = []
    for fc, att in regroup(features, DECODE_BATCH):
        fc, att = (torch.from_numpy(x).to(dec.device) for x in (fc, att))
        d = decode(dec.net, att, cfg, generator=gen, fc=fc)
        toks, lps = d.tokens.cpu().numpy(), d.seq_logprob.cpu().numpy()
        for b in range(len(att)):
            k = len(records)
            caps = bridge.texts(toks[b])
            records.append({"image_id": ids[k], "caption": caps[0], "captions": caps,
                            "logprobs": [round(float(x), 6) for x in lps[b]], "file": str(files[k])})
    return records


def _write(out_dir: Path, dec: Decoder, bb: Backbone, cfg: DecodeConfig, records: list[dict], config: dict) -> Artifact:
    """``results.json``, ``contact_sheet.html`` and the manifest."""
    atomic_write_json(out_dir / "results.json", records, indent=1)
    entries = [SheetEntry(Path(r["file"]), r["image_id"], r["captions"], r["logprobs"]) for r in records]
    sheet = render_html(entries, title=f"{dec.model.name}: {run_name(cfg, cfg.n)}",
                        subtitle=f"{len(records)} photos · model {dec.model.path} · features {bb.name} "
                                 f"{bb.image_size}px {bb.att_size}×{bb.att_size} as {dec.data.path}")
    atomic_write_bytes(out_dir / "contact_sheet.html", sheet.encode("utf-8"))
    art = write_manifest(out_dir, "rdpp.captions", config, inputs=[dec.model, dec.data],
                         summary={"photos": len(records), "n": cfg.n, "method": cfg.method})
    finish(out_dir)
    return art
