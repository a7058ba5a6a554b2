"""``--precision auto``: chosen by measuring a step of the run's own model, cached per machine.

The probe builds a model from its registry line and times a step of it, so it sits on the models'
layer; what runs a precision (autocast, the dtypes, the loss scaler) is the leaf, ``rdpp_cli.precision``.

``auto`` is chosen by measurement, on a CUDA GPU and on a CPU alike: a short probe (``probe_step``:
one XE training step of the run's own model -- its registry line and sizes, ``ProbeShape.of`` --
at the run's batch, regions and caption length, through the compiled fixed-shape pass when the
run's ``--fast`` is on -- forward, backward and an Adam step) is timed in fp32 and under bf16
autocast, interleaved, and bf16 is chosen only when its median is at least ``BF16_MIN_SPEEDUP``
times faster (``choose_precision``); until measured the answer is fp32 (the compute capability or a
CPU flag alone never picks bf16: on an H200 bf16 was slower than fp32 in every training step
measured). A device that lists no bf16 arithmetic (a GPU before compute capability 8.0; a CPU
without ``avx512_bf16``, ``amx_bf16`` or Arm's ``bf16`` in ``/proc/cpuinfo``) is fp32 without
measuring. The result is cached per machine (``$XDG_CACHE_HOME/rdpp/precision.json``, keyed by the
device's name, torch version, threads, the model and a hash of its config, the batch and the fast
path: ``probe_key``; a cache that cannot be written is said so, and the next run measures again), so the probe runs once per kind of run. fp16 is never chosen by ``auto`` (on a CPU
without float16 matrix units it is many times slower than fp32). docs/training.md ("Precision") says
why; benchmarks/README.md has the measurements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from rdpp_cli.artifacts.files import cache_dir
from rdpp_cli.models.registry import DEFAULT_MODEL
from rdpp_cli.precision import autocast, fixed_precision, tf32_matmuls


def resolve_precision(precision: str, device: torch.device | str, shape: ProbeShape | None = None) -> str:
    """The precision a run on ``device`` uses for ``--precision precision``: fp32, tf32, bf16 or fp16.
    ``auto``: the cached measurement of the run's step (``shape``: its model, batch and fast path;
    default: the default --model at the paper's sizes), fp32 where the device has no bf16 arithmetic
    (``rdpp_cli.precision.fixed_precision``)."""
    fixed = fixed_precision(precision, device)
    return fixed if fixed is not None else auto_precision(shape or ProbeShape(), torch.device(device))


# -- --precision auto: measured, cached ------------------------------------------------------------------

# bf16 only when the probe's median step is at least 10 % faster than fp32's: a smaller gain is within
# the run-to-run spread of medians on a shared machine, and does not pay for leaving fp32's numbers
# (a bf16 run is not bitwise an fp32 run; its loss differs by ~1e-3 relative).
BF16_MIN_SPEEDUP = 1.10
_ABANDON = 3.0  # a bf16 probe step over 3x fp32's: no native bf16 here; stop timing it


@dataclass(frozen=True)
class ProbeShape:
    """What the probe runs: the model (its registry name; ``preset``'s sizes, ``rnn_size`` overriding
    the recurrent widths, ``config`` the fields of a model already built), the data's widths, the
    batch (``images`` x ``seq_per_img`` captions of ``steps`` words) and whether the fast path runs."""
    rnn_size: int | None = None
    att_feat_size: int = 2048
    regions: int = 196
    vocab_size: int = 9487
    images: int = 2
    seq_per_img: int = 5
    steps: int = 8
    model: str = DEFAULT_MODEL
    preset: str = "paper"
    fc_feat_size: int = 2048
    fast: str = "off"
    config: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, model: torch.nn.Module, *, images: int, seq_per_img: int, regions: int, steps: int,
           fast: str = "off") -> "ProbeShape":
        """The probe of a run that trains ``model`` (built from its registry line) at this batch."""
        from rdpp_cli.models.registry import model_name

        c = model.config
        return cls(att_feat_size=c.att_feat_size, regions=regions, vocab_size=c.vocab_size, images=images,
                   seq_per_img=seq_per_img, steps=steps, model=model_name(model), preset="paper",
                   fc_feat_size=getattr(c, "fc_feat_size", 2048), fast=fast,
                   config=tuple(sorted(dataclasses.asdict(c).items())))

    def model_fields(self) -> dict[str, Any]:
        """The config fields the probe's model is built with over its preset's sizes."""
        out: dict[str, Any] = {"vocab_size": self.vocab_size, "att_feat_size": self.att_feat_size,
                               "fc_feat_size": self.fc_feat_size, "seq_length": self.steps}
        if self.rnn_size is not None:
            out.update(rnn_size=self.rnn_size, input_encoding_size=self.rnn_size, att_hid_size=self.rnn_size)
        return {**out, **dict(self.config)}


def choose_precision(fp32_s: float, bf16_s: float | None, min_speedup: float = BF16_MIN_SPEEDUP) -> str:
    """bf16 if its measured step time ``bf16_s`` beats ``fp32_s`` by ``min_speedup`` or more; fp32
    otherwise (also when bf16 was not measured: None)."""
    if bf16_s is None or not bf16_s > 0 or not fp32_s > 0:
        return "fp32"
    return "bf16" if fp32_s / bf16_s >= min_speedup else "fp32"


def probe_model(shape: ProbeShape, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The model ``auto`` times: ``shape.model`` built from its registry line at ``shape``'s sizes
    (the preset's dropout), its weights drawn from a fixed seed without touching the caller's random
    state, in train mode on ``device``."""
    from rdpp_cli.models.registry import model_spec  # the model layer, only when measuring

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = model_spec(shape.model).build(shape.preset, **shape.model_fields())
    return model.to(device).train()


def probe_step(model: torch.nn.Module, att: torch.Tensor, words: torch.Tensor, opt, precision: str,
               fc: torch.Tensor | None = None, forward=None) -> float:
    """One XE training step of ``model`` on ``att`` (B, R, D) and captions ``words`` (B, n, T), as
    ``rdpp train-xe`` takes it: the teacher-forced ``token_logprobs`` (or ``forward``, the compiled
    fast pass) under ``precision``'s autocast, the mean negative log-likelihood per token, backward,
    the optimizer's step. Returns the loss."""
    with autocast(precision, att.device):
        token_logp, mask = (forward or model.token_logprobs)(att, words, fc=fc)
    loss = -token_logp.sum() / mask.sum()
    with tf32_matmuls(precision):
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def _probe_inputs(shape: ProbeShape, device: torch.device):
    gen = torch.Generator().manual_seed(0)
    att = torch.randn(shape.images, shape.regions, shape.att_feat_size, generator=gen).relu_()
    fc = torch.randn(shape.images, shape.fc_feat_size, generator=gen).relu_()
    words = torch.randint(1, shape.vocab_size + 1, (shape.images, shape.seq_per_img, shape.steps), generator=gen)
    return att.to(device), fc.to(device), words.to(device)


def probe_bf16(shape: ProbeShape, device: torch.device | str = "cpu", repeats: int = 3) -> dict[str, float | None]:
    """Median seconds of ``probe_step`` in fp32 and bf16 on ``device``, interleaved (fp32, bf16,
    bf16, fp32, ...) after one warm-up of each (with ``shape.fast`` on: the compiled fixed-shape pass,
    warmed up by compiling). bf16 is None when its warm-up took over ``_ABANDON`` times fp32's
    (conversion-only bf16). The dropout it draws leaves the caller's random state as it was."""
    device = torch.device(device)
    att, fc, words = _probe_inputs(shape, device)
    model = probe_model(shape, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    forward = None
    if shape.fast == "on" and hasattr(model, "static_token_logprobs"):
        forward = torch.compile(model.static_token_logprobs, dynamic=False)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(prec: str) -> float:
        sync()
        t = time.perf_counter()
        probe_step(model, att, words, opt, prec, fc=fc, forward=forward)
        sync()
        return time.perf_counter() - t

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        warm = {prec: timed(prec) for prec in ("fp32", "bf16")}
        if warm["bf16"] > _ABANDON * warm["fp32"] and forward is None:
            return {"fp32_s": warm["fp32"], "bf16_s": None}
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for r in range(repeats):
            for prec in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                times[prec].append(timed(prec))
    return {"fp32_s": statistics.median(times["fp32"]), "bf16_s": statistics.median(times["bf16"])}


def probe_cpu_bf16(shape: ProbeShape, repeats: int = 3) -> dict[str, float | None]:
    """``probe_bf16`` on this CPU."""
    return probe_bf16(shape, "cpu", repeats)


def cache_path() -> Path:
    """Where ``auto``'s measurements are kept: ``$XDG_CACHE_HOME/rdpp/precision.json``."""
    return cache_dir("precision.json")


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (cuda)"
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return model


def model_hash(shape: ProbeShape) -> str:
    """The first 16 hex digits of the sha256 of the probe model's config fields (``model_fields``,
    as sorted JSON): the key's stand-in for a config that can be large (a Hugging Face model's holds
    its whole config and its tokenizer's files)."""
    fields = shape.model_fields()
    text = json.dumps({k: fields[k] for k in fields if k not in ("vocab_size", "att_feat_size")}, sort_keys=True,
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def probe_key(shape: ProbeShape, device: torch.device | str = "cpu") -> str:
    """The cache key: what the measurement depends on (the device's model, torch, threads, the model
    and a hash of its config fields, the batch, the fast path, what the probe times: an entry
    measured by another probe is measured again). A few hundred characters whatever the model."""
    device = torch.device(device)
    widths = f"config {model_hash(shape)}"
    if shape.rnn_size is not None:
        widths = f"rnn {shape.rnn_size} {widths}"
    return (f"{_device_name(device)} | torch {torch.__version__} | {torch.get_num_threads()} threads | "
            f"{shape.model} {shape.preset} {widths} | att {shape.regions}x{shape.att_feat_size} vocab "
            f"{shape.vocab_size} | batch {shape.images}x{shape.seq_per_img}x{shape.steps} | fast {shape.fast} "
            "| XE step")


def cpu_key(shape: ProbeShape) -> str:
    """``probe_key`` on this CPU."""
    return probe_key(shape, "cpu")


def read_cache(path: Path) -> dict:
    """The cache's entries ({} when the file is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(path: Path, key: str, entry: dict) -> str | None:
    """Add ``entry`` under ``key`` (atomically: a temporary file renamed over the old one). A cache
    that cannot be written is skipped, its temporary file removed, and the reason returned (None:
    written); the next run measures again."""
    data = read_cache(path)
    data[key] = entry
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return e.strerror or type(e).__name__
    return None


def _cache_entry(shape: ProbeShape, timing: dict[str, float | None]) -> dict:
    """What the cache keeps of a measurement: the timings, the choice, the rule, the shape (its model
    config as ``model_hash``, not the config itself) and when."""
    return {**timing, "choice": choose_precision(timing["fp32_s"], timing["bf16_s"]), "min_speedup": BF16_MIN_SPEEDUP,
            "shape": {**asdict(dataclasses.replace(shape, config=())), "config": model_hash(shape)},
            "measured": time.strftime("%Y-%m-%d %H:%M")}


def auto_precision(shape: ProbeShape, device: torch.device) -> str:
    """``auto`` on ``device``, a device with bf16 arithmetic (``fixed_precision`` answers for the
    others): the cached choice for ``probe_key``, or the probe's (``probe_bf16``), then cached."""
    path, key = cache_path(), probe_key(shape, device)
    entry = read_cache(path).get(key)
    if not (isinstance(entry, dict) and entry.get("choice") in ("fp32", "bf16")):
        from rdpp_cli.console import note

        timing = probe_cpu_bf16(shape) if device.type == "cpu" else probe_bf16(shape, device)
        entry = _cache_entry(shape, timing)
        failed = write_cache(path, key, entry)
        ratio = f"{timing['fp32_s'] / timing['bf16_s']:.2f}x fp32's speed" if timing["bf16_s"] else "far slower"
        kept = (f"measured once, cached in {path}" if failed is None else
                f"not cached: {path} cannot be written ({failed}), so the next run measures again")
        note(f"--precision auto: bf16 ran at {ratio} for this run's {shape.model} step on this {device.type} (bf16 "
             f"needs {BF16_MIN_SPEEDUP:.2f}x): {entry['choice']} ({kept})")
    return entry["choice"]


def cpu_auto_precision(shape: ProbeShape) -> str:
    """``auto`` on this CPU."""
    return resolve_precision("auto", "cpu", shape)
