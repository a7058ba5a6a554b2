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

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rdpp_cli.artifacts import (Artifact, atomic_write_json, derived_name, finish, prepare_output, ref_name,
                                resolve_input, write_manifest)
from rdpp_cli.artifacts.lineage import resolve_data_for
from rdpp_cli.console import console, progress, summary_table
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.decoding.config import DecodeConfig, DecodingOptions
from rdpp_cli.decoding.decode import Decoded, decode
from rdpp_cli.decoding.options import SampleOptions
from rdpp_cli.decoding.select import Chooser, SelectConfig
from rdpp_cli.device import resolve_device
from rdpp_cli.errors import RdppError
from rdpp_cli.models.bridge import bridge_for
from rdpp_cli.models.checkpoint import check_fits_data, load_model
from rdpp_cli.options import takes
from rdpp_cli.precision import autocast
from rdpp_cli.precision_probe import ProbeShape, resolve_precision


# ----------------------------------------------------------------------------------------------
# what `rdpp sample` and `rdpp caption` share: the model, the output folder, the names
# ----------------------------------------------------------------------------------------------

def model_checkpoint(model_art: Artifact) -> Path:
    """``checkpoints/best.pt`` of a model artifact, else ``last.pt``."""
    for name in ("checkpoints/best.pt", "checkpoints/last.pt"):
        if name in model_art.manifest.get("files", {}):
            return model_art.file(name)
    raise RdppError(f"model artifact {model_art.path} has no checkpoints/best.pt or last.pt; retrain it")


@dataclass
class Decoder:
    """A model artifact loaded to decode: the artifact, the data artifact it was trained on, the
    network with its vocabulary and checkpoint, and the device it runs on."""

    model: Artifact
    data: Artifact
    net: Any
    vocab: list[str]
    checkpoint: dict
    device: torch.device

    def bridge(self, seq_length: int | None = None):
        """``models.bridge``: the network's ids to and from its data's words (captions of
        ``seq_length`` words; default the model's own length)."""
        return bridge_for(self.net, self.vocab, seq_length or self.net.config.seq_length)

    def decode_config(self, opts: DecodingOptions, n: int, bridge) -> DecodeConfig:
        """``opts.decode_config`` for this network and ``bridge``, refusing in one line a ``--max-len``
        beyond the tokens its decoder can position (``max_decode_len``, a Hugging Face decoder's
        positions less the start token; rdpp's own models have no such limit)."""
        cfg = opts.decode_config(n, max_len=bridge.max_len, unk_id=bridge.unk_id)
        limit = getattr(self.net, "max_decode_len", None)
        if limit is not None and cfg.max_len > limit:
            raise RdppError(f"--max-len {cfg.max_len}: the decoder of {self.model.path} positions at most {limit} "
                            f"tokens after its start token; pass --max-len {limit} or less")
        return cfg


def load_decoder(model: str | Path | None, data: str | Path | None, workspace, device: str) -> Decoder:
    """The model artifact ``model`` (default: the newest fine-tuned, else XE model) and its data
    artifact (``data``, which must be the one it was trained on; default: that one), loaded on ``device``."""
    dev = resolve_device(device)
    model_art = resolve_input(model, workspace=workspace, groups=("finetune", "xe"), kind="rdpp.model",
                              what="model", make_with="rdpp train-xe")
    data_art = resolve_data_for(model_art, data, workspace)
    net, vocab, ckpt = load_model(model_checkpoint(model_art), dev)
    return Decoder(model_art, data_art, net, vocab, ckpt, dev)


def claim_output(opts, dec: Decoder, *, group: str, kind: str, name: str, settings: dict,
                 reads: Sequence[Path | str | None] = ()) -> tuple[Path, dict]:
    """Claim the folder of a run of ``settings`` with this model (``prepare_output``: a new version of
    ``<model name>.<name>`` under ``<workspace>/<group>``, or ``opts.out``, never over the model, its
    data or any of ``reads``); returns it and the manifest's config (the model and data by name; the
    run's identity names them by manifest hash)."""
    config = {"model": ref_name(dec.model), "data": ref_name(dec.data), **settings}
    identity = {"model_sha256": dec.model.manifest_sha256, "data_sha256": dec.data.manifest_sha256, **settings}
    path = prepare_output(opts.out, workspace=opts.workspace, group=group, name=derived_name(dec.model.name, name),
                          kind=kind, config=identity, force=opts.force,
                          reads=[dec.model.path, dec.data.path, *reads])
    return path, config


def run_name(cfg: DecodeConfig, n: int, sel: SelectConfig | None = None) -> str:
    """The decoding part of an artifact's name (``random-n20``): the method, its settings and the
    ``n`` captions per image; the whole stem is ``<model name>.<run_name>`` (``dpp-m5-v1.random-n20``),
    so the name says which model made it. With a selection of n of the candidates:
    ``random-c50.dpp-consensus-n5`` (``SelectConfig.tag``)."""
    extra = {"beam": lambda: f"-b{cfg.beam}", "dbs": lambda: f"-g{cfg.groups}b{cfg.beam}",
             "topk": lambda: f"-k{cfg.top_k}", "nucleus": lambda: f"-p{cfg.top_p:g}"}.get(cfg.method, str)()
    if sel is not None:
        return f"{cfg.method}{extra}-c{sel.candidates}.{sel.tag()}-n{n}"
    return f"{cfg.method}{extra}-n{n}"


def decoding_summary(cfg: DecodeConfig, count: str) -> str:
    """The summary table's "decoding" row: the method, ``count`` ("n=5") and the beam width."""
    return f"{cfg.method}, {count}" + (f", beam={cfg.beam}" if cfg.method in ("beam", "dbs") else "")


# ----------------------------------------------------------------------------------------------
# the stage
# ----------------------------------------------------------------------------------------------

@takes(SampleOptions)
def sample(opts: SampleOptions) -> Artifact:
    """Decode ``n`` captions per image of ``split`` (with ``select``: ``candidates`` per image, of
    which ``n`` are kept); returns the samples artifact
    ``<workspace>/samples/<model name>.<method>-n<n>-v<k>`` (or ``out``).

    ``precision``: fp32, bf16, fp16 or auto (``rdpp_cli.precision``; auto: ``rdpp_cli.precision_probe``):
    the model's forward under autocast; log-probabilities are float32 either way. The one used is in the
    manifest.
    """
    sel = opts.selection()
    dec = load_decoder(opts.model, opts.data, opts.workspace, opts.device)
    ds = DataArtifact(dec.data)
    prec = resolve_precision(opts.precision, dec.device, ProbeShape.of(  # auto: times the model sampled from
        dec.net, images=opts.batch_size, seq_per_img=opts.decoded_per_image, regions=ds.att_regions,
        steps=ds.seq_length))
    check_fits_data(dec.checkpoint, ds, f"model {dec.model.path}", "sample with the data the model was trained on")
    # evaluation decoding never says UNK unless asked
    bridge = dec.bridge(ds.seq_length)  # decoding in the model's ids, captions as the data's words
    cfg = dec.decode_config(opts, opts.decoded_per_image, bridge)
    images = ds.split_indices(opts.split)[:opts.max_images]
    chooser = Chooser(sel, opts.n, ds, ds.seq_length, images) if sel else None  # refuses a df without the EOS, before any folder
    out_dir, config = claim_output(opts, dec, group="samples", kind="rdpp.samples", name=run_name(cfg, opts.n, sel),
                                   settings=_settings(opts, cfg, sel, dec.device, prec))
    t0 = time.perf_counter()
    records = _decode_images(opts, dec, ds, cfg, images, prec, chooser, bridge)
    elapsed = time.perf_counter() - t0
    atomic_write_json(out_dir / "samples.json", records, indent=1)
    distinct = float(np.mean([len(set(r["captions"])) for r in records]))
    summary = {"images": len(records), "n": opts.n, "method": cfg.method, "distinct": distinct}
    if sel:
        summary.update(select=sel.method, candidates=opts.candidates, quality=sel.quality)
    art = write_manifest(out_dir, "rdpp.samples", config, inputs=[dec.model, dec.data], summary=summary)
    finish(out_dir)
    _print_summary(opts, dec, cfg, sel, chooser, records, elapsed, distinct, out_dir)
    return art


def _settings(opts: SampleOptions, cfg: DecodeConfig, sel: SelectConfig | None, dev, prec: str) -> dict:
    """The manifest's settings: the options, with what the run resolved (the decoder's settings with
    the method's defaults, the selection's quality, the device and precision used)."""
    decoder = {k: v for k, v in cfg.to_dict().items() if k != "n"}  # the decoder's n: the candidates with --select
    return {**opts.recorded(), **decoder, "candidates": opts.candidates if sel else None,
            "quality": sel.quality if sel else None, **(sel.settings() if sel else {}),
            "keep_candidates": opts.keep_candidates if sel else None, "device": str(dev), "precision": prec}


def _decode_images(opts: SampleOptions, dec: Decoder, ds: DataArtifact, cfg: DecodeConfig, images, prec: str,
                   chooser: Chooser | None, bridge) -> list[dict]:
    """The records of ``images``, decoded in batches of ``opts.batch_size`` with one seeded generator."""
    gen = torch.Generator(device=dec.device).manual_seed(opts.seed)
    records: list[dict] = []
    with progress("captions") as bar:
        task = bar.add_task(f"sample {cfg.method}", total=len(images) * cfg.n, info="")
        for start in range(0, len(images), opts.batch_size):
            idx = images[start:start + opts.batch_size]
            fc, att, mask = ds.features(idx, dec.device)
            with autocast(prec, dec.device):
                out = decode(dec.net, att, cfg, att_mask=mask, generator=gen, fc=fc)
            records += _records(ds, idx, out, opts, chooser, bridge)
            bar.advance(task, len(idx) * cfg.n)
    return records


def _records(ds: DataArtifact, idx, out: Decoded, opts: SampleOptions, chooser: Chooser | None, bridge) -> list[dict]:
    """One ``samples.json`` record per image of the batch: its n captions (the chosen ones with a
    selection, and every candidate with ``keep_candidates``) as text and their log-probabilities.
    A selection reads the captions as the data's words (``bridge.data_ids``)."""
    lps = out.seq_logprob.cpu().numpy()
    B, C = out.tokens.shape[:2]
    texts = np.array(bridge.texts(out.tokens.reshape(B * C, -1)), dtype=object).reshape(B, C)
    if chooser:
        words = torch.from_numpy(np.asarray(bridge.data_ids(out.tokens), dtype=np.int64)).to(out.tokens.device)
        chosen = chooser(dataclasses.replace(out, tokens=words), idx)
    else:
        chosen = np.broadcast_to(np.arange(opts.n), (len(idx), opts.n))
    records = []
    for b, i in enumerate(idx):
        rec = {"image_id": int(ds.image_ids[i]),
               "captions": [texts[b, j] for j in chosen[b]],
               "logprobs": [round(float(lps[b, j]), 6) for j in chosen[b]]}
        if chooser and opts.keep_candidates:
            rec.update(candidates=list(texts[b]),
                       candidate_logprobs=[round(float(x), 6) for x in lps[b]],
                       chosen=[int(j) for j in chosen[b]])
        records.append(rec)
    return records


def _print_summary(opts: SampleOptions, dec: Decoder, cfg: DecodeConfig, sel: SelectConfig | None,
                   chooser: Chooser | None, records: list[dict], elapsed: float, distinct: float, out_dir: Path) -> None:
    console.print(summary_table("rdpp sample", {
        "artifact": out_dir,
        "model": dec.model.path,
        "decoding": decoding_summary(cfg, f"candidates={opts.candidates}" if sel else f"n={opts.n}"),
        **({"selection": f"{opts.n} of {opts.candidates} per image by {sel.describe()}, "
                         f"{chooser.seconds:.1f} s"} if sel else {}),
        "images": f"{len(records)} ({opts.split} split)",
        "captions/s": f"{len(records) * cfg.n / max(elapsed, 1e-9):,.0f}",
        "distinct per image": f"{distinct:.2f} of {opts.n}",
        **{f"e.g. {r['image_id']}": " | ".join(r["captions"][:3]) for r in records[:3]},
    }))
