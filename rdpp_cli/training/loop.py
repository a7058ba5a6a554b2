"""The training engine shared by ``rdpp train-xe`` and ``rdpp finetune``.

A stage builds its model, claims its output folder and hands the rest to ``run_training`` with a
*step function* that turns one batch into a loss::

    def step_fn(model, batch: Batch) -> Tensor | tuple[Tensor, dict[str, float]]:
        # model: the network in train mode, DistributedDataParallel-wrapped under torchrun. Call it
        #   (``model(fc, att, seqs)``, or ``call(model, "token_logprobs", fc, att, seqs)`` for another
        #   method) for everything that needs gradients; use ``unwrap(model)`` for no-grad work
        #   such as sampling captions with rdpp_cli.decoding.decode.
        # batch: rdpp_cli.data.loader.Batch on the training device (index, fc, att, att_mask,
        #   labels (B, seq_per_img, L), epoch, batch).
        # returns the scalar loss to minimise (a mean over this process's batch) and optionally
        #   numbers to log; "loss" is shown in the progress bar, every key is averaged per epoch
        #   (weighted by images) into metrics.csv.

    artifact = run_training(stage="xe", model=model, data=data, out_dir=out_dir, cfg=TrainConfig(...),
                            step_fn=step_fn, inputs=[data.artifact], manifest_config=config)

``run_training`` does the rest, identically for every stage:

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
- the model's forward (and validation decoding) under ``cfg.precision`` (``rdpp_cli.precision``:
  bf16/fp16 autocast, weights, optimizer state and checkpoints in float32, a gradient scaler for
  fp16 whose state is in the resume state);
- DDP under torchrun: each process trains on its share of every batch; validation images are
  shared out and the scores summed; rank 0 alone writes files and prints;
- divergence stops the run with one line (``Diverged``): the loss is checked every step (the
  value the progress bar shows anyway; under DDP one tiny all-reduce so that every process stops
  at the same step) before it reaches the weights, and the parameters before every validation and
  checkpoint, so no NaN/Inf weights are ever written to last.pt, best.pt or the resume state;
- the output folder stays locked (``artifacts.lock``) for the whole run, released when the
  manifest is written or the run fails;
- finally the manifest (kind ``rdpp.model``; config with ``stage`` and ``model_config``; the
  inputs; summary ``val_cider``, ``epochs``) and a summary table.

The model must follow Att2in's interface (``config`` dataclass, ``forward`` for teacher forcing, the
decoding methods ``rdpp_cli.decoding.decode`` uses) and be built identically on every process
(seed before building it). Call ``claim_output`` instead of ``prepare_output`` so that only rank 0
claims the folder.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from rdpp_cli.artifacts import (Artifact, atomic_write_bytes, finish, prepare_output, read_artifact,
                                released_on_error, write_manifest)
from rdpp_cli.console import at, console, info, note, progress, summary_table
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import Batch, CaptionBatches
from rdpp_cli.errors import RdppError
from rdpp_cli.models.checkpoint import non_finite_tensor, save_checkpoint
from rdpp_cli.precision import DEFAULT_PRECISION, autocast, check_precision, grad_scaler, resolve_precision
from rdpp_cli.training import distributed as D
from rdpp_cli.training.state import STATE_FILE, load_state, rng_state, save_state, seed_everything, set_rng_state

StepFn = Callable[[nn.Module, Batch], "Tensor | tuple[Tensor, dict[str, float]]"]
EpochMetricsFn = Callable[[nn.Module, Batch], dict[str, Any]]

CHECKPOINTS = "checkpoints"
METRICS = "metrics.csv"


@dataclass
class TrainConfig:
    """Settings of the shared loop (a stage adds its own, e.g. the reward, in its manifest config)."""

    epochs: int = 30
    batch_size: int = 50  # images per optimizer step, all processes together
    seq_per_img: int = 5  # captions per image in a batch
    lr: float = 4e-4
    grad_clip: float = 0.1  # 0 = no clipping
    grad_clip_mode: str = "value"  # "value" (self-critical.pytorch's clamp) or "norm" (global L2 norm)
    lr_decay_every: int = 3  # epochs; 0 = constant LR
    lr_decay_rate: float = 0.8
    weight_decay: float = 0.0
    val_images: int | None = None  # None = the whole val split; 0 = no validation
    val_batch_size: int = 100
    save_every_steps: int = 0  # also save last.pt + resume state every K steps (0 = per epoch only)
    seed: int = 123
    device: str = "auto"
    num_workers: int = 0  # threads reading the next batches ahead (data.loader.read_ahead)
    resume: bool = True  # continue from out_dir's resume state when there is one
    precision: str = DEFAULT_PRECISION  # fp32 | bf16 | fp16 | auto: the model's arithmetic (rdpp_cli.precision)

    def check(self) -> None:
        """RdppError for settings that cannot work (before anything is written)."""
        from rdpp_cli import checks

        for name in ("epochs", "batch_size", "seq_per_img", "val_batch_size"):
            if getattr(self, name) < 1:
                raise RdppError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        checks.learning_rate(self.lr)
        checks.seed(self.seed)
        checks.finite("--grad-clip", self.grad_clip)
        if self.grad_clip < 0:
            raise RdppError(f"--grad-clip must be 0 (off) or positive (got {self.grad_clip})")
        if self.grad_clip_mode not in ("value", "norm"):
            raise RdppError(f"--grad-clip-mode must be 'value' or 'norm' (got {self.grad_clip_mode!r})")
        if self.lr_decay_every < 0 or not 0 < self.lr_decay_rate <= 1:
            raise RdppError("--lr-decay-every must be ≥ 0 and --lr-decay-rate in (0, 1] "
                            f"(got {self.lr_decay_every}, {self.lr_decay_rate})")
        if self.val_images is not None and self.val_images < 0:
            raise RdppError(f"--val-images must be ≥ 0 (got {self.val_images})")
        if self.save_every_steps < 0 or self.num_workers < 0:
            raise RdppError("--save-every-steps and --workers must be ≥ 0")
        check_precision(self.precision)


class _Methods(nn.Module):
    """What DDP wraps: its forward runs any method of the model. DDP synchronises gradients only
    of what runs through its forward, so ``call(net, "token_logprobs", ...)`` goes through here."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, method: str = "forward", **kwargs):
        return getattr(self.model, method)(*args, **kwargs)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside the DistributedDataParallel wrapper (or the model itself)."""
    inner = getattr(model, "module", model)
    return inner.model if isinstance(inner, _Methods) else inner


def call(net: nn.Module, method: str, *args, **kwargs):
    """``net.<method>(*args, **kwargs)`` for the model a step function gets, DDP-wrapped or not
    (e.g. ``call(net, "token_logprobs", fc, att, seqs)``); gradients are synchronised under DDP."""
    if isinstance(net, nn.parallel.DistributedDataParallel):
        return net(*args, method=method, **kwargs)
    return getattr(net, method)(*args, **kwargs)


def claim_output(out: Path | str | None, **kwargs) -> Path:
    """``artifacts.prepare_output`` on rank 0 only; every process gets the folder (or its error)."""
    return Path(D.on_main(lambda: str(prepare_output(out, **kwargs))))


def validation_images(data: DataArtifact, val_images: int | None) -> np.ndarray:
    """Rows of the images validated after each epoch: the val split, or its first ``val_images``."""
    if val_images == 0:
        return np.zeros(0, dtype=np.int64)
    if not (data.split == "val").any():
        raise RdppError(f"data artifact {data.path} has no val images to validate on; "
                        "pass --val-images 0 to train without validation")
    idx = data.split_indices("val")
    return idx if val_images is None else idx[:val_images]


def greedy_cider(model: nn.Module, data: DataArtifact, images: np.ndarray, *, batch_size: int = 100,
                 device: torch.device | str = "cpu", cider=None,
                 epoch_metrics_fn: EpochMetricsFn | None = None) -> dict[str, float]:
    """Sums over ``images`` of the greedy caption's CIDEr-D (the training reward's: training df, end
    token counted) and of any extra metric.

    Returns ``{"val_cider": sum, ..., "_n": number of images}`` (sums, so that processes can add
    theirs up). The model is put in eval mode and back.
    """
    from rdpp_cli.data.vocab import unk_id
    from rdpp_cli.decoding.decode import DecodeConfig, decode
    from rdpp_cli.metrics.train_cider import TrainCider

    cider = cider or TrainCider.for_data(data)
    m = unwrap(model)
    greedy = DecodeConfig(method="greedy", max_len=data.seq_length, unk_id=unk_id(data.words))  # no UNK, as `rdpp sample`
    was_training = m.training
    m.eval()
    sums: dict[str, float] = {"val_cider": 0.0, "_n": 0.0}
    try:
        if len(images):
            batches = CaptionBatches(data, images=images, batch_size=batch_size, shuffle=False, seq_per_img=0)
            for batch in batches.epoch(0):
                batch = batch.to(device)
                data.check_finite(batch.index, batch.fc, batch.att)  # no score from a corrupt input
                with torch.no_grad():
                    dec = decode(m, batch.fc, batch.att, greedy, att_mask=batch.att_mask)
                    hyps = dec.tokens[:, 0].cpu().numpy()
                    sums["val_cider"] += float(np.sum(cider.score(hyps, data.references_ids(batch.index))))
                    if epoch_metrics_fn is not None:
                        for k, v in epoch_metrics_fn(m, batch).items():
                            v = v.detach().cpu().numpy() if isinstance(v, Tensor) else np.asarray(v)
                            sums[k] = sums.get(k, 0.0) + float(v.sum())
                sums["_n"] += batch.size
    finally:
        m.train(was_training)
    return sums


def _merge_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for p in parts:
        for k, v in p.items():
            total[k] = total.get(k, 0.0) + v
    return total


def _clip(model: nn.Module, cfg: TrainConfig) -> None:
    if cfg.grad_clip <= 0:
        return
    params = [p for p in model.parameters() if p.grad is not None]
    if cfg.grad_clip_mode == "value":
        torch.nn.utils.clip_grad_value_(params, cfg.grad_clip)
    else:
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)


def _split_step(out) -> tuple[Tensor, dict[str, float]]:
    if isinstance(out, Tensor):
        return out, {"loss": float(out.detach())}
    loss, logs = out
    logs = {k: float(v) for k, v in logs.items()}
    logs.setdefault("loss", float(loss.detach()))
    return loss, logs


class Diverged(RdppError):
    """Training produced a non-finite loss or non-finite weights; nothing non-finite was saved."""


def _diverged(what: str, epoch: int, step: int, last_loss: float | None, cfg: TrainConfig) -> Diverged:
    last = f"last finite loss {last_loss:.4g}" if last_loss is not None else "no finite loss yet"
    clip = (f"clip gradients harder (--grad-clip, now {cfg.grad_clip:g} by {cfg.grad_clip_mode})" if cfg.grad_clip > 0
            else "clip gradients (--grad-clip 0.1)")
    return Diverged(f"training diverged at epoch {epoch}, step {step}: {what} ({last}); no checkpoint holds these "
                    f"weights; lower --lr (now {cfg.lr:g}) or {clip} and rerun")


def _non_finite_parameter(model: nn.Module) -> str | None:
    """The name of the first parameter or buffer holding NaN or infinity (one sync per call)."""
    return non_finite_tensor(dict(list(model.named_parameters()) + list(model.named_buffers())))


def _releases_lock(fn):
    """Release the output folder's lock when the run fails (``finish`` releases it on success)."""

    @functools.wraps(fn)
    def wrapper(*args, out_dir, **kwargs):
        with released_on_error(out_dir):
            return fn(*args, out_dir=out_dir, **kwargs)

    return wrapper


def _write_metrics(path: Path, history: list[dict]) -> None:
    if history:
        atomic_write_bytes(path, pd.DataFrame(history).to_csv(index=False).encode())


@_releases_lock
def run_training(
    *,
    stage: str,
    model: nn.Module,
    data: DataArtifact,
    out_dir: Path,
    cfg: TrainConfig,
    step_fn: StepFn,
    inputs: list[Artifact],
    manifest_config: dict,
    epoch_metrics_fn: EpochMetricsFn | None = None,
    summary: dict[str, Any] | None = None,
    after_step: Callable[[int], None] | None = None,
    cider=None,
) -> Artifact:
    """Train ``model`` on ``data``'s train split into ``out_dir`` (claimed by ``claim_output``).

    ``manifest_config``: the stage's resolved options (recorded with ``stage`` and
    ``model_config``). ``summary``: extra headline numbers for the manifest and the final table.
    ``after_step(step)``: called after every optimizer step (and its checkpoint, when one is due);
    tests raise from it to simulate a crash. ``cider``: the validation scorer (``TrainCider`` of
    ``data``), when the stage has already loaded it. Returns the finished model artifact (on every rank).
    """
    cfg.check()
    rt = D.setup(cfg.device)
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / CHECKPOINTS
    state_path = ckpt_dir / STATE_FILE
    vocab = list(data.words)
    core = model
    core.to(rt.device)
    loader = CaptionBatches(data, "train", batch_size=cfg.batch_size, seq_per_img=cfg.seq_per_img, seed=cfg.seed,
                            rank=rt.rank, world_size=rt.world_size, num_workers=cfg.num_workers,
                            pin_memory=rt.device.type == "cuda")
    val_all = validation_images(data, cfg.val_images)
    val_share = np.array_split(val_all, rt.world_size)[rt.rank]
    if len(val_all) and cider is None:
        from rdpp_cli.metrics.train_cider import TrainCider

        cider = TrainCider.for_data(data)

    optimizer = torch.optim.Adam(core.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    precision = resolve_precision(cfg.precision, rt.device)
    scaler = grad_scaler(precision, rt.device)  # fp16 only
    scheduler = (torch.optim.lr_scheduler.StepLR(optimizer, step_size=cfg.lr_decay_every, gamma=cfg.lr_decay_rate)
                 if cfg.lr_decay_every > 0 else None)
    # Training randomness (dropout, sampling) per process; the caller seeded the model's init.
    seed_everything(cfg.seed + rt.rank)

    epoch0, batch0, step, elapsed0 = 0, 0, 0, 0.0
    history: list[dict] = []
    sums: dict[str, float] = {}
    best, best_epoch, last_val = -math.inf, 0, None
    if state_path.exists() and cfg.resume:
        st = load_state(state_path)
        core.load_state_dict(st["model"])
        optimizer.load_state_dict(st["optimizer"])
        if scheduler is not None and st.get("scheduler") is not None:
            scheduler.load_state_dict(st["scheduler"])
        if scaler is not None and st.get("scaler") is not None:
            scaler.load_state_dict(st["scaler"])
        epoch0, batch0, step = int(st["epoch"]), int(st["batch"]), int(st["step"])
        elapsed0 = float(st["elapsed"])
        history, sums = list(st["history"]), dict(st["sums"])
        best, best_epoch, last_val = float(st["best"]), int(st["best_epoch"]), st["last_val"]
        if len(st["rng"]) == rt.world_size:
            set_rng_state(st["rng"][rt.rank])
        elif rt.is_main:
            note(f"resume state is from {len(st['rng'])} process(es), this run has {rt.world_size}: "
                 "RNG streams restart (the result will not equal an uninterrupted run)")
        if rt.is_main:
            info(f"resuming {out_dir} at epoch {epoch0 + 1}, batch {batch0} (step {step})")
            _write_metrics(out_dir / METRICS, history)
    elif state_path.exists() and rt.is_main:
        note(f"--no-resume: starting {out_dir} over; its earlier state will be overwritten")

    if rt.distributed:
        net: nn.Module = nn.parallel.DistributedDataParallel(
            _Methods(core), device_ids=[rt.device.index] if rt.device.type == "cuda" else None)
    else:
        net = core
    t0 = time.perf_counter()

    def elapsed() -> float:
        return elapsed0 + time.perf_counter() - t0

    last_loss: float | None = None

    def check_weights(epoch: int) -> None:
        """Stop before non-finite weights are validated or saved (the same on every process: DDP
        keeps the replicas equal)."""
        name = _non_finite_parameter(core)
        if name is not None:
            raise _diverged(f"parameter {name} holds NaN or infinity although the loss was finite", epoch, step,
                            last_loss, cfg)

    def save_last(epoch: int, batch: int) -> None:
        check_weights(epoch + (batch > 0))
        rngs = D.all_gather_object(rng_state())  # every process's RNG streams (a collective)
        if not rt.is_main:
            return
        save_state(state_path, {
            "model": {k: v.detach().cpu() for k, v in core.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "epoch": epoch, "batch": batch, "step": step, "elapsed": elapsed(),
            "history": history, "sums": sums, "best": best, "best_epoch": best_epoch, "last_val": last_val,
            "rng": rngs, "world_size": rt.world_size, "stage": stage,
        })
        save_checkpoint(ckpt_dir / "last.pt", core, vocab, epoch=epoch, step=step, stage=stage,
                        val_cider=last_val)

    if rt.is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    bar = progress("images")
    bar.disable = bar.disable or not rt.is_main
    with bar:
        for epoch in range(epoch0, cfg.epochs):
            lr_now = optimizer.param_groups[0]["lr"]
            done = min(batch0 * cfg.batch_size, loader.images_per_epoch)
            task = bar.add_task(f"{stage} epoch {epoch + 1}/{cfg.epochs}", total=loader.images_per_epoch,
                                completed=done, info="")
            t_epoch, images_run = time.perf_counter(), 0
            for batch in loader.epoch(epoch, batch0):
                net.train()
                batch = batch.to(rt.device)
                with autocast(precision, rt.device):  # the forward; backward follows its precisions
                    loss, logs = _split_step(step_fn(net, batch))
                bad = not math.isfinite(logs["loss"])  # read for the progress bar anyway: no extra sync
                if rt.distributed:
                    bad = D.any_true(bad)
                if bad:
                    data.check_finite(batch.index, batch.fc, batch.att)  # a corrupt input is not divergence
                    raise _diverged(f"the loss is {logs['loss']}", epoch + 1, step + 1, last_loss, cfg)
                last_loss = logs["loss"]
                loss = loss * batch.weight if batch.weight != 1.0 else loss
                if scaler is None:
                    loss.backward()
                    _clip(core, cfg)
                    optimizer.step()
                else:  # fp16: scaled loss, clipping on the true gradients, steps with inf/nan skipped
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                    _clip(core, cfg)
                    scaler.step(optimizer)
                    scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step += 1
                at(f"epoch {epoch + 1}, step {step}")  # what an interrupted run reports (cli.common.stage)
                for k, v in logs.items():
                    sums[k] = sums.get(k, 0.0) + v * batch.size
                sums["_images"] = sums.get("_images", 0.0) + batch.size
                images_run += batch.global_images
                bar.update(task, advance=batch.global_images, info=f"loss {logs['loss']:.3f}")
                if cfg.save_every_steps and step % cfg.save_every_steps == 0 and batch.batch + 1 < len(loader):
                    save_last(epoch, batch.batch + 1)
                if after_step is not None:
                    after_step(step)
            epoch_seconds = time.perf_counter() - t_epoch
            total = _merge_sums(D.all_gather_object(sums))
            n_img = total.pop("_images", 0.0) or 1.0
            row: dict[str, Any] = {"epoch": epoch + 1, "step": step}
            row.update({k: v / n_img for k, v in total.items()})
            check_weights(epoch + 1)  # before validating or saving them
            if len(val_all):
                bar.update(task, info="validating")
                with autocast(precision, rt.device):  # decoding in the run's precision, scoring in numpy
                    sums_val = greedy_cider(core, data, val_share, batch_size=cfg.val_batch_size, device=rt.device,
                                            cider=cider, epoch_metrics_fn=epoch_metrics_fn)
                val = _merge_sums(D.all_gather_object(sums_val))
                n_val = val.pop("_n")
                row.update({k: v / n_val for k, v in val.items()})
                last_val = row["val_cider"]
            if scheduler is not None:
                scheduler.step()
            row.update({"lr": lr_now, "time": round(elapsed(), 3),
                        "images_per_s": round(images_run / epoch_seconds, 3) if epoch_seconds > 0 else None})
            history.append(row)
            improved = last_val is not None and last_val > best
            if improved or not len(val_all):
                best, best_epoch = (last_val if last_val is not None else best), epoch + 1
                if rt.is_main:
                    save_checkpoint(ckpt_dir / "best.pt", core, vocab, epoch=epoch + 1, step=step, stage=stage,
                                    val_cider=last_val)
            bar.update(task, info=f"loss {row.get('loss', float('nan')):.3f}"
                       + (f"  val CIDEr-D {last_val:.3f}" if last_val is not None else ""))
            sums, batch0 = {}, 0
            save_last(epoch + 1, 0)
            if rt.is_main:
                _write_metrics(out_dir / METRICS, history)

    if rt.is_main:
        model_config = dataclasses.asdict(core.config) if dataclasses.is_dataclass(getattr(core, "config", None)) else {}
        head: dict[str, Any] = {"epochs": cfg.epochs}
        if best > -math.inf:
            head["val_cider"] = best
        head.update(summary or {})
        write_manifest(out_dir, "rdpp.model",
                       {**manifest_config, "stage": stage, "precision": precision, "model_config": model_config},
                       inputs=inputs, summary=head)
        finish(out_dir)
        last = history[-1] if history else {}
        rows: list[tuple[str, Any]] = [
            ("artifact", out_dir),
            ("trained on", f"{data.path}  ({len(loader.images)} train images, {cfg.seq_per_img} captions each)"),
            ("epochs / steps", f"{cfg.epochs} / {step}"),
            ("train loss (last epoch)", last.get("loss", "-")),
        ]
        if best > -math.inf:
            rows += [("val CIDEr-D (best)", f"{best:.4f} (epoch {best_epoch}, {len(val_all)} val images, greedy)"),
                     ("val CIDEr-D (last)", last.get("val_cider", "-"))]
        rows += [(k, v) for k, v in (summary or {}).items()]
        ips = [r["images_per_s"] for r in history if r.get("images_per_s")]
        rows += [("time", f"{elapsed():.1f} s"),
                 ("speed", f"{np.mean(ips):.1f} images/s on {rt.device}"
                  + (f" × {rt.world_size} processes" if rt.distributed else "") if ips else "-"),
                 ("precision", precision),
                 ("checkpoints", f"{ckpt_dir}/best.pt, last.pt"),
                 ("metrics", out_dir / METRICS)]
        console.print(summary_table(f"rdpp {stage}: done", rows))
    D.barrier()
    return read_artifact(out_dir, "rdpp.model")
