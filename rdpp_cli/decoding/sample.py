"""The `rdpp sample` stage: n captions per image of a split, from a model artifact.

Reads the model artifact (newest fine-tuned, else newest XE model, unless one is named) and the
data artifact it was trained on; decodes in batches of images with ``decode`` (each image encoded
once, expanded to its n rows); writes a samples artifact with ``samples.json``:
``[{"image_id", "captions": [...n...], "logprobs": [...n...]}]`` (logprob = the caption's
log-probability under the model, EOS included).

With ``select`` (``dpp``, ``mbr``, ``logprob`` or ``consensus``; ``rdpp_cli.decoding.select``) it decodes
``candidates`` captions per image and keeps the n chosen ones; ``keep_candidates`` also writes all
of them (``"candidates"``, ``"candidate_logprobs"``, ``"chosen"``: their indices) in each record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from rdpp_cli.artifacts import (Artifact, atomic_write_json, derived_name, finish, prepare_output, ref_name,
                                resolve_input, write_manifest)
from rdpp_cli.artifacts.lineage import resolve_data_for
from rdpp_cli.console import console, progress, summary_table
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.vocab import unk_id
from rdpp_cli.decoding.decode import DecodeConfig, decode
from rdpp_cli.decoding.select import Chooser, SelectConfig
from rdpp_cli.device import resolve_device
from rdpp_cli.errors import RdppError
from rdpp_cli.models.checkpoint import check_fits_data, load_model
from rdpp_cli.precision import DEFAULT_PRECISION, autocast, resolve_precision


def model_checkpoint(model_art: Artifact) -> Path:
    """``checkpoints/best.pt`` of a model artifact, else ``last.pt``."""
    for name in ("checkpoints/best.pt", "checkpoints/last.pt"):
        if name in model_art.manifest.get("files", {}):
            return model_art.file(name)
    raise RdppError(f"model artifact {model_art.path} has no checkpoints/best.pt or last.pt; retrain it")


def decode_config(method: str, n: int, max_len: int | None, temperature: float, top_k: int | None,
                  top_p: float | None, beam: int | None, groups: int | None, diversity_lambda: float,
                  length_norm: float) -> DecodeConfig:
    """The checked ``DecodeConfig`` of a command's decoding options (``rdpp sample``, ``rdpp caption``),
    the method's defaults filled in; RdppError (one line) for a bad value. ``max_len`` None: 16 until
    the caller sets the model's or the data's caption length."""
    from rdpp_cli import checks

    try:
        cfg = DecodeConfig(method=method, n=n, max_len=16 if max_len is None else max_len, temperature=temperature,
                           top_k=top_k, top_p=top_p, beam=beam, groups=groups, diversity_lambda=diversity_lambda,
                           length_norm=length_norm).check()
    except ValueError as e:
        raise RdppError(str(e)) from None
    checks.finite("--temperature", temperature)
    return cfg


def run_name(cfg: DecodeConfig, sel: SelectConfig | None = None, n: int | None = None) -> str:
    """The decoding part of a samples artifact's name (``random-n20``); the whole stem is
    ``<model name>.<run_name>`` (``dpp-m5-v1.random-n20``), so the name says which model made it.
    With a selection of n of the cfg.n candidates: ``random-c50.dpp-consensus-n5``."""
    extra = {"beam": lambda: f"-b{cfg.beam}", "dbs": lambda: f"-g{cfg.groups}b{cfg.beam}",
             "topk": lambda: f"-k{cfg.top_k}", "nucleus": lambda: f"-p{cfg.top_p:g}"}.get(cfg.method, str)()
    if sel is not None:
        return f"{cfg.method}{extra}-c{cfg.n}.{sel.tag()}-n{n}"
    return f"{cfg.method}{extra}-n{cfg.n}"


def sample(
    model: str | Path | None = None,
    *,
    data: str | Path | None = None,
    split: str = "test",
    n: int = 20,
    method: str = "random",
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beam: int | None = None,
    groups: int | None = None,
    diversity_lambda: float = 0.5,
    length_norm: float = 0.0,
    max_len: int | None = None,
    allow_unk: bool = False,
    batch_size: int = 50,
    max_images: int | None = None,
    seed: int = 0,
    select: str | None = None,
    candidates: int = 50,
    quality: str | None = None,
    neighbours: int | None = None,
    keep_candidates: bool = False,
    device: str = "auto",
    precision: str = DEFAULT_PRECISION,
    out: Path | str | None = None,
    force: bool = False,
    workspace: Path | str | None = None,
) -> Artifact:
    """Decode ``n`` captions per image of ``split`` (with ``select``: ``candidates`` per image, of
    which ``n`` are kept); returns the samples artifact
    ``<workspace>/samples/<model name>.<method>-n<n>-v<k>`` (or ``out``).

    ``precision``: fp32, bf16, fp16 or auto (``rdpp_cli.precision``): the model's forward under
    autocast; log-probabilities are float32 either way. The one used is in the manifest.
    """
    from rdpp_cli import checks

    try:
        sel = SelectConfig(select, candidates, quality, neighbours).check(n) if select is not None else None
    except ValueError as e:
        raise RdppError(str(e)) from None
    cfg = decode_config(method, sel.candidates if sel else n, max_len, temperature, top_k, top_p, beam, groups,
                        diversity_lambda, length_norm)
    checks.at_least("--batch-size", batch_size, 1)
    checks.at_least("--max-images", max_images, 1)
    checks.seed(seed)
    if keep_candidates and sel is None:
        raise RdppError("--keep-candidates keeps the candidates of --select; add --select dpp|mbr|logprob|consensus")
    dev = resolve_device(device)
    prec = resolve_precision(precision, dev)
    model_art = resolve_input(model, workspace=workspace, groups=("finetune", "xe"), kind="rdpp.model",
                              what="model", make_with="rdpp train-xe")
    data_art = resolve_data_for(model_art, data, workspace)
    ds = DataArtifact(data_art)
    net, vocab, ckpt = load_model(model_checkpoint(model_art), dev)
    check_fits_data(ckpt, ds, f"model {model_art.path}", "sample with the data the model was trained on")
    if max_len is None:
        cfg.max_len = ds.seq_length
    cfg.unk_id = None if allow_unk else unk_id(vocab)  # evaluation decoding never says UNK unless asked
    images = ds.split_indices(split)
    if max_images is not None:
        images = images[:max_images]

    chooser = Chooser(sel, n, ds, cfg.max_len, images) if sel else None  # refuses a df without the EOS, before any folder
    settings = {"split": split, **cfg.to_dict(), "n": n, "select": select, "candidates": cfg.n if sel else None,
                "quality": sel.quality if sel else None, **(sel.settings() if sel else {}),
                "keep_candidates": keep_candidates if sel else None,
                "batch_size": batch_size, "max_images": max_images, "seed": seed, "device": str(dev),
                "precision": prec}
    config = {"model": ref_name(model_art), "data": ref_name(data_art), **settings}
    identity = {"model_sha256": model_art.manifest_sha256, "data_sha256": data_art.manifest_sha256, **settings}
    out_dir = prepare_output(out, workspace=workspace, group="samples", name=derived_name(model_art.name, run_name(cfg, sel, n)),
                             kind="rdpp.samples", config=identity, force=force, reads=[model_art.path, data_art.path])
    gen = torch.Generator(device=dev).manual_seed(seed)
    records: list[dict] = []
    t0 = time.perf_counter()
    with progress("captions") as bar:
        task = bar.add_task(f"sample {cfg.method}", total=len(images) * cfg.n, info="")
        for start in range(0, len(images), batch_size):
            idx = images[start:start + batch_size]
            _, att, mask = ds.features(idx, dev)
            with autocast(prec, dev):
                out_ = decode(net, att, cfg, att_mask=mask, generator=gen)
            toks = out_.tokens.cpu().numpy()
            lps = out_.seq_logprob.cpu().numpy()
            chosen = chooser(out_, idx) if chooser else np.broadcast_to(np.arange(n), (len(idx), n))
            for b, i in enumerate(idx):
                rec = {"image_id": int(ds.image_ids[i]),
                       "captions": [ds.decode(toks[b, j]) for j in chosen[b]],
                       "logprobs": [round(float(lps[b, j]), 6) for j in chosen[b]]}
                if chooser and keep_candidates:
                    rec.update(candidates=[ds.decode(t) for t in toks[b]],
                               candidate_logprobs=[round(float(x), 6) for x in lps[b]],
                               chosen=[int(j) for j in chosen[b]])
                records.append(rec)
            bar.advance(task, len(idx) * cfg.n)
    elapsed = time.perf_counter() - t0
    atomic_write_json(out_dir / "samples.json", records, indent=1)
    distinct = float(np.mean([len(set(r["captions"])) for r in records]))
    summary = {"images": len(records), "n": n, "method": cfg.method, "distinct": distinct}
    if sel:
        summary.update(select=sel.method, candidates=cfg.n, quality=sel.quality)
    art = write_manifest(out_dir, "rdpp.samples", config, inputs=[model_art, data_art], summary=summary)
    finish(out_dir)

    console.print(summary_table("rdpp sample", {
        "artifact": out_dir,
        "model": model_art.path,
        "decoding": f"{cfg.method}, {'candidates' if sel else 'n'}={cfg.n}"
                    + (f", beam={cfg.beam}" if cfg.method in ("beam", "dbs") else ""),
        **({"selection": f"{n} of {cfg.n} per image by {sel.describe()}, "
                         f"{chooser.seconds:.1f} s"} if sel else {}),
        "images": f"{len(records)} ({split} split)",
        "captions/s": f"{len(records) * cfg.n / max(elapsed, 1e-9):,.0f}",
        "distinct per image": f"{distinct:.2f} of {n}",
        **{f"e.g. {r['image_id']}": " | ".join(r["captions"][:3]) for r in records[:3]},
    }))
    return art
