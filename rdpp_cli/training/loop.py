"""The training engine shared by ``rdpp train-xe`` and ``rdpp finetune``: a recipe.

A stage builds its model, claims its output folder (``claim_output``) and runs a ``TrainingRecipe``
with its options (``rdpp_cli.training.options.TrainLoopOptions`` or a subclass) and a *step
function* that turns one batch into a loss::

    def step_fn(model, batch: Batch) -> Tensor | tuple[Tensor, dict[str, float]]:
        # model: the network in train mode, DistributedDataParallel-wrapped under torchrun. Call it
        #   (``model(att, seqs)``, or ``call(model, "token_logprobs", att, seqs)`` for another
        #   method) for everything that needs gradients; use ``unwrap(model)`` for no-grad work
        #   such as sampling captions with rdpp_cli.decoding.decode.
        # batch: rdpp_cli.data.loader.Batch on the training device (index, fc, att, att_mask,
        #   labels (B, seq_per_img, L), epoch, batch).
        # returns the scalar loss to minimise (a mean over this process's batch) and optionally
        #   numbers to log; "loss" is shown in the progress bar, every key is averaged per epoch
        #   (weighted by images) into metrics.csv.

    artifact = TrainingRecipe(stage="xe", model=model, data=data, out_dir=out_dir, opts=opts,
                              step_fn=step_fn, inputs=[data.artifact], manifest_config=config).run()

``run`` is ``setup`` (device, loader, optimizer, LR schedule, precision, seeds), ``resume``, then
``train_epoch`` (``train_step`` for every batch) and ``end_epoch`` (``validate``, ``best.pt``,
``save``) for every epoch, and ``finish``; identically for every stage:

- epochs of seeded, resumable batches (``data.loader.CaptionBatches``), Adam, gradient clipping
  (by value, self-critical.pytorch's default, or by norm), step LR decay every k epochs;
- a progress bar with the loss and images/s; validation after every epoch: greedy decoding of the
  val split (or its first ``val_images``) scored with CIDEr-D under the data artifact's training
  df, plus whatever ``epoch_metrics_fn(model, batch) -> {name: per-image values}`` adds;
- ``checkpoints/best.pt`` (best val CIDEr-D), ``checkpoints/last.pt`` and the resume state
  ``checkpoints/last_state.pt`` after every epoch and every ``save_every_steps`` steps;
  ``metrics.csv`` (one row per epoch: epoch, step, loss and other logs, val_cider, lr, time,
  images_per_s);
- exact resume: when ``out_dir`` holds a resume state (an interrupted run, see
  ``prepare_output``), training continues from it, restoring weights, optimizer, scheduler,
  loader position, running epoch sums and every process's RNG states, so a resumed CPU run ends
  with the weights an uninterrupted one would have;
- the model's forward (and validation decoding) under the options' ``precision``
  (``rdpp_cli.precision``: bf16/fp16 autocast, weights, optimizer state and checkpoints in float32,
  a gradient scaler for fp16 whose state is in the resume state);
- DDP under torchrun: each process trains on its share of every batch; validation images are
  shared out and the scores summed; rank 0 alone writes files and prints;
- divergence stops the run with one line (``Diverged``): the loss is checked every step (the
  value the progress bar shows anyway; under DDP one tiny all-reduce so that every process stops
  at the same step) before it reaches the weights -- with the fast path when it is read back, every
  few steps (``flush``) -- and the parameters before every validation and checkpoint, so no NaN/Inf
  weights are ever written to last.pt, best.pt or the resume state;
- the output folder stays locked (``artifacts.lock``) for the whole run, released when the
  manifest is written or the run fails;
- finally the manifest (kind ``rdpp.model``; config with ``stage``, ``architecture`` (the model's
  registry name), ``precision`` and ``model_config``; the inputs; summary ``architecture``,
  ``val_cider``, ``epochs``) and a summary table.

Extension points:

- ``loggers``: more ``Logger`` objects beside ``MetricsCsv`` (metrics.csv), called on rank 0 with
  every step's numbers and every epoch's row, and adding rows to the closing table (e.g.
  ``rdpp_cli.training.tensorboard.TensorBoardLogger``, which both stages pass);
- ``compute_loss(batch)``: the one model call of a step (the step function under the run's
  precision); the run's steps (``rdpp_cli.training.fast``, ``steps=``) keep it, with a compiled step
  function from the stage, fused Adam and the step's numbers left on the device until ``flush``;
- ``position``: where the run is (``Position``: epoch, batch, step), current after every step;
  ``current_position()`` gives the position of the run in progress, for an interrupt handler.

The model follows the ``CaptionModel`` interface (``rdpp_cli.models.base``) and is built
identically on every process (seed before building it). Call ``claim_run`` (``claim_output`` of
``training.distributed``, after ``resume_as_recorded``) instead of ``prepare_output`` so that only
rank 0 claims the folder, and a rerun resumes in what the run recorded for its ``auto`` settings.
Beside the recipe: ``training.validation`` (the val images and their greedy CIDEr-D),
``training.loggers`` (metrics.csv, the fast path's pending numbers), ``training.distributed``
(DDP: ``call``, ``unwrap``, ``claim_output``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from rdpp_cli.artifacts import (Artifact, read_artifact, released_on_error,
                                write_manifest)
from rdpp_cli.artifacts import finish as finish_output
from rdpp_cli.artifacts.workspace import same_identity, unfinished_run
from rdpp_cli.console import console, info, note, progress, summary_table
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import Batch, CaptionBatches
from rdpp_cli.errors import RdppError
from rdpp_cli.models.bridge import bridge_for
from rdpp_cli.models.checkpoint import non_finite_tensor, save_checkpoint
from rdpp_cli.models.registry import model_name
from rdpp_cli.precision import autocast, grad_scaler, tf32_matmuls
from rdpp_cli.precision_probe import resolve_precision
from rdpp_cli.training import distributed as D
from rdpp_cli.training.fast import EAGER, CompileFailed, Steps, run_steps
from rdpp_cli.training.loggers import Logger, MetricsCsv
from rdpp_cli.training.options import TrainLoopOptions
from rdpp_cli.training.distributed import claim_output
from rdpp_cli.training.state import STATE_FILE, load_state, rng_state, save_state, seed_everything, set_rng_state
from rdpp_cli.training.validation import greedy_cider, merge_sums, validation_images


StepFn = Callable[[nn.Module, Batch], "Tensor | tuple[Tensor, dict[str, float]]"]
EpochMetricsFn = Callable[[nn.Module, Batch], dict[str, Any]]

CHECKPOINTS = "checkpoints"
METRICS = "metrics.csv"


def _clip(model: nn.Module, opts: TrainLoopOptions) -> None:
    if opts.grad_clip <= 0:
        return
    params = [p for p in model.parameters() if p.grad is not None]
    if opts.grad_clip_mode == "value":
        torch.nn.utils.clip_grad_value_(params, opts.grad_clip)
    else:
        torch.nn.utils.clip_grad_norm_(params, opts.grad_clip)


def _split_step(out, on_device: bool = False) -> tuple[Tensor, dict[str, Any]]:
    """The loss and the numbers to log of a step function's result: floats, or with ``on_device``
    the tensors as they are (detached; read later by ``PendingLogs``)."""
    loss, logs = (out, {}) if isinstance(out, Tensor) else out
    logs = dict(logs)
    logs.setdefault("loss", loss)
    if on_device:
        return loss, {k: v.detach() if isinstance(v, Tensor) else float(v) for k, v in logs.items()}
    return loss, {k: float(v.detach()) if isinstance(v, Tensor) else float(v) for k, v in logs.items()}


class Diverged(RdppError):
    """Training produced a non-finite loss or non-finite weights; nothing non-finite was saved."""


def _diverged(what: str, epoch: int, step: int, last_loss: float | None, opts: TrainLoopOptions) -> Diverged:
    last = f"last finite loss {last_loss:.4g}" if last_loss is not None else "no finite loss yet"
    clip = (f"clip gradients harder (--grad-clip, now {opts.grad_clip:g} by {opts.grad_clip_mode})" if opts.grad_clip > 0
            else "clip gradients (--grad-clip 0.1)")
    return Diverged(f"training diverged at epoch {epoch}, step {step}: {what} ({last}); no checkpoint holds these "
                    f"weights; lower --lr (now {opts.lr:g}) or {clip} and rerun")


def _non_finite_parameter(model: nn.Module) -> str | None:
    """The name of the first parameter or buffer holding NaN or infinity (one sync per call)."""
    return non_finite_tensor(dict(list(model.named_parameters()) + list(model.named_buffers())))


def run_settings(stage: str, opts: TrainLoopOptions, precision: str, *, identity: dict[str, Any],
                 recorded: dict[str, Any], fast: str = "off") -> tuple[dict[str, Any], dict[str, Any]]:
    """A training run's identity (what decides its result, so a rerun with it resumes the unfinished
    run: the options' ``identity``, ``precision`` resolved, and the stage's ``identity`` such as its
    inputs' manifest hashes) and the manifest's config (that, the options' ``recorded`` settings,
    what ``--precision`` asked, ``--fast`` as resolved (``fast``: the run's ``Steps.fast``) and asked, the number of processes, the
    stage's ``recorded`` values and the recipe used (``recipe``: its model, stage, preset and the values it
    supplied); without the options that could not act (``opts.unused()``))."""
    ident = {"stage": stage, **opts.identity(), "precision": precision, **identity}
    config = {**ident, **opts.recorded(), "precision": precision, "precision_option": opts.precision,
              "fast": fast, "fast_option": opts.fast,
              "processes": D.runtime().world_size, "workers": opts.loader_workers(D.runtime().device.type),
              **recorded}
    config = {k: v for k, v in config.items() if k not in opts.unused()}  # a manifest records what ran
    if opts.recipe_record() is not None:
        config["recipe"] = opts.recipe_record()
    return ident, config


# the settings `auto` resolves that decide what a run computes: a rerun resumes the unfinished run in what it
# recorded for them, whatever `auto` resolves to now (the precision cache deleted, another thread count)
AUTO_KEPT = {"precision": ("fp32", "bf16"), "fast": ("on", "off")}


def resume_as_recorded(opts: TrainLoopOptions, identity: dict[str, Any], config: dict[str, Any], *,
                       out: Path | str | None, group: str, name: str, kind: str = "rdpp.model"
                       ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """``identity`` and ``config`` with the values the unfinished run a rerun finds (``unfinished_run``)
    recorded for the ``AUTO_KEPT`` settings left to ``auto``, when that run is this one but for them;
    the settings so kept (a note says which). Unchanged otherwise, and with ``--no-resume``."""
    found = unfinished_run(out, workspace=opts.workspace, group=group, name=name, kind=kind) if opts.resume else None
    if found is None:
        return identity, config, {}
    path, saved = found
    recorded = {**(saved.get("settings") or {}), "precision": saved["config"].get("precision")}
    kept = {k: recorded[k] for k, choices in AUTO_KEPT.items()
            if getattr(opts, k) == "auto" and recorded.get(k) in choices and recorded[k] != config.get(k)}
    ident = {**identity, **({"precision": kept["precision"]} if "precision" in kept else {})}
    if not kept or not same_identity(saved["config"], ident):
        return identity, config, {}
    note(f"resuming unfinished {path} as it was recorded: "
         + ", ".join(f"{k} {v} (--{k} auto now gives {config.get(k)})" for k, v in kept.items()))
    return ident, {**config, **kept}, kept


def claim_run(opts: TrainLoopOptions, identity: dict[str, Any], config: dict[str, Any], steps: Steps,
              model: nn.Module, *, group: str, name: str, reads: list) -> tuple[Path, dict[str, Any], Steps]:
    """``claim_output`` for a training run (rank 0), after ``resume_as_recorded``; a new folder's marker
    keeps the fast path it resolved. Returns the folder, the manifest config and the run's steps:
    ``steps``, or those of the fast path the resumed run recorded (``run_steps`` for ``model``; a
    compile failure then follows what ``--fast`` asks now)."""
    identity, config, kept = D.on_main(
        lambda: resume_as_recorded(opts, identity, config, out=opts.out, group=group, name=name))
    out_dir = claim_output(opts.out, workspace=opts.workspace, group=group, name=name, kind="rdpp.model",
                           config=identity, force=opts.force, reads=reads, settings={"fast": config.get("fast")})
    if "fast" in kept:
        steps = run_steps(kept["fast"], D.runtime().device, model, asked=opts.fast)
    return out_dir, config, steps


def fast_history(before: list[str] | None, now: str) -> list[str]:
    """The fast path of each part of a resumed run: the parts its resume state lists (``before``;
    None for a state from before rdpp kept them), then this one's when it differs from the last."""
    parts = list(before or [now])
    return parts if parts[-1] == now else [*parts, now]


def fast_record(ran: list[str]) -> dict[str, Any]:
    """What the manifest records of the fast path when the parts of a resumed run differed in it:
    ``fast`` "mixed" and ``fast_ran``, the parts in order (``["on", "off"]``); nothing otherwise."""
    return {"fast": "mixed", "fast_ran": ran} if len(set(ran)) > 1 else {}


def noam_factor(d_model: int, warmup: int):
    """The Noam schedule's LR multiplier at 0-based optimizer step s: ``d_model^-0.5 x min((s+1)^-0.5,
    (s+1) x warmup^-1.5)`` (Vaswani et al. 2017; self-critical.pytorch's ``NoamOpt``, whose step
    counter starts at 1)."""
    w = max(int(warmup), 1)
    return lambda s: d_model ** -0.5 * min((s + 1) ** -0.5, (s + 1) * w ** -1.5)


def check_lr_schedule(opts: TrainLoopOptions, model: nn.Module) -> None:
    """RdppError when ``opts.lr_schedule`` cannot drive ``model`` (noam needs its ``config.d_model``): a
    stage calls it before it claims its output folder."""
    if opts.lr_schedule == "noam" and getattr(model.config, "d_model", None) is None:
        raise RdppError(f"--lr-schedule noam scales by the model's d_model, which {type(model).__name__} does "
                        "not have; use --lr-schedule step")


# --lr-schedule plateau: self-critical.pytorch's --reduce_on_plateau with its option defaults (factor 0.5,
# patience 3), on the validation CIDEr-D (the peer steps it on -CIDEr in "min" mode: the same)
PLATEAU = {"mode": "max", "factor": 0.5, "patience": 3}


def lr_schedule(optimizer: torch.optim.Optimizer, opts: TrainLoopOptions, model: nn.Module):
    """The LR schedule of ``opts.lr_schedule``: "step" (x ``lr_decay_rate`` every ``lr_decay_every``
    epochs; None when that is 0), stepped once per epoch, "plateau" (``PLATEAU``), stepped once per
    epoch with its validation CIDEr-D, or "noam" (``noam_factor`` of the model's ``config.d_model``),
    stepped after every optimizer step."""
    check_lr_schedule(opts, model)
    if opts.lr_schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **PLATEAU)
    if opts.lr_schedule == "noam":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, noam_factor(model.config.d_model, opts.warmup))
    if opts.lr_decay_every > 0:
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=opts.lr_decay_every, gamma=opts.lr_decay_rate)
    return None


@dataclass
class Position:
    """Where a run is: ``epoch`` epochs done (so the 0-based index of the one running), ``batch``
    batches of it done, ``step`` optimizer steps done. The resume state stores it."""

    epoch: int = 0
    batch: int = 0
    step: int = 0

    def __str__(self) -> str:
        return f"epoch {self.epoch + 1}, step {self.step}"


_RUNNING: list["TrainingRecipe"] = []


def current_position() -> Position | None:
    """The position of the training run in progress in this process; None when none is."""
    return _RUNNING[-1].position if _RUNNING else None


class TrainingRecipe:
    """One training run of ``model`` on ``data``'s train split into ``out_dir`` (claimed by
    ``claim_output``); ``run()`` returns the finished model artifact (on every rank).

    ``manifest_config``: the stage's resolved settings (``run_settings``; recorded with ``stage``,
    ``precision`` and ``model_config``). ``summary``: extra headline numbers for the manifest and the
    final table. ``after_step(step)``: called after every optimizer step (and its checkpoint, when
    one is due); tests raise from it to simulate a crash. ``cider``: the validation scorer
    (``TrainCider`` of ``data``), when the stage has already loaded it. ``loggers``: more
    ``Logger`` objects beside metrics.csv. ``steps``: the run's steps (``rdpp_cli.training.fast``,
    eager or the fast path, chosen once; the stage builds its step function on them): Adam as they
    say, and the step's numbers read as they say (``flush``).
    """

    def __init__(self, *, stage: str, model: nn.Module, data: DataArtifact, out_dir: Path, opts: TrainLoopOptions,
                 step_fn: StepFn, inputs: list[Artifact], manifest_config: dict,
                 epoch_metrics_fn: EpochMetricsFn | None = None, summary: dict[str, Any] | None = None,
                 after_step: Callable[[int], None] | None = None, cider=None, loggers: list[Logger] = (),
                 steps: Steps = EAGER):
        self.stage, self.model, self.data, self.opts, self.step_fn = stage, model, data, opts, step_fn
        self.out_dir = Path(out_dir)
        self.ckpt_dir = self.out_dir / CHECKPOINTS
        self.state_path = self.ckpt_dir / STATE_FILE
        self.inputs, self.manifest_config, self.summary = inputs, manifest_config, dict(summary or {})
        self.epoch_metrics_fn, self.after_step, self.cider = epoch_metrics_fn, after_step, cider
        self.steps = steps
        self.fast_ran = [steps.fast]  # the fast path of each part of the run, in order
        self.pending = self.steps.pending_logs()
        self.shown: dict[str, float] = {}  # the numbers of the last step read (the progress bar's)
        self.loggers = [MetricsCsv(self.out_dir / METRICS), *loggers]
        self.position = Position()
        self.history: list[dict[str, Any]] = []
        self.sums: dict[str, float] = {}  # this process's running sums of the current epoch's logs
        self.best, self.best_epoch, self.last_val, self.last_loss = -math.inf, 0, None, None
        self.elapsed0 = 0.0  # training seconds before this process took over (a resumed run)

    def run(self) -> Artifact:
        with released_on_error(self.out_dir), self._in_progress():
            self.setup()
            self.resume()
            try:
                with self.bar:
                    while self.position.epoch < self.opts.epochs:
                        self.train_epoch()
                        self.end_epoch()
            finally:
                for lg in self.loggers:
                    lg.close()
            return self.finish()

    @contextlib.contextmanager
    def _in_progress(self) -> Iterator[None]:
        _RUNNING.append(self)
        try:
            yield
        finally:
            _RUNNING.remove(self)

    # -- setup and resume --------------------------------------------------------------------------

    def setup(self) -> None:
        """Device, loader, validation images and scorer, Adam, the LR schedule, precision, seeds."""
        o = self.opts
        self.rt = rt = D.setup(o.device)
        self.model.to(rt.device)
        self.bridge = bridge_for(self.model, self.data.words, self.data.seq_length)
        self.loader = CaptionBatches(self.data, "train", batch_size=o.batch_size, seq_per_img=o.seq_per_img,
                                     seed=o.seed, rank=rt.rank, world_size=rt.world_size,
                                     num_workers=o.loader_workers(rt.device.type),
                                     pin_memory=rt.device.type == "cuda", resident=o.resident, device=rt.device)
        self.val_all = validation_images(self.data, o.val_images)
        self.val_share = np.array_split(self.val_all, rt.world_size)[rt.rank]
        if len(self.val_all) and self.cider is None:
            from rdpp_cli.metrics.train_cider import TrainCider

            self.cider = TrainCider.for_data(self.data)
        adam = {"betas": (0.9, o.adam_beta2), "eps": o.adam_eps}
        self.optimizer = self.steps.optimizer(self.model.parameters(), o.lr, **adam)
        # the precision the stage resolved into the run's identity (run_settings): `auto` on a CPU is a
        # measurement, and measuring it again here could train in another precision than recorded
        self.precision = self.manifest_config.get("precision") or resolve_precision(o.precision, rt.device)
        self.scaler = grad_scaler(self.precision, rt.device)  # fp16 only
        self.scheduler, self.per_step = lr_schedule(self.optimizer, o, self.model), o.lr_schedule == "noam"
        self.lr_now = self.epoch_lr = None  # the LR the running epoch's row reports; a resumed one's (resume)
        # Training randomness (dropout, sampling) per process; the stage seeded the model's init.
        seed_everything(o.seed + rt.rank)
        if not rt.is_main:
            self.loggers = []
        self.bar = progress("images")
        self.bar.disable = self.bar.disable or not rt.is_main

    def resume(self) -> None:
        """Continue from ``out_dir``'s resume state when there is one (unless ``--no-resume``); then
        wrap the model for DDP and start the clock."""
        rt = self.rt
        if self.state_path.exists() and self.opts.resume:
            self.load_state_dict(load_state(self.state_path))
            if rt.is_main:
                info(f"resuming {self.out_dir} at epoch {self.position.epoch + 1}, batch {self.position.batch} "
                     f"(step {self.position.step})")
        elif self.state_path.exists() and rt.is_main:
            note(f"--no-resume: starting {self.out_dir} over; its earlier state will be overwritten")
        for lg in self.loggers:
            lg.start(self.history)
        self.net = self.model
        if rt.distributed:
            self.net = nn.parallel.DistributedDataParallel(
                D.DDPMethods(self.model), device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
        self.t0 = time.perf_counter()
        if rt.is_main:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)

    def state_dict(self) -> dict[str, Any]:
        """This process's resume state, but the RNG states (``save`` gathers every process's)."""
        return {
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "epoch": self.position.epoch, "batch": self.position.batch, "step": self.position.step,
            "elapsed": self.elapsed(), "history": self.history, "sums": self.sums, "best": self.best,
            "best_epoch": self.best_epoch, "last_val": self.last_val, "world_size": self.rt.world_size,
            "stage": self.stage, "epoch_lr": self.lr_now, "fast_ran": self.fast_ran,
        }

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.model.load_state_dict(st["model"])
        self.optimizer.load_state_dict(st["optimizer"])
        if self.scheduler is not None and st.get("scheduler") is not None:
            self.scheduler.load_state_dict(st["scheduler"])
        if self.scaler is not None and st.get("scaler") is not None:
            self.scaler.load_state_dict(st["scaler"])
        self.position = Position(int(st["epoch"]), int(st["batch"]), int(st["step"]))
        self.epoch_lr = st.get("epoch_lr") if self.position.batch else None  # mid-epoch: the LR its row reports
        self.elapsed0 = float(st["elapsed"])
        self.history, self.sums = list(st["history"]), dict(st["sums"])
        self.fast_ran = fast_history(st.get("fast_ran"), self.fast_ran[-1])
        self.best, self.best_epoch, self.last_val = float(st["best"]), int(st["best_epoch"]), st["last_val"]
        if len(st["rng"]) == self.rt.world_size:
            set_rng_state(st["rng"][self.rt.rank])
        elif self.rt.is_main:
            note(f"resume state is from {len(st['rng'])} process(es), this run has {self.rt.world_size}: "
                 "RNG streams restart (the result will not equal an uninterrupted run)")

    def elapsed(self) -> float:
        """Training seconds so far, those of the interrupted runs it continues included."""
        return self.elapsed0 + time.perf_counter() - self.t0

    # -- training ----------------------------------------------------------------------------------

    def train_epoch(self) -> None:
        """The batches of epoch ``position.epoch`` from ``position.batch`` on, with the mid-epoch
        checkpoints ``save_every_steps`` asks for."""
        o, pos = self.opts, self.position
        # the LR the epoch's row reports: at its first step (a run resumed mid-epoch restores it; with the
        # Noam schedule the LR has moved since)
        self.lr_now = self.epoch_lr if self.epoch_lr is not None else self.optimizer.param_groups[0]["lr"]
        self.epoch_lr = None
        done = min(pos.batch * o.batch_size, self.loader.images_per_epoch)
        self.task = self.bar.add_task(f"{self.stage} epoch {pos.epoch + 1}/{o.epochs}",
                                      total=self.loader.images_per_epoch, completed=done, info="")
        t_epoch, self.images_run = time.perf_counter(), 0
        for batch in self.loader.epoch(pos.epoch, pos.batch):
            logs = self.train_step(batch)
            self.images_run += batch.global_images
            self.bar.update(self.task, advance=batch.global_images,
                            info=f"loss {logs['loss']:.3f}" if "loss" in logs else "")
            if o.save_every_steps and pos.step % o.save_every_steps == 0 and pos.batch < len(self.loader):
                self.save()
            if self.after_step is not None:
                self.after_step(pos.step)
        self.epoch_seconds = time.perf_counter() - t_epoch

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns the step function's numbers (with the fast path
        those of the last step read back, see ``flush``). Where the fast path fails to compile under
        ``--fast auto`` (``CompileFailed``: it runs uncompiled from then on), the step is taken again
        from the random state it began with: no step lost or taken twice."""
        self.net.train()
        batch = batch.to(self.rt.device)
        batch = dataclasses.replace(batch, labels=self.bridge.model_labels(batch.labels))  # in the model's ids
        began = rng_state()
        try:
            logs = self.take_step(batch)
        except CompileFailed:
            self.optimizer.zero_grad(set_to_none=True)
            set_rng_state(began)
            logs = self.take_step(batch)
        self.position.step += 1
        self.position.batch = batch.batch + 1
        if self.pending is None:
            self.record(self.position.step, batch.size, logs)
            return logs
        if self.pending.add(self.position.step, batch.size, logs):
            self.flush()
        return self.shown

    def take_step(self, batch: Batch) -> dict[str, Any]:
        """The step's loss (checked here unless its numbers wait on the device), backward, Adam; its
        numbers."""
        loss, logs = self.compute_loss(batch)
        if self.pending is None:
            self.check_loss(logs["loss"], self.position.step + 1, batch)
        self.apply_gradients(loss * batch.weight if batch.weight != 1.0 else loss)
        return logs

    def record(self, step: int, images: int, logs: dict[str, float]) -> None:
        """Account for one step's numbers: the epoch's sums, the loggers."""
        self.last_loss = logs["loss"]
        for k, v in logs.items():
            self.sums[k] = self.sums.get(k, 0.0) + v * images
        self.sums["_images"] = self.sums.get("_images", 0.0) + images
        for lg in self.loggers:
            lg.log_step(step, logs)
        self.shown = logs

    def flush(self) -> None:
        """Read the steps' numbers the fast path left on the device (one transfer), check each loss
        in order (``Diverged`` names the first non-finite one's step) and ``record`` them."""
        if self.pending is None:
            return
        for step, images, logs in self.pending.read():
            self.check_loss(logs["loss"], step)
            self.record(step, images, logs)

    def compute_loss(self, batch: Batch) -> tuple[Tensor, dict[str, Any]]:
        """The model call of a step: the step function under the run's precision (its backward
        follows the forward's precisions). Its numbers as floats, or with the fast path as they are
        on the device."""
        self.steps.begin_step()
        with autocast(self.precision, self.rt.device):
            return _split_step(self.step_fn(self.net, batch), on_device=self.pending is not None)

    def check_loss(self, loss: float, step: int, batch: Batch | None = None) -> None:
        """Stop at a non-finite loss of step ``step`` (under DDP every process stops): before it
        reaches the weights, or with the fast path when it is read back (the weights are checked
        again before anything is saved). When ``batch``'s features are not finite, that is a corrupt
        input (``check_finite``), not divergence."""
        bad = not math.isfinite(loss)  # read for the progress bar anyway: no extra sync
        if self.rt.distributed:
            bad = D.any_true(bad)
        if bad:
            if batch is not None:
                self.data.check_finite(batch.index, batch.fc, batch.att)
            raise _diverged(f"the loss is {loss}", self.position.epoch + 1, step, self.last_loss, self.opts)

    def apply_gradients(self, loss: Tensor) -> None:
        """Backward, clipping and the Adam step (fp16: scaled loss, clipping on the true gradients,
        steps with inf/nan skipped)."""
        if self.scaler is None:
            with tf32_matmuls(self.precision):  # backward in the forward's matrix arithmetic
                loss.backward()
            _clip(self.model, self.opts)
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            _clip(self.model, self.opts)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.per_step:
            self.scheduler.step()

    def check_weights(self, epoch: int) -> None:
        """Stop before non-finite weights are validated or saved (the same on every process: DDP
        keeps the replicas equal). ``epoch``: counted from 1, for the message."""
        name = _non_finite_parameter(self.model)
        if name is not None:
            raise _diverged(f"parameter {name} holds NaN or infinity although the loss was finite", epoch,
                            self.position.step, self.last_loss, self.opts)

    # -- the end of an epoch -----------------------------------------------------------------------

    def end_epoch(self) -> None:
        """The epoch's row (mean logs over every process's images, validation, lr, time), best.pt,
        last.pt and the resume state at the start of the next epoch, and the loggers."""
        pos = self.position
        self.flush()
        total = merge_sums(D.all_gather_object(self.sums))
        n_img = total.pop("_images", 0.0) or 1.0
        row: dict[str, Any] = {"epoch": pos.epoch + 1, "step": pos.step}
        row.update({k: v / n_img for k, v in total.items()})
        self.check_weights(pos.epoch + 1)  # before validating or saving them
        if len(self.val_all):
            row.update(self.validate())
            self.last_val = row["val_cider"]
        if self.scheduler is not None and not self.per_step:
            plateau = isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            self.scheduler.step(*([row["val_cider"]] if plateau else []))
        row.update({"lr": self.lr_now, "time": round(self.elapsed(), 3),
                    "images_per_s": round(self.images_run / self.epoch_seconds, 3) if self.epoch_seconds > 0 else None})
        self.history.append(row)
        self.keep_best()
        self.bar.update(self.task, info=f"loss {row.get('loss', float('nan')):.3f}"
                        + (f"  val CIDEr-D {self.last_val:.3f}" if self.last_val is not None else ""))
        self.sums = {}
        pos.epoch, pos.batch = pos.epoch + 1, 0
        self.save()
        for lg in self.loggers:
            lg.log_epoch(row, self.history)

    def validate(self) -> dict[str, float]:
        """Greedy val CIDEr-D (and ``epoch_metrics_fn``'s columns), means over every process's share."""
        self.bar.update(self.task, info="validating")
        with autocast(self.precision, self.rt.device):  # decoding in the run's precision, scoring in numpy
            try:
                sums = self.validation_sums()
            except CompileFailed:  # the fast path went eager (a note said why): validate again
                sums = self.validation_sums()
        val = merge_sums(D.all_gather_object(sums))
        n_val = val.pop("_n")
        return {k: v / n_val for k, v in val.items()}

    def validation_sums(self) -> dict[str, float]:
        return greedy_cider(self.model, self.data, self.val_share, batch_size=self.opts.val_batch_size,
                            device=self.rt.device, cider=self.cider, epoch_metrics_fn=self.epoch_metrics_fn,
                            steps=self.steps)

    def keep_best(self) -> None:
        """best.pt when the epoch's val CIDEr-D is the best so far (every epoch without validation)."""
        epoch = self.position.epoch + 1
        if (self.last_val is not None and self.last_val > self.best) or not len(self.val_all):
            self.best, self.best_epoch = (self.last_val if self.last_val is not None else self.best), epoch
            if self.rt.is_main:
                save_checkpoint(self.ckpt_dir / "best.pt", self.model, list(self.data.words), epoch=epoch,
                                step=self.position.step, stage=self.stage, val_cider=self.last_val)

    def save(self) -> None:
        """last.pt and the resume state at ``position`` (a collective: every process's RNG states)."""
        pos = self.position
        self.flush()
        self.check_weights(pos.epoch + (pos.batch > 0))
        rngs = D.all_gather_object(rng_state())
        if not self.rt.is_main:
            return
        for lg in self.loggers:
            lg.before_save(pos.step)
        save_state(self.state_path, {**self.state_dict(), "rng": rngs})
        save_checkpoint(self.ckpt_dir / "last.pt", self.model, list(self.data.words), epoch=pos.epoch, step=pos.step,
                        stage=self.stage, val_cider=self.last_val)

    # -- the end -----------------------------------------------------------------------------------

    def finish(self) -> Artifact:
        """The manifest, the summary table; the artifact, read back on every process."""
        if self.rt.is_main:
            model = self.model
            model_config = dataclasses.asdict(model.config) if dataclasses.is_dataclass(getattr(model, "config", None)) else {}
            head: dict[str, Any] = {"architecture": model_name(model), "epochs": self.opts.epochs}
            if self.best > -math.inf:
                head["val_cider"] = self.best
            head.update(self.summary)
            head.update(self.steps.manifest_summary())
            write_manifest(self.out_dir, "rdpp.model", {**self.manifest_config, **fast_record(self.fast_ran),
                                                        **self.steps.manifest_config(), "stage": self.stage,
                                                        "architecture": model_name(model), "precision": self.precision,
                                                        "model_config": model_config},
                           inputs=self.inputs, summary=head)
            finish_output(self.out_dir)
            console.print(summary_table(f"rdpp {self.stage}: done", self.summary_rows()))
        D.barrier()
        return read_artifact(self.out_dir, "rdpp.model")

    def summary_rows(self) -> list[tuple[str, Any]]:
        last = self.history[-1] if self.history else {}
        rows: list[tuple[str, Any]] = [
            ("artifact", self.out_dir),
            ("trained on", f"{self.data.path}  ({len(self.loader.images)} train images, "
                           f"{self.opts.seq_per_img} captions each)"),
            ("epochs / steps", f"{self.opts.epochs} / {self.position.step}"),
            ("train loss (last epoch)", last.get("loss", "-")),
        ]
        if self.best > -math.inf:
            rows += [("val CIDEr-D (best)", f"{self.best:.4f} (epoch {self.best_epoch}, {len(self.val_all)} val "
                                            "images, greedy)"),
                     ("val CIDEr-D (last)", last.get("val_cider", "-"))]
        rows += list(self.summary.items())
        ips = [r["images_per_s"] for r in self.history if r.get("images_per_s")]
        rt = self.rt
        rows += [("time", f"{self.elapsed():.1f} s"),
                 ("speed", f"{np.mean(ips):.1f} images/s on {rt.device}"
                  + (f" × {rt.world_size} processes" if rt.distributed else "") if ips else "-"),
                 ("precision", self.precision),
                 ("fast path", self.steps.describe()),
                 ("checkpoints", f"{self.ckpt_dir}/best.pt, last.pt"),
                 ("metrics", self.out_dir / METRICS)]
        for lg in self.loggers:
            rows += lg.summary_rows()
        return rows
