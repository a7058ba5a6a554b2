"""`rdpp train-xe`: Att2in trained with cross-entropy (teacher forcing), the paper's first stage.

The loss is self-critical.pytorch's ``LanguageModelCriterion``: the negative log-likelihood of every
reference token and of the EOS after it (padding ignored), averaged over those tokens, with five
captions per image. Everything else (epochs, validation, checkpoints, resume, DDP) is the shared
loop in ``rdpp_cli.training.loop``.
"""

from __future__ import annotations

from dataclasses import dataclass
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
from rdpp_cli.models.att2in import Att2in, config_from_preset
from rdpp_cli.models.checkpoint import check_fits_data, load_checkpoint, model_from_checkpoint
from rdpp_cli.options import takes
from rdpp_cli.precision import resolve_precision
from rdpp_cli.training import distributed as D
from rdpp_cli.training.fast import FastPath, fast_path
from rdpp_cli.training.distributed import call, claim_output, unwrap
from rdpp_cli.training.loop import StepFn, TrainingRecipe, run_settings
from rdpp_cli.training.validation import validation_images
from rdpp_cli.training.options import XEOptions
from rdpp_cli.training.state import seed_everything
from rdpp_cli.training.tensorboard import TENSORBOARD, TensorBoardLogger


def xe_loss(model: nn.Module, batch: Batch) -> Tensor:
    """Mean negative log-likelihood per token (words and the EOS, padding ignored) of the batch's
    captions: ``sequence_logprobs(model(att, labels), labels)`` through the model's faster
    ``token_logprobs`` (the output layer runs only on the tokens that count). Under DDP the mean is
    over the whole step's tokens, all processes together, as one process would take it."""
    token_logp, mask = call(model, "token_logprobs", batch.att, batch.labels, att_mask=batch.att_mask, fc=batch.fc)
    return -token_logp.sum() / D.per_process_share(mask.sum())


def fast_xe_loss(fast: FastPath) -> StepFn:
    """``xe_loss`` through the fast path (``rdpp_cli.training.fast``): the step's dropout drawn
    first (on a CPU the draws ``xe_loss`` makes), then the compiled fixed-shape teacher-forced pass;
    the same loss and gradients to float32 rounding."""

    def step(net: nn.Module, batch: Batch) -> Tensor:
        drop = fast.xe_dropout(unwrap(net), batch.labels, batch.att.shape[1])
        token_logp, mask = fast.token_logprobs(net, batch.att, batch.labels, batch.att_mask, drop)
        return -token_logp.sum() / D.per_process_share(mask.sum())

    return step


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
        where = art.file("checkpoints/best.pt")  # checked against the model's manifest
    ckpt = load_checkpoint(where)
    check_fits_data(ckpt, data, f"--init-from {where}", "start from scratch or from a model trained on this data")
    return ckpt, str(where)


@dataclass
class XEInputs:
    """What a train-xe run reads: the data artifact, its validation images and scorer, and the
    checkpoint ``--init-from`` names (with where it came from)."""

    artifact: Artifact
    data: DataArtifact
    val_images: np.ndarray
    cider: Any  # TrainCider of ``data`` when validating, else None
    init: dict | None = None
    init_where: str | None = None


def read_inputs(opts: XEOptions, quiet: bool) -> XEInputs:
    """The data artifact (RdppError for one that cannot be trained on) and the init checkpoint."""
    art = resolve_input(opts.data, workspace=opts.workspace, groups=("data",), kind="rdpp.data",
                        what="data artifact", make_with="rdpp prepro toy` or `rdpp prepro coco", quiet=quiet)
    ds = DataArtifact(art)
    ds.split_indices("train")
    val_idx = validation_images(ds, opts.val_images)
    cider = None
    if len(val_idx):  # validation scores with the training reward: refuse an outdated df now
        from rdpp_cli.metrics.train_cider import TrainCider

        cider = TrainCider.for_data(ds)
    init, where = _init_checkpoint(opts.init_from, opts.workspace, ds) if opts.init_from else (None, None)
    return XEInputs(art, ds, val_idx, cider, init, where)


def build_model(opts: XEOptions, inp: XEInputs) -> nn.Module:
    """The model to train, seeded so that every process builds the same initial weights."""
    seed_everything(opts.seed)
    if inp.init is not None:
        return model_from_checkpoint(inp.init, where=inp.init_where)
    ds = inp.data
    return Att2in(config_from_preset(opts.preset, vocab_size=ds.vocab_size, att_feat_size=ds.att_dim,
                                     seq_length=ds.seq_length))


def baseline_summary(inp: XEInputs) -> dict[str, Any]:
    """``baseline_cider``: the trivial captioner's val CIDEr-D (printed once)."""
    if not len(inp.val_images):
        return {}
    base, cap = D.on_main(lambda: baseline_cider(inp.data, inp.val_images, inp.cider))
    if D.runtime().is_main:
        info(f"trivial baseline: every val image captioned '{cap}' scores CIDEr-D {base:.4f}")
    return {"baseline_cider": base}


@takes(XEOptions)
def train_xe(opts: XEOptions, *, after_step: Callable[[int], None] | None = None) -> Artifact:
    """Train Att2in with cross-entropy on a data artifact; returns the model artifact.

    ``opts`` (or its fields as keyword arguments; ``rdpp_cli.training.options.XEOptions``):
    ``data`` is a data artifact folder or its name in the workspace (default: the newest); ``out``
    the folder to write (default: a new version ``<workspace>/xe/att2in-<preset>-v<k>``; an
    unfinished run with the same settings is resumed); ``precision`` fp32, bf16, fp16 or auto
    (``rdpp_cli.precision``; the resolved one is recorded in the manifest and is part of the
    settings a rerun must share to resume); ``fast`` auto, on or off (the fast path,
    ``rdpp_cli.training.fast``: the same numbers; recorded, not part of the resume identity).
    ``after_step`` is for tests.
    """
    rt = D.setup(opts.device)  # RdppError for --device cuda without a GPU, before anything is touched
    precision = resolve_precision(opts.precision, rt.device)
    try:
        inp = read_inputs(opts, quiet=not rt.is_main)
        model = build_model(opts, inp)
        identity, config = run_settings(
            "xe", opts, precision, recorded={"data": ref_name(inp.artifact), "init_from": inp.init_where},
            identity={"data_sha256": inp.artifact.manifest_sha256, "preset": opts.preset if inp.init is None else None,
                      "init_sha256": sha256_file(Path(inp.init_where)) if inp.init_where else None})
        name = f"att2in-{opts.preset}" if inp.init is None else "att2in-init"
        out_dir = claim_output(opts.out, workspace=opts.workspace, group="xe", name=name, kind="rdpp.model",
                               config=identity, force=opts.force, reads=[inp.artifact.path, inp.init_where])
        fast = fast_path(opts.fast, rt.device)
        return TrainingRecipe(stage="xe", model=model, data=inp.data, out_dir=out_dir, opts=opts,
                              step_fn=fast_xe_loss(fast) if fast is not None else xe_loss, inputs=[inp.artifact],
                              manifest_config=config, summary=baseline_summary(inp), after_step=after_step,
                              cider=inp.cider, loggers=[TensorBoardLogger(out_dir / TENSORBOARD)], fast=fast).run()
    finally:
        D.teardown()
