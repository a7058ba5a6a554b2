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
has distinct ones, else 1..N in the order of the photos.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from rdpp_cli.artifacts import (
    Artifact,
    atomic_write_bytes,
    atomic_write_json,
    finish,
    prepare_output,
    resolve_input,
    write_manifest,
)
from rdpp_cli.console import console, info, summary_table
from rdpp_cli.data.backbones import Backbone, build_backbone, file_sha256
from rdpp_cli.data.features import DTYPES, default_workers, image_problem, iter_features
from rdpp_cli.data.vocab import decode_ids, unk_id
from rdpp_cli.decoding.decode import decode
from rdpp_cli.errors import RdppError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
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


def image_ids(files: Sequence[Path]) -> list[int]:
    """The digits ending each file name when they are present and distinct for all, else 1..N."""
    ids = []
    for f in files:
        m = re.search(r"(\d+)$", f.stem)
        ids.append(int(m.group(1)) if m else None)
    if None in ids or len(set(ids)) != len(ids):
        return list(range(1, len(files) + 1))
    return ids


def backbone_of(data: Artifact, weights: Path | None = None) -> tuple[Backbone, str]:
    """The backbone the data artifact extracted its features with (and the feature dtype), rebuilt
    from its manifest: the weights file at the recorded path (relative to the workspace, or
    absolute), or ``weights`` where it moved; either must have the recorded sha256."""
    cfg = data.config
    name = cfg.get("backbone")
    if not name or name == "imported" or not cfg.get("att_size"):
        raise RdppError(f"data artifact {data.path} holds imported features ({cfg.get('features_from')}), not a CNN's; "
                        "rdpp caption needs a model trained on features rdpp extracted (prepro with --backbone)")
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


def caption(
    paths: Sequence[str | Path],
    *,
    model: str | Path | None = None,
    method: str = "beam",
    n: int = 1,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beam: int | None = None,
    groups: int | None = None,
    diversity_lambda: float = 0.5,
    length_norm: float = 0.0,
    max_len: int | None = None,
    allow_unk: bool = False,
    weights: Path | None = None,
    batch_size: int | None = None,
    workers: int | None = None,
    seed: int = 0,
    device: str = "auto",
    out: Path | str | None = None,
    force: bool = False,
    workspace: Path | str | None = None,
) -> Artifact:
    """Caption the image files (or folders) ``paths`` with a model artifact (default: the newest
    fine-tuned, else XE model); returns the captions artifact. Decoding settings left as None take
    the method's defaults (``decoding.decode.DEFAULTS``: beam search of width max(n, 3), ...)."""
    from rdpp_cli import checks
    from rdpp_cli.artifacts.lineage import ref_name, resolve_data_for
    from rdpp_cli.artifacts.workspace import derived_name
    from rdpp_cli.captioning.contact_sheet import SheetEntry, render_html
    from rdpp_cli.decoding.sample import decode_config, model_checkpoint, run_name
    from rdpp_cli.device import resolve_device
    from rdpp_cli.models.checkpoint import load_model

    cfg = decode_config(method, n, max_len, temperature, top_k, top_p, beam, groups, diversity_lambda, length_norm)
    checks.at_least("--batch-size", batch_size, 1)
    checks.at_least("--workers", workers, 0)
    checks.seed(seed)
    files = find_images(paths)
    for f in files:  # every photo readable before anything is written
        problem = image_problem(f, what="leave it out or replace it")
        if problem:
            raise problem
    dev = resolve_device(device)
    model_art = resolve_input(model, workspace=workspace, groups=("finetune", "xe"), kind="rdpp.model",
                              what="model", make_with="rdpp train-xe")
    data_art = resolve_data_for(model_art, None, workspace)
    bb, dtype = backbone_of(data_art, weights)
    net, vocab, _ = load_model(model_checkpoint(model_art), dev)
    if net.config.att_feat_size != bb.dim:
        raise RdppError(f"model {model_art.path} expects {net.config.att_feat_size}-d features but {bb.name} gives "
                        f"{bb.dim}-d ones; the model was not trained on data artifact {data_art.path}")
    if max_len is None:
        cfg.max_len = net.config.seq_length
    cfg.unk_id = None if allow_unk else unk_id(vocab)
    batch_size = batch_size or int(data_art.config.get("batch_size") or 32)
    workers = default_workers(dev.type) if workers is None else workers
    ids = image_ids(files)

    settings = {"files": [str(f) for f in files], **cfg.to_dict(), "seed": seed, "weights": str(bb.weights),
                "device": str(dev)}
    config = {"model": ref_name(model_art), "data": ref_name(data_art), **settings}
    identity = {"model_sha256": model_art.manifest_sha256, "data_sha256": data_art.manifest_sha256, **settings}
    out_dir = prepare_output(out, workspace=workspace, group="captions", name=derived_name(model_art.name, run_name(cfg)),
                             kind="rdpp.captions", config=identity, force=force, reads=[model_art.path, data_art.path, *paths, weights])
    info(f"captioning {len(files)} photo(s) with {model_art.path}: {bb.name} on {bb.image_size}×{bb.image_size} "
         f"images, {bb.att_size}×{bb.att_size} grid, as {data_art.path}")
    gen = torch.Generator(device=dev).manual_seed(seed)
    records: list[dict] = []
    store = DTYPES[dtype]
    t0 = time.perf_counter()
    pending: list[np.ndarray] = []

    def flush(final: bool) -> None:
        while pending and (final or sum(len(a) for a in pending) >= DECODE_BATCH):
            att = np.concatenate(pending)
            take, rest = att[:DECODE_BATCH], att[DECODE_BATCH:]
            pending[:] = [rest] if len(rest) else []
            a = torch.from_numpy(take).to(dev)
            d = decode(net, a, cfg, generator=gen)
            toks, lps = d.tokens.cpu().numpy(), d.seq_logprob.cpu().numpy()
            for b in range(len(take)):
                k = len(records)
                caps = [decode_ids(vocab, toks[b, j]) for j in range(cfg.n)]
                records.append({"image_id": ids[k], "caption": caps[0], "captions": caps,
                                "logprobs": [round(float(x), 6) for x in lps[b]], "file": str(files[k])})

    for _, att in iter_features(files, bb, batch_size=batch_size, device=str(dev), workers=workers):
        # the precision the data artifact stored its features in, as the model saw them in training
        pending.append(att.astype(store).astype(np.float32))
        flush(final=False)
    flush(final=True)
    elapsed = time.perf_counter() - t0

    atomic_write_json(out_dir / "results.json", records, indent=1)
    entries = [SheetEntry(Path(r["file"]), r["image_id"], r["captions"], r["logprobs"]) for r in records]
    sheet = render_html(entries, title=f"{model_art.name}: {run_name(cfg)}",
                        subtitle=f"{len(records)} photos · model {model_art.path} · features {bb.name} "
                                 f"{bb.image_size}px {bb.att_size}×{bb.att_size} as {data_art.path}")
    atomic_write_bytes(out_dir / "contact_sheet.html", sheet.encode("utf-8"))
    art = write_manifest(out_dir, "rdpp.captions", config, inputs=[model_art, data_art],
                         summary={"photos": len(records), "n": cfg.n, "method": cfg.method})
    finish(out_dir)
    console.print(summary_table("rdpp caption", {
        "artifact": out_dir,
        "model": model_art.path,
        "decoding": f"{cfg.method}, n={cfg.n}" + (f", beam={cfg.beam}" if cfg.method in ("beam", "dbs") else ""),
        "photos": f"{len(records)} ({len(records) / max(elapsed, 1e-9):.1f} photos/s)",
        "results": out_dir / "results.json",
        "contact sheet": out_dir / "contact_sheet.html",
        **{f"e.g. {Path(r['file']).name}": " | ".join(r["captions"][:3]) for r in records[:3]},
    }))
    return art

