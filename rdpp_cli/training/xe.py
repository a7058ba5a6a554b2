"""`rdpp train-xe`: a captioner (``--model``, rdpp_cli.models.registry) trained with cross-entropy,
the paper's first stage.

The loss is self-critical.pytorch's ``LanguageModelCriterion``: the negative log-likelihood of every
reference token and of the EOS after it (padding ignored), averaged over those tokens, with five
captions per image; with ``--label-smoothing`` its ``LabelSmoothing`` (the KL divergence to the
smoothed target). With scheduled sampling (``--ss-start``; probability ``XEOptions.ss_prob(epoch)``)
each input word after the first is, with that probability, a word sampled from the model's own
previous output distribution, as self-critical.pytorch's ``AttModel._forward`` does; the pass then
runs a step at a time (``models.base.scheduled_logprobs``). With either, the step's randomness
(dropout, coin flips, the draws) is drawn before the pass (``xe_draws``), so that ``--fast on``
compiles the same pass and gives the same numbers. Everything else (epochs, validation,
checkpoints, resume, DDP) is the shared loop in ``rdpp_cli.training.loop``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import math

import h5py
import numpy as np
import torch
from torch import Tensor, nn

from rdpp_cli.artifacts import Artifact, ref_name, resolve_input, sha256_file
from rdpp_cli.console import info
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import Batch
from rdpp_cli.models.base import DropoutMasks, scheduled_logprobs, targets
from rdpp_cli.models.registry import MODELS, model_spec
from rdpp_cli.errors import RdppError
from rdpp_cli.models.checkpoint import check_fits_data, checkpoint_model_name, load_checkpoint, model_from_checkpoint
from rdpp_cli.options import takes
from rdpp_cli.precision_probe import ProbeShape, resolve_precision
from rdpp_cli.training import distributed as D
from rdpp_cli.training.fast import EAGER, Steps, run_steps
from rdpp_cli.training.distributed import call, unwrap
from rdpp_cli.training.loop import StepFn, TrainingRecipe, check_lr_schedule, claim_run, run_settings
from rdpp_cli.training.validation import validation_images
from rdpp_cli.training.options import XEOptions
from rdpp_cli.training.state import seed_everything
from rdpp_cli.training.tensorboard import TENSORBOARD, TensorBoardLogger


def xe_loss(model: nn.Module, batch: Batch, steps: Steps = EAGER) -> Tensor:
    """Mean negative log-likelihood per token (words and the EOS, padding ignored) of the batch's
    captions: ``sequence_logprobs(model(att, labels), labels)`` through the model's faster
    ``token_logprobs`` (the output layer runs only on the tokens that count). Under DDP the mean is
    over the whole step's tokens, all processes together, as one process would take it. ``steps``
    (``training.fast``): the run's steps; the fast path draws the dropout first
    (``Steps.xe_dropout``) and takes the compiled fixed-shape pass."""
    drop = steps.xe_dropout(unwrap(model), batch.labels, batch.att.shape[1])
    token_logp, mask = steps.token_logprobs(model, batch.att, batch.labels, batch.att_mask, drop, batch.fc)
    return -token_logp.sum() / D.per_process_share(mask.sum())


def smoothed_nll(logprobs: Tensor, seqs: Tensor, smoothing: float) -> tuple[Tensor, Tensor]:
    """(sum over tokens, number of tokens) of self-critical.pytorch's ``LabelSmoothing`` loss of
    ``seqs`` (N, L) under ``logprobs`` (N, L+1, V+1): per token ``KL(t || p)`` with ``t`` the target
    word at ``1 - smoothing`` and every other word at ``smoothing / V``, over the tokens up to and
    including the EOS. ``smoothing`` 0 gives the negative log-likelihood."""
    target, mask = targets(seqs.reshape(-1, seqs.shape[-1]))
    K = logprobs.shape[-1]
    lp_t = logprobs.gather(2, target.unsqueeze(2).long()).squeeze(2)
    conf, off = 1.0 - smoothing, smoothing / (K - 1)
    entropy = sum(p * math.log(p) * n for p, n in ((conf, 1), (off, K - 1)) if p > 0)  # Σ t log t
    per_token = entropy - conf * lp_t - off * (logprobs.sum(-1) - lp_t)
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum(), mask.sum()


@dataclass
class XEDraws:
    """The randomness of an XE step with scheduled sampling or label smoothing, drawn before its
    pass (``xe_draws``), so that the pass is a function of its inputs: the eager and the fast path
    run the same numbers from the same seed."""

    drop: DropoutMasks | None  # the pass's dropout (None in eval mode)
    use: Tensor | None = None  # (N, L) bool: step t+1 is fed the model's own word (None: no scheduled sampling)
    uniforms: Tensor | None = None  # (N, L): the inverse-CDF draws of those words


def xe_draws(model: nn.Module, batch: Batch, ss_prob: float) -> XEDraws:
    """``XEDraws`` of ``batch`` from torch's generator on the batch's device, in this order: the
    dropout masks (``model.draw_dropout`` over the batch's images, caption rows and L+1 steps), then,
    with ``ss_prob`` > 0, the coin flips (N, L) (heads with probability ``ss_prob``) and the uniforms
    (N, L) of the words drawn from the model's own distribution."""
    B, n, L = batch.labels.shape
    drop = model.draw_dropout(B, B * n, L + 1, batch.att.shape[1]) if model.training else None
    if ss_prob <= 0:
        return XEDraws(drop)
    dev = batch.labels.device
    use = torch.rand(B * n, L, device=dev) < ss_prob
    return XEDraws(drop, use, torch.rand(B * n, L, device=dev))


def xe_terms(net: nn.Module, att: Tensor, labels: Tensor, att_mask: Tensor | None, fc: Tensor | None,
             drop: DropoutMasks | None, use: Tensor | None, uniforms: Tensor | None,
             smoothing: float) -> tuple[Tensor, Tensor]:
    """``smoothed_nll`` (sum, tokens) of ``labels`` under the full log-probs with the drawn
    randomness: one teacher-forced pass (``forward``) without scheduled sampling, else the pass a
    step at a time feeding the drawn words (``models.base.scheduled_logprobs``). Fixed shapes and
    no host wait: the fast path compiles it as it is."""
    if use is None:
        logprobs = call(net, "forward", att, labels, att_mask=att_mask, drop=drop, fc=fc)
    else:
        logprobs = call(net, scheduled_logprobs, att, labels, att_mask, fc, drop, use, uniforms)
    return smoothed_nll(logprobs, labels, smoothing)


@dataclass
class XELoss:
    """The XE step function: ``xe_loss`` while scheduled sampling is off and no label smoothing
    is asked; otherwise its randomness drawn first (``xe_draws``) and ``xe_terms`` (the full
    log-probs, a step at a time while ``ss_prob(epoch)`` > 0, and ``smoothed_nll``). ``steps``: the
    run's steps (``training.fast``: eager, or compiled with the same numbers). Logs the epoch's
    scheduled-sampling probability when it has one."""

    ss_prob: Callable[[int], float] = lambda epoch: 0.0
    label_smoothing: float = 0.0
    log_ss: bool = False
    steps: Steps = EAGER

    def __call__(self, net: nn.Module, batch: Batch) -> tuple[Tensor, dict[str, float]]:
        ss = self.ss_prob(batch.epoch)
        logs = {"ss_prob": ss} if self.log_ss else {}
        if ss == 0 and self.label_smoothing == 0:
            return xe_loss(net, batch, self.steps), logs
        d = xe_draws(unwrap(net), batch, ss)
        drop = self.steps.traceable(unwrap(net), d.drop, *batch.att.shape[:2])
        total, tokens = self.steps.compiled_step(xe_terms)(net, batch.att, batch.labels, batch.att_mask, batch.fc,
                                                           drop, d.use, d.uniforms, self.label_smoothing)
        return total / D.per_process_share(tokens), logs


def fast_xe_loss(steps: Steps) -> StepFn:
    """``xe_loss`` through ``steps`` (the benchmarks' form: a step function of (net, batch))."""
    return lambda net, batch: xe_loss(net, batch, steps)


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


def _init_checkpoint(init_from: str | Path, workspace, data: DataArtifact, model: str) -> tuple[dict, str]:
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
    held = checkpoint_model_name(ckpt)
    if held != model:
        raise RdppError(f"--init-from {where} holds a {held} model, not {model}; pass --model {held}")
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
    check_folder_options(opts)
    init, where = _init_checkpoint(opts.init_from, opts.workspace, ds, opts.model) if opts.init_from else (None, None)
    return XEInputs(art, ds, val_idx, cider, init, where)


def build_model(opts: XEOptions, inp: XEInputs) -> nn.Module:
    """The model to train (``--model`` at ``--preset``'s size), seeded so that every process builds
    the same initial weights."""
    seed_everything(opts.seed)
    if inp.init is not None:
        return model_from_checkpoint(inp.init, where=inp.init_where)
    ds = inp.data
    if model_spec(opts.model).folder_option:
        return folder_model(opts, ds)
    return model_spec(opts.model).build(opts.preset, vocab_size=ds.vocab_size, att_feat_size=ds.att_dim,
                                        fc_feat_size=ds.fc_dim, seq_length=ds.seq_length)


def probe_shape(model: nn.Module, data: DataArtifact, opts: Any, steps: Steps, seq_per_img: int | None = None
                ) -> ProbeShape:
    """What ``--precision auto`` times for this run: its model (as built), its batch and captions per
    image, the data's regions and caption length, and the steps it takes (``steps.fast``)."""
    n = opts.seq_per_img if seq_per_img is None else seq_per_img
    return ProbeShape.of(model, images=opts.batch_size, seq_per_img=n, regions=data.att_regions,
                         steps=data.seq_length, fast=steps.fast)


def check_folder_options(opts: XEOptions) -> None:
    """RdppError for a folder option (a registry line's ``folder_option``, such as ``--hf-model``)
    given with a ``--model`` that does not read it."""
    for spec in MODELS.values():
        option = spec.folder_option
        if option and getattr(opts, option, None) and spec.name != opts.model:
            flag = "--" + option.replace("_", "-")
            raise RdppError(f"{flag} is for --model {spec.name}, not --model {opts.model}; pass --model {spec.name} "
                            f"or leave {flag} out")


def folder_model(opts: XEOptions, ds: DataArtifact) -> nn.Module:
    """A pretrained model read from the folder its option names (``--model hf --hf-model DIR``),
    whose encoder must have made the data's att features (its hidden size is their size)."""
    spec = model_spec(opts.model)
    flag = "--" + spec.folder_option.replace("_", "-")
    folder = getattr(opts, spec.folder_option)
    if not folder:
        raise RdppError(f"--model {opts.model} needs {flag} DIR, the save_pretrained folder of the pretrained model; "
                        "pass it (docs/model.md)")
    model = spec.cls.from_folder(folder, data_seq_length=ds.seq_length)
    if model.config.att_feat_size != ds.att_dim:
        raise RdppError(f"{flag} {folder}: its encoder's hidden size is {model.config.att_feat_size} but data artifact "
                        f"{ds.path} has {ds.att_dim}-d att features; make the data with its encoder "
                        f"(`rdpp prepro ... --backbone hf:{folder}`)")
    model.check_data(ds.artifact.config, ds.path, f"{flag} ")  # the very encoder, not one of the same size
    return model


def step_function(opts: XEOptions, steps: Steps) -> StepFn:
    """The XE step (``XELoss``) taken by the run's steps."""
    return XELoss(opts.ss_prob, opts.label_smoothing, log_ss=opts.scheduled_sampling, steps=steps)


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
    """Train a captioner with cross-entropy on a data artifact; returns the model artifact.

    ``opts`` (or its fields as keyword arguments; ``rdpp_cli.training.options.XEOptions``):
    ``data`` is a data artifact folder or its name in the workspace (default: the newest); ``model``
    the captioner (``rdpp_cli.models.registry``) and ``preset`` its size and recipe (the loop
    settings not given: ``XEOptions.with_preset``); ``out``
    the folder to write (default: a new version ``<workspace>/xe/<model>-<preset>-v<k>``; an
    unfinished run with the same settings is resumed); ``precision`` fp32, bf16, fp16 or auto
    (``rdpp_cli.precision``; the resolved one is recorded in the manifest and is part of the
    settings a rerun must share to resume); ``fast`` auto, on or off (the fast path,
    ``rdpp_cli.training.fast``: the same numbers; recorded, not part of the resume identity).
    ``after_step`` is for tests.
    """
    opts = opts.with_preset()
    rt = D.setup(opts.device)  # RdppError for --device cuda without a GPU, before anything is touched
    try:
        inp = read_inputs(opts, quiet=not rt.is_main)
        model = build_model(opts, inp)
        check_lr_schedule(opts, model)  # refused before the output folder is claimed
        steps = run_steps(opts.fast, rt.device, model)  # --fast resolved once, with the model
        # measured once, by rank 0, for every process (`auto`): the processes must train in one precision
        shape = probe_shape(model, inp.data, opts, steps)
        precision = D.on_main(lambda: resolve_precision(opts.precision, rt.device, shape))
        # the sizes came from --preset, or from the --init-from model (then no preset's: record what ran)
        sizes = {"preset": opts.preset} if inp.init is None else {"preset": None, "sizes_from": inp.init_where}
        identity, config = run_settings(
            "xe", opts, precision, recorded={"data": ref_name(inp.artifact), "init_from": inp.init_where, **sizes},
            identity={"data_sha256": inp.artifact.manifest_sha256, "preset": opts.preset if inp.init is None else None,
                      "init_sha256": sha256_file(Path(inp.init_where)) if inp.init_where else None}, fast=steps.fast)
        name = f"{opts.model}-{opts.preset}" if inp.init is None else f"{opts.model}-init"
        out_dir, config, steps = claim_run(opts, identity, config, steps, model, group="xe", name=name,
                                           reads=[inp.artifact.path, inp.init_where])
        return TrainingRecipe(stage="xe", model=model, data=inp.data, out_dir=out_dir, opts=opts,
                              step_fn=step_function(opts, steps), inputs=[inp.artifact],
                              manifest_config=config, summary=baseline_summary(inp), after_step=after_step,
                              cider=inp.cider, loggers=[TensorBoardLogger(out_dir / TENSORBOARD)], steps=steps).run()
    finally:
        D.teardown()
