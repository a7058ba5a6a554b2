"""`rdpp finetune`: RL fine-tuning of an XE model with R-DPP, SCST, mean-baseline SCST or XE+λCIDEr.

Every step, for the B images of a batch (the objective of the published R-DPP code and
self-critical.pytorch; docs/rewards.md):

1. sample ``m`` captions per image from the policy with the batched decoder (``method="random"``,
   temperature 1) with dropout on, its masks drawn in advance from a generator seeded by (seed,
   epoch, batch, rank), so a resumed run draws the same captions (``RewardStep.sample``);
2. score them in one vectorised call each with the training reward's CIDEr-D
   (``rdpp_cli.metrics.train_cider``: the fixed document frequencies of ``cider_df.h5``, the end
   token of every caption that ended counted): ``q`` (B, m) against the image's references and,
   for R-DPP, the kernel ``S`` (B, m, m), ``S_ij`` = caption j scored against caption i (i <= j);
3. turn them into per-sample weights (``rdpp_cli.training.rewards``): R-DPP weights, the SCST
   advantage over the greedy caption (decoded in eval mode), or the leave-one-out mean baseline;
4. compute the samples' log-probs with one teacher-forced pass that replays the sampling pass's
   dropout masks -- exactly the log-probs the captions were drawn with (on-policy) -- and minimise
   ``-Σ w · log p`` over the sampled tokens (the EOS a caption sampled counts; the EOS forced after a
   caption of ``max_len`` words does not).

Epochs, validation (greedy CIDEr-D), checkpoints, exact resume, metrics.csv, DDP and progress are
the shared loop of ``rdpp_cli.training.loop``, as in ``rdpp train-xe``. Each epoch also samples
``VAL_SAMPLES`` captions per validation image and logs their mean CIDEr-D and self-CIDEr, so
metrics.csv shows the accuracy–diversity trade-off as it develops. See docs/rewards.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor, nn

from rdpp_cli.artifacts import Artifact, ref_name, resolve_input
from rdpp_cli.artifacts.lineage import resolve_data_for
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import Batch
from rdpp_cli.decoding.decode import DecodeConfig, draw_uniforms
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.train_cider import NumpyScoring, TrainCider
from rdpp_cli.models.base import DropoutMasks
from rdpp_cli.models.bridge import WordBridge, bridge_for
from rdpp_cli.models.checkpoint import check_fits_data, checkpoint_model_name, load_checkpoint, model_from_checkpoint
from rdpp_cli.options import takes
from rdpp_cli.precision import full_precision
from rdpp_cli.precision_probe import resolve_precision
from rdpp_cli.training import distributed as D
from rdpp_cli.training.fast import EAGER, Steps, device_cider, run_steps
from rdpp_cli.training.distributed import unwrap
from rdpp_cli.training.loop import TrainingRecipe, claim_run, run_settings
from rdpp_cli.training.validation import validation_images
from rdpp_cli.training.xe import probe_shape
from rdpp_cli.training.options import FinetuneOptions
from rdpp_cli.training.reward_table import REWARDS, Reward
from rdpp_cli.training.rewards import pg_loss, sampled_mask
from rdpp_cli.training.state import seed_everything
from rdpp_cli.training.tensorboard import TENSORBOARD, TensorBoardLogger

# What the training reward is, recorded in the manifest: CIDEr-D with the training df counted over
# tokens + EOS, the EOS of every caption that ended counted, the published kernel direction.
TRAIN_REWARD = "cider-d+eos"
VAL_SAMPLES = 5  # random samples per validation image for the per-epoch accuracy/diversity columns


# ----------------------------------------------------------------------------------------------
# one step
# ----------------------------------------------------------------------------------------------

def sample_seed(seed: int, epoch: int, batch: int, rank: int, *stream: int) -> int:
    """The sampling generator's seed for one step of one process: a pure function of the position
    (``stream`` tells apart further generators of the same step)."""
    return int(np.random.SeedSequence([seed, epoch, batch, rank, *stream]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _step_tokens(mask: Tensor, groups: int) -> Tensor:
    """The loss denominators of the whole step, shared out over the processes (``pg_loss``'s
    ``tokens``): the sampled-token count, or with ``groups`` > 1 the count of each sample slot."""
    local = mask.sum() if groups == 1 else mask.view(-1, groups, mask.shape[-1]).sum(dim=(0, 2))
    return D.per_process_share(local)


def _pad_to(x: Tensor, T: int) -> Tensor:
    return x if x.shape[-1] >= T else torch.nn.functional.pad(x, (0, T - x.shape[-1]))


def _tensor(x: np.ndarray | Tensor | None) -> Tensor | None:
    return torch.from_numpy(np.asarray(x)) if x is not None and not isinstance(x, Tensor) else x


def reward_weights(scorer, weight_fn, want_kernel: bool, baseline: str, samples: Tensor, greedy: Tensor | None,
                   refs) -> tuple[Tensor, dict[str, Tensor]]:
    """The step's reward, on either scoring backend (``scorer``: ``train_cider.NumpyScoring`` on the
    host or ``train_cider_torch.DeviceTrainCider`` where the captions are; ``refs`` in its form):
    the training CIDEr-D ``q`` (B, m) of the samples and ``g`` (B,) of the greedy captions (None
    without them) in one scoring call, the samples' kernel ``K`` (B, m, m) where ``want_kernel``,
    turned into the weights (B, m) float32 by ``weight_fn`` (``training.rewards``) with the
    numbers to log (tensors: sample CIDEr-D, the weight function's, the mean self-CIDEr)."""
    B, m, T = samples.shape
    if greedy is None and want_kernel:  # R-DPP: q and S from one pass over the captions
        q, K = scorer.score_and_pairwise(samples, refs)
        g = None
    else:
        hyps, index = samples.reshape(B * m, T), torch.arange(B, device=samples.device).repeat_interleave(m)
        if greedy is not None:  # samples and greedy captions in one scoring call
            Tg = max(T, greedy.shape[1])
            hyps, index = torch.cat([scorer.pad(hyps, Tg), scorer.pad(greedy, Tg)]), torch.cat([index, index[::m]])
        scores = scorer.score(hyps, refs, index)
        q, g = scores[:B * m].view(B, m), (scores[B * m:] if greedy is not None else None)
        K = scorer.pairwise(samples) if want_kernel else None
    w, more = weight_fn(q, g, K, baseline)
    logs: dict[str, Tensor] = {"sample_cider": q.mean(), **more}
    if K is not None and m > 1:
        logs["self_cider"] = scorer.self_cider(K).mean()
    return w.to(torch.float32), logs


@dataclass
class Draw:
    """One step's captions: what the policy sampled and what SCST compares them with."""

    samples: Tensor  # (B, m, T) sampled word ids, 0-padded
    lengths: Tensor  # (B, m) words of each sample (EOS excluded)
    logprobs: Tensor  # (B, m, T + 1) the log-probability each token was drawn with (0 past the caption)
    drop: DropoutMasks | None  # the dropout masks they were drawn with (sample_mode "train")
    greedy: Tensor | None = None  # (B, T') greedy captions, eval mode (scst, xe-cider)


@dataclass
class RewardStep:
    """The step function handed to the shared loop: ``step(net, batch) -> (loss, logs)``.

    ``steps`` (the run's ``rdpp_cli.training.fast.Steps``: eager, or a ``FastPath``) decode,
    score and take the teacher-forced pass. The fast path samples with the whole decoding pass
    compiled as one function and no host wait (captions kept at ``max_len`` columns), scores on the
    model's device (``DeviceTrainCider`` against the data artifact's ``ReferenceTable``, compiled),
    and takes the policy log-probs from the compiled fixed-shape pass: the same captions, the same
    numbers to float32 rounding (the reward to ~1e-15). Both draw the sampling's randomness in
    advance from the step's generator (dropout masks, ``draw_uniforms``)."""

    data: DataArtifact | None  # references of the batch's images (None: pass refs to ``weights`` yourself)
    cider: TrainCider
    reward: str = "dpp"
    m: int = 5
    baseline: str = "none"
    lam: float = 5.0
    max_len: int = 16
    seed: int = 123
    rank: int = 0
    sample_mode: str = "train"
    steps: Steps = EAGER
    bridge: Any = None  # models.bridge: the model's ids -> the data's words (None: the model speaks them)

    @property
    def spec(self) -> Reward:
        """This step's reward: what it needs and its weight function (``training.reward_table``)."""
        return REWARDS[self.reward]

    def _generator(self, batch: Batch) -> torch.Generator:
        gen = torch.Generator(device=batch.att.device)
        gen.manual_seed(sample_seed(self.seed, batch.epoch, batch.batch, self.rank))
        return gen

    def sample(self, model: nn.Module, batch: Batch) -> Draw:
        """``m`` captions per image drawn from the policy (no gradient).

        ``sample_mode="train"`` (default, on-policy, as the published code): dropout is on while
        sampling, with masks drawn in advance from the step's generator; ``loss`` replays the very
        same masks, so the log-probabilities that carry the gradient are those the captions were
        drawn with. ``"eval"``: sampled without dropout and scored with fresh dropout in ``loss``
        (off-policy, an option for comparison; docs/rewards.md).
        """
        gen = self._generator(batch)
        cfg = DecodeConfig(method="random", n=self.m, max_len=self.max_len)  # the decoder's n: our m
        was = model.training
        drop = None
        try:
            if self.sample_mode == "train":
                B, R = batch.att.shape[:2]
                drop = model.draw_dropout(B, B * self.m, self.max_len + 1, R, generator=gen)
                model.train()
            else:
                model.eval()
            u = draw_uniforms(batch.att.shape[0] * self.m, self.max_len, gen, batch.att.device)
            dec = self._decode(model, batch, cfg, drop, u)
        finally:
            model.train(was)
        return Draw(dec.tokens, dec.lengths, dec.logprobs, drop)

    def _decode(self, model: nn.Module, batch: Batch, cfg: DecodeConfig, drop=None, uniforms=None):
        """``Steps.decode``: ``decode``, or with the fast path the whole static pass as one compiled
        function: the same captions from the same masks and uniforms (not trimmed)."""
        return self.steps.decode(model, batch.att, cfg, batch.att_mask, batch.fc, drop, uniforms)

    def greedy(self, model: nn.Module, batch: Batch) -> Tensor:
        """The greedy captions (B, T) of SCST's baseline, decoded in eval mode (self-critical.pytorch)."""
        was = model.training
        model.eval()
        try:
            dec = self._decode(model, batch, DecodeConfig(method="greedy", max_len=self.max_len))
        finally:
            model.train(was)
        return dec.tokens[:, 0]

    def draw(self, model: nn.Module, batch: Batch) -> Draw:
        """The step's ``m`` samples and, for a reward with a greedy baseline, the greedy captions."""
        d = self.sample(model, batch)
        if self.spec.greedy:
            d.greedy = self.greedy(model, batch)
        return d

    def weights(self, samples: np.ndarray | Tensor, greedy: np.ndarray | Tensor | None, refs
                ) -> tuple[Tensor, dict[str, float]]:
        """Per-sample weights (B, m) float32 and the numbers to log, from the captions alone:
        ``refs`` a list of (k, L) id arrays (``DataArtifact.references_ids``: numpy CIDEr-D on the
        host, ``TrainCider``), or ``(refs, counts)`` tensors (``ReferenceTable.take``: the same
        numbers to ~1e-15 where the captions are, ``DeviceTrainCider``)."""
        if isinstance(refs, tuple):
            w, logs = self.device_weights(_tensor(samples), _tensor(greedy), *refs)
        else:
            host = [None if x is None else _tensor(x).cpu() for x in (samples, greedy)]
            w, logs = reward_weights(NumpyScoring(self.cider), self.spec.weight_fn(), self._want_kernel, self.baseline,
                                     *host, refs)
        return w, {k: float(v) for k, v in logs.items()}

    @property
    def _want_kernel(self) -> bool:
        return self.spec.kernel or self.m > 1  # R-DPP's kernel, or the logged self-CIDEr

    def device_weights(self, samples: Tensor, greedy: Tensor | None, refs: Tensor, counts: Tensor
                       ) -> tuple[Tensor, dict[str, Tensor]]:
        """``weights`` where the captions are (torch, float64), the numbers left on the device;
        ``refs`` (B, k, L) and ``counts`` (B,) from ``ReferenceTable.take``. With the fast path
        compiled as one function (``fullgraph``: nothing waits for the device)."""
        return self._reward(device_cider(self.cider, samples.device), samples, greedy, (refs, counts))

    def _reward(self, scorer, samples: Tensor, greedy: Tensor | None, refs) -> tuple[Tensor, dict[str, Tensor]]:
        """``reward_weights`` of this step's reward on ``scorer``, as the run's steps run it (compiled on
        the fast path)."""
        return self.steps.compiled(reward_weights)(scorer, self.spec.weight_fn(), self._want_kernel, self.baseline,
                                                   samples, greedy, refs)

    def _teacher_forced(self, net: nn.Module, batch: Batch, seqs: Tensor, drop: DropoutMasks | None
                        ) -> tuple[Tensor, Tensor]:
        """``token_logprobs`` of ``seqs`` under ``net`` (the fast path's compiled fixed-shape pass)."""
        return self.steps.token_logprobs(net, batch.att, seqs, batch.att_mask, drop, batch.fc)

    def policy_logprobs(self, net: nn.Module, batch: Batch, d: Draw) -> tuple[Tensor, Tensor]:
        """Teacher-forced log-probs (B*m, T+1) of the sampled tokens and the mask of those the policy
        drew (the EOS forced after a caption of ``max_len`` words is not among them)."""
        token_logp, mask = self._teacher_forced(net, batch, d.samples, d.drop)
        return token_logp, sampled_mask(mask, d.lengths.reshape(-1), self.max_len)

    def loss(self, net: nn.Module, batch: Batch, d: Draw, w: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The policy-gradient loss (plus the references' XE loss for an ``xe_mix`` reward) from one
        teacher-forced pass."""
        B, m = d.samples.shape[0], self.m
        w = w.reshape(-1).to(batch.att.device)
        if not self.spec.xe_mix:
            token_logp, mask = self.policy_logprobs(net, batch, d)
            groups = m if self.spec.per_slot else 1
            loss = pg_loss(token_logp, mask, w, groups=groups, tokens=_step_tokens(mask, groups))
            return loss, {"pg_loss": loss.detach()}
        # XE + λ·SCST in one pass over the references and the samples of each image
        labels = batch.labels
        k = labels.shape[1]
        T = max(labels.shape[-1], d.samples.shape[-1])
        seqs = torch.cat([_pad_to(labels, T), _pad_to(d.samples, T)], dim=1)  # (B, k + m, T)
        drop = self._with_reference_rows(net, batch, d, k)
        token_logp, mask = self._teacher_forced(net, batch, seqs, drop)
        token_logp, mask = token_logp.view(B, k + m, -1), mask.view(B, k + m, -1)
        xe_logp, xe_mask = token_logp[:, :k], mask[:, :k]
        s_logp = token_logp[:, k:].reshape(B * m, -1)
        s_mask = sampled_mask(mask[:, k:].reshape(B * m, -1), d.lengths.reshape(-1), self.max_len)
        xe = -xe_logp.sum() / D.per_process_share(xe_mask.sum())
        sc = pg_loss(s_logp, s_mask, w, groups=1, tokens=_step_tokens(s_mask, 1))
        return xe + self.lam * sc, {"xe_loss": xe.detach(), "pg_loss": sc.detach()}

    def _with_reference_rows(self, net: nn.Module, batch: Batch, d: Draw, k: int) -> DropoutMasks | None:
        """xe-cider's masks for rows (image b: k references, then its m samples): fresh masks for the
        references (their own generator position), the sampling masks replayed for the samples."""
        if d.drop is None:
            return None
        B = d.samples.shape[0]
        gen = torch.Generator(device=batch.att.device)
        gen.manual_seed(sample_seed(self.seed, batch.epoch, batch.batch, self.rank, 1))
        fresh = unwrap(net).draw_dropout(B, B * k, d.drop.steps, batch.att.shape[1], generator=gen)
        return d.drop.with_rows_before(fresh, B)

    def __call__(self, net: nn.Module, batch: Batch) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.draw(unwrap(net), batch)
        scorer, refs = self.steps.scoring(self.cider, self.data, batch.index, batch.att.device)
        words = [None if x is None else self.steps.words(self.bridge, x) for x in (d.samples, d.greedy)]
        with full_precision(batch.att.device):  # the reward never runs under autocast
            w, logs = self._reward(scorer, *words, refs)
        loss, more = self.loss(net, batch, d, w)
        return loss, {**logs, **more}

    def val_metrics(self, model: nn.Module, batch: Batch) -> dict[str, np.ndarray | Tensor]:
        """Per validation image: mean CIDEr-D and self-CIDEr of ``VAL_SAMPLES`` random samples
        (a fixed generator per batch, so epochs are compared on the same randomness; its uniforms
        drawn in advance, as the training step's). With the fast path the sampling pass and the
        scores are compiled and stay on the device (the same numbers)."""
        gen = torch.Generator(device=batch.att.device)
        gen.manual_seed(sample_seed(self.seed, 2**31, int(batch.index[0]), 0))  # not a training position
        cfg = DecodeConfig(method="random", n=VAL_SAMPLES, max_len=self.max_len)
        dec = self._decode(model, batch, cfg, uniforms=draw_uniforms(batch.size * VAL_SAMPLES, self.max_len, gen,
                                                                     batch.att.device))
        scorer, refs = self.steps.scoring(self.cider, self.data, batch.index, batch.att.device)
        with full_precision(batch.att.device):
            q, div = self.steps.compiled(_sample_scores, row_wise=True)(scorer, self.steps.words(self.bridge, dec.tokens), refs)
        return {"val_sample_cider": q, "val_self_cider": div}


def _sample_scores(scorer, samples: Tensor, refs) -> tuple[Tensor, Tensor]:
    """Mean CIDEr-D (B,) of each image's samples (B, n, T) and their self-CIDEr (B,), on the
    scorer's side (``NumpyScoring``: numpy's mean, as arrays; ``DeviceTrainCider``: on the device)."""
    q, K = scorer.score_and_pairwise(samples, refs)
    return scorer.sample_mean(q), scorer.self_cider(K)


# ----------------------------------------------------------------------------------------------
# the stage
# ----------------------------------------------------------------------------------------------

def run_name(reward: str, m: int, baseline: str, lam: float) -> str:
    """The workspace name stem: dpp-m5, dpp-m5-mean, scst, scst-mean, xe-cider-l5 (m ≠ 5 is added)."""
    return REWARDS[reward].run_name(m, baseline, lam)


def resolve_xe_model(model: str | Path | None, workspace: Path | str | None, quiet: bool = False) -> Artifact:
    """The XE model artifact to fine-tune; RdppError when it is not one."""
    art = resolve_input(model, workspace=workspace, groups=("xe",), kind="rdpp.model", what="XE model artifact",
                        make_with="rdpp train-xe", quiet=quiet)
    stage = art.config.get("stage")
    if stage != "xe":
        raise RdppError(f"model artifact {art.path} is {'a ' + stage if stage else 'not an XE'}-trained model "
                        f"(stage {stage!r}), not XE-trained; fine-tune from a model made by `rdpp train-xe`")
    return art


@dataclass
class FinetuneInputs:
    """What a finetune run reads: the XE model artifact and its checkpoint, the data artifact it was
    trained on and that data's training reward."""

    model: Artifact
    data_artifact: Artifact
    data: DataArtifact
    checkpoint: dict
    checkpoint_path: Path
    cider: TrainCider


def read_inputs(opts: FinetuneOptions, quiet: bool) -> FinetuneInputs:
    """The inputs, checked (RdppError) before anything is written."""
    model_art = resolve_xe_model(opts.model, opts.workspace, quiet=quiet)
    data_art = resolve_data_for(model_art, opts.data, opts.workspace, quiet=quiet)
    ds = DataArtifact(data_art)
    ds.split_indices("train")
    validation_images(ds, opts.val_images)
    ckpt_path = model_art.file(f"checkpoints/{opts.checkpoint}.pt")
    ckpt = load_checkpoint(ckpt_path)
    check_fits_data(ckpt, ds, str(ckpt_path), "fine-tune on the data the model was trained on")
    cider = TrainCider.for_data(ds)  # refuses a data artifact whose df lacks the end token
    return FinetuneInputs(model_art, data_art, ds, ckpt, ckpt_path, cider)


def headline(opts: FinetuneOptions, inp: FinetuneInputs) -> dict[str, Any]:
    """The manifest's summary beside the loop's: the reward, m, the preset, the XE model's score."""
    summary: dict[str, Any] = {"reward": opts.reward, "m": opts.m, "preset": opts.preset}
    summary.update({k: getattr(opts, k) for k in REWARDS[opts.reward].settings})
    if inp.checkpoint.get("val_cider") is not None:
        summary["xe_val_cider"] = inp.checkpoint["val_cider"]
    return summary


@takes(FinetuneOptions)
def finetune(opts: FinetuneOptions, *, after_step: Callable[[int], None] | None = None) -> Artifact:
    """Fine-tune an XE model artifact with a sequence-level reward; returns the new model artifact.

    ``opts`` (or its fields as keyword arguments; ``rdpp_cli.training.options.FinetuneOptions``):
    ``model`` is an XE model artifact folder or its name in the workspace (default: the newest);
    ``data`` its data artifact (default: the one the model was trained on; another is refused);
    ``reward`` dpp (R-DPP over ``m`` samples, ``baseline`` none|mean), scst (greedy baseline),
    scst-mean (leave-one-out mean baseline) or xe-cider (XE + ``lam`` × SCST); ``preset`` the
    recipe of the XE model's architecture (small or paper; rdpp_cli.models.registry) that fills
    ``epochs``, ``batch_size``, ``lr``, ``lr_decay_every``, ``lr_decay_rate`` and ``lr_schedule``
    where no value was given;
    ``sample_mode`` train (on-policy, the default) or eval (``RewardStep.sample``); ``precision``
    fp32, bf16, fp16 or auto: sampling and the teacher-forced pass run under the same autocast,
    the reward outside it; ``fast`` auto, on or off (``RewardStep.steps``, ``rdpp_cli.training.fast``);
    ``checkpoint`` the XE checkpoint to start from (best or last); ``out``
    default a new version ``<workspace>/finetune/<run_name>-v<k>``. ``after_step`` is for tests.
    """
    rt = D.setup(opts.device)
    try:
        inp = read_inputs(opts, quiet=not rt.is_main)
        opts = opts.with_preset(checkpoint_model_name(inp.checkpoint))  # the recipe of the XE model's architecture
        seed_everything(opts.seed)
        net = model_from_checkpoint(inp.checkpoint, where=str(inp.checkpoint_path))
        steps = run_steps(opts.fast, rt.device, net)  # --fast resolved once, with the model: the probe times it
        shape = probe_shape(net, inp.data, opts, steps, seq_per_img=opts.m)
        precision = D.on_main(lambda: resolve_precision(opts.precision, rt.device, shape))  # one for every process
        identity, config = run_settings(
            "finetune", opts, precision,
            identity={"lam": opts.reward_setting("lam"), "train_reward": TRAIN_REWARD,
                      "model_sha256": inp.model.manifest_sha256, "data_sha256": inp.data_artifact.manifest_sha256},
            recorded={"model": ref_name(inp.model), "data": ref_name(inp.data_artifact), "val_samples": VAL_SAMPLES},
            fast=steps.fast)
        out_dir, config, steps = claim_run(opts, identity, config, steps, net, group="finetune",
                                           name=run_name(opts.reward, opts.m, opts.baseline, opts.lam),
                                           reads=[inp.model.path, inp.data_artifact.path])
        bridge = bridge_for(net, inp.data.words, inp.data.seq_length)
        step = RewardStep(data=inp.data, cider=inp.cider, reward=opts.reward, m=opts.m, baseline=opts.baseline,
                          lam=opts.lam, max_len=bridge.max_len, seed=opts.seed, rank=rt.rank,
                          sample_mode=opts.sample_mode, steps=steps,
                          bridge=None if isinstance(bridge, WordBridge) else bridge)
        return TrainingRecipe(stage="finetune", model=net, data=inp.data, out_dir=out_dir, opts=opts, step_fn=step,
                              inputs=[inp.data_artifact, inp.model], manifest_config=config,
                              epoch_metrics_fn=step.val_metrics, summary=headline(opts, inp), after_step=after_step,
                              cider=inp.cider, loggers=[TensorBoardLogger(out_dir / TENSORBOARD)],
                              steps=steps).run()
    finally:
        D.teardown()
