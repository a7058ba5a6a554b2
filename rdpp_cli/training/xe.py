"""`rdpp train-xe`: Att2in trained with cross-entropy (teacher forcing), the paper's first stage.

The loss is self-critical.pytorch's ``LanguageModelCriterion``: the negative log-likelihood of every
reference token and of the EOS after it (padding ignored), averaged over those tokens, with five
captions per image. Everything else (epochs, validation, checkpoints, resume, DDP) is the shared
loop in ``rdpp_cli.training.loop``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import h5py
import numpy as np
import torch
from torch import Tensor, nn

from rdpp_cli.artifacts import Artifact, ref_name, resolve_input, sha256_file
from rdpp_cli.console import info
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import Batch
from rdpp_cli.errors import RdppError
from rdpp_cli.models.att2in import PRESETS, Att2in, config_from_preset
from rdpp_cli.models.checkpoint import check_fits_data, load_checkpoint, model_from_checkpoint
from rdpp_cli.precision import DEFAULT_PRECISION, resolve_precision
from rdpp_cli.training import distributed as D
from rdpp_cli.training.loop import TrainConfig, call, claim_output, run_training, validation_images
from rdpp_cli.training.state import seed_everything


def xe_loss(model: nn.Module, batch: Batch) -> Tensor:
    """Mean negative log-likelihood per token (words and the EOS, padding ignored) of the batch's
    captions: ``sequence_logprobs(model(fc, att, labels), labels)`` through the model's faster
    ``token_logprobs`` (the output layer runs only on the tokens that count). Under DDP the mean is
    over the whole step's tokens, all processes together, as one process would take it."""
    token_logp, mask = call(model, "token_logprobs", batch.fc, batch.att, batch.labels, att_mask=batch.att_mask)
    return -token_logp.sum() / D.per_process_share(mask.sum())


def most_frequent_caption(data: DataArtifact, chunk: int = 65536) -> np.ndarray:
    """The encoded caption (L,) that occurs most often among the training references (ties: the
    smallest id sequence). Reads the training labels in chunks."""
    counts: dict[bytes, int] = {}
    with h5py.File(data.path / "captions.h5", "r") as f:
        labels = f["labels"]
        train_row = np.zeros(labels.shape[0], dtype=bool)
        for i in data.split_indices("train"):
            train_row[data.label_start[i]:data.label_end[i]] = True
        for s in range(0, labels.shape[0], chunk):
            block = labels[s:s + chunk].astype(np.int32)[train_row[s:s + chunk]]
            rows, n = np.unique(block, axis=0, return_counts=True)
            for r, c in zip(rows, n):
                key = r.tobytes()
                counts[key] = counts.get(key, 0) + int(c)
    best = min(counts.items(), key=lambda kv: (-kv[1], tuple(np.frombuffer(kv[0], dtype=np.int32))))[0]
    return np.frombuffer(best, dtype=np.int32).copy()


def baseline_cider(data: DataArtifact, images: np.ndarray, cider=None) -> tuple[float, str]:
    """Mean CIDEr-D (training df) over ``images`` of the trivial captioner that answers every image
    with the most frequent training caption; and that caption. ``cider``: ``data``'s ``TrainCider``
    when already loaded."""
    from rdpp_cli.metrics.train_cider import TrainCider

    cap = most_frequent_caption(data)
    hyps = np.repeat(cap[None, :], len(images), axis=0)
    scores = (cider or TrainCider.for_data(data)).score(hyps, data.references_ids(images))
    return float(np.mean(scores)), data.decode(cap)


def _init_checkpoint(init_from: str | Path, workspace, data: DataArtifact) -> tuple[dict, str]:
    """The checkpoint dict to start from and where it came from; its vocabulary and feature sizes
    must be the data artifact's."""
    p = Path(init_from)
    if p.is_file():
        where = p
    else:
        art = resolve_input(init_from, workspace=workspace, groups=("xe", "finetune"), kind="rdpp.model",
                            what="model artifact", make_with="rdpp train-xe", quiet=not D.runtime().is_main)
        where = art.path / "checkpoints" / "best.pt"
    ckpt = load_checkpoint(where)
    check_fits_data(ckpt, data, f"--init-from {where}", "start from scratch or from a model trained on this data")
    return ckpt, str(where)


def train_xe(
    data: str | Path | None = None,
    *,
    out: Path | str | None = None,
    workspace: Path | str | None = None,
    preset: str = "paper",
    init_from: str | Path | None = None,
    epochs: int = 30,
    batch_size: int = 50,
    seq_per_img: int = 5,
    lr: float = 4e-4,
    grad_clip: float = 0.1,
    grad_clip_mode: str = "value",
    lr_decay_every: int = 3,
    lr_decay_rate: float = 0.8,
    val_images: int | None = None,
    val_batch_size: int = 100,
    save_every_steps: int = 0,
    device: str = "auto",
    precision: str = DEFAULT_PRECISION,
    workers: int = 0,
    seed: int = 123,
    resume: bool = True,
    force: bool = False,
    after_step: Callable[[int], None] | None = None,
) -> Artifact:
    """Train Att2in with cross-entropy on a data artifact; returns the model artifact.

    ``data``: a data artifact folder or its name in the workspace (default: the newest). ``out``:
    the folder to write (default: a new version ``<workspace>/xe/att2in-<preset>-v<k>``; an
    unfinished run with the same settings is resumed). ``precision``: fp32, bf16, fp16 or auto
    (``rdpp_cli.precision``; the resolved one is recorded in the manifest and is part of the
    settings a rerun must share to resume). ``after_step`` is for tests.
    """
    cfg = TrainConfig(epochs=epochs, batch_size=batch_size, seq_per_img=seq_per_img, lr=lr, grad_clip=grad_clip,
                      grad_clip_mode=grad_clip_mode, lr_decay_every=lr_decay_every, lr_decay_rate=lr_decay_rate,
                      val_images=val_images, val_batch_size=val_batch_size, save_every_steps=save_every_steps,
                      seed=seed, device=device, num_workers=workers, resume=resume,
                      precision=precision)
    cfg.check()
    if preset not in PRESETS:
        raise RdppError(f"--preset {preset!r} is not a preset; use one of {', '.join(PRESETS)}")
    rt = D.setup(device)  # RdppError for --device cuda without a GPU, before anything is touched
    prec = resolve_precision(precision, rt.device)
    try:
        art = resolve_input(data, workspace=workspace, groups=("data",), kind="rdpp.data", what="data artifact",
                            make_with="rdpp prepro toy` or `rdpp prepro coco", quiet=not rt.is_main)
        ds = DataArtifact(art)
        ds.split_indices("train")
        val_idx = validation_images(ds, val_images)
        cider = None
        if len(val_idx):  # validation scores with the training reward: refuse an outdated df now
            from rdpp_cli.metrics.train_cider import TrainCider

            cider = TrainCider.for_data(ds)
        init_ckpt, init_where = _init_checkpoint(init_from, workspace, ds) if init_from else (None, None)

        seed_everything(seed)  # the same initial weights on every process
        if init_ckpt is not None:
            model = model_from_checkpoint(init_ckpt, where=init_where)
        else:
            model = Att2in(config_from_preset(preset, vocab_size=ds.vocab_size, fc_feat_size=ds.fc_dim,
                                              att_feat_size=ds.att_dim, seq_length=ds.seq_length))
        # what decides the result (a rerun with these resumes the unfinished run: content, not paths) ...
        identity: dict[str, Any] = {
            "stage": "xe", "data_sha256": art.manifest_sha256, "preset": preset if init_ckpt is None else None,
            "init_sha256": sha256_file(Path(init_where)) if init_where else None, "epochs": epochs,
            "batch_size": batch_size, "seq_per_img": seq_per_img,
            "lr": lr, "grad_clip": grad_clip, "grad_clip_mode": grad_clip_mode, "lr_decay_every": lr_decay_every,
            "lr_decay_rate": lr_decay_rate, "val_images": val_images, "val_batch_size": val_batch_size,
            "seed": seed, "precision": prec,
        }
        # ... and what does not (recorded in the manifest too)
        config = {**identity, "data": ref_name(art), "init_from": init_where, "preset": preset, "device": device,
                  "precision_option": precision, "workers": workers, "save_every_steps": save_every_steps,
                  "processes": rt.world_size}
        name = f"att2in-{preset}" if init_ckpt is None else "att2in-init"
        out_dir = claim_output(out, workspace=workspace, group="xe", name=name, kind="rdpp.model",
                               config=identity, force=force, reads=[art.path, init_where])
        summary: dict[str, Any] = {}
        if len(val_idx):
            base, cap = D.on_main(lambda: baseline_cider(ds, val_idx, cider))
            summary["baseline_cider"] = base
            if rt.is_main:
                info(f"trivial baseline: every val image captioned '{cap}' scores CIDEr-D {base:.4f}")
        return run_training(stage="xe", model=model, data=ds, out_dir=out_dir, cfg=cfg, step_fn=xe_loss,
                            inputs=[art], manifest_config=config, summary=summary, after_step=after_step,
                            cider=cider)
    finally:
        D.teardown()

