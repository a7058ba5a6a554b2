"""Numeric precision of the model's arithmetic: ``--precision fp32|bf16|fp16|auto``.

``bf16`` and ``fp16`` run the model under ``torch.autocast``: its matrix products (the linear
layers, the attention context) take bfloat16/float16 inputs and accumulate in float32, while
everything else stays float32 -- the weights and Adam's state (the "master" copy the optimizer
updates), the checkpoints, the LSTM cell state, the attention scores and their softmax, every
log-softmax and log-probability, and the rewards and metrics (CIDEr-D in float64 numpy, the DPP
algebra in float64). Backward runs each product in the precision its forward ran in. ``fp16``
scales the loss with a ``torch.amp.GradScaler`` (float16's range is too small for small gradients),
whose state is part of the resume state.

``auto`` on a CUDA GPU is bf16 from compute capability 8.0 on (native bf16 matrix units) and fp32
before. On a CPU that lists no bf16 arithmetic (``/proc/cpuinfo``: ``avx512_bf16``, ``amx_bf16``,
Arm's ``bf16``) it is fp32; on one that does, it is chosen by measurement, since the flag alone
does not say whether the step gains (1.73x on an AMD EPYC with AVX-512 BF16, 1.23x on an Intel
Xeon with AMX): a short probe (``probe_step``: one XE training step of the model itself, ``Att2in`` at the
run's widths on a few images -- forward, backward and an Adam step) is timed in fp32
and under bf16 autocast, interleaved, and bf16 is chosen only when its median is at least
``BF16_MIN_SPEEDUP`` times faster (``choose_precision``). The result is cached per machine
(``$XDG_CACHE_HOME/rdpp/precision.json``, keyed by CPU model, torch version, threads and widths),
so the probe runs once. fp16 is never chosen by ``auto`` (on a CPU without float16 matrix units
it is ~13x slower than fp32). docs/training.md ("Precision") has the measurements.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch

from rdpp_cli.checks import DEFAULT_PRECISION, PRECISIONS
from rdpp_cli.errors import RdppError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def native_bf16(device: torch.device | str) -> bool:
    """Whether ``device`` computes bfloat16 matrix products natively (not by conversion)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu":
        return bool({"avx512_bf16", "amx_bf16", "bf16"} & _cpu_flags())  # x86 flags; Arm's "Features"
    return False


def check_precision(precision: str) -> None:
    """RdppError unless ``precision`` is one of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise RdppError(f"--precision {precision!r} is not a precision; use one of {', '.join(PRECISIONS)}")


def resolve_precision(precision: str, device: torch.device | str, shape: ProbeShape | None = None) -> str:
    """The precision a run on ``device`` uses for ``--precision precision``: fp32, bf16 or fp16.
    ``auto``: on CUDA by compute capability, on a CPU by the cached probe at ``shape``'s widths
    (default: the paper's)."""
    check_precision(precision)
    if precision != "auto":
        return precision
    device = torch.device(device)
    if device.type == "cpu":
        return cpu_auto_precision(shape or ProbeShape())
    return "bf16" if native_bf16(device) else "fp32"


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context to run the model's forward in (nothing for fp32). ``precision`` is resolved."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=_DTYPES[precision])


def full_precision(device: torch.device | str) -> contextlib.AbstractContextManager:
    """A context in which autocast is off (the rewards are computed in it)."""
    return torch.autocast(device_type=torch.device(device).type, enabled=False)


def grad_scaler(precision: str, device: torch.device | str) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 (None otherwise): bf16 has float32's range and needs none."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(torch.device(device).type)


# -- --precision auto on a CPU: measured, cached ------------------------------------------------------

# bf16 only when the probe's median step is at least 10 % faster than fp32's: a smaller gain is within
# the run-to-run spread of medians on a shared machine, and does not pay for leaving fp32's numbers
# (a bf16 run is not bitwise an fp32 run; its loss differs by ~1e-3 relative).
BF16_MIN_SPEEDUP = 1.10
_ABANDON = 3.0  # a bf16 probe step over 3x fp32's: no native bf16 here; stop timing it


@dataclass(frozen=True)
class ProbeShape:
    """The widths the probe runs at (the model's; the paper preset by default) and its size."""
    rnn_size: int = 512
    att_feat_size: int = 2048
    regions: int = 196
    vocab_size: int = 9487
    images: int = 2
    seq_per_img: int = 5
    steps: int = 8


def choose_precision(fp32_s: float, bf16_s: float | None, min_speedup: float = BF16_MIN_SPEEDUP) -> str:
    """bf16 if its measured step time ``bf16_s`` beats ``fp32_s`` by ``min_speedup`` or more; fp32
    otherwise (also when bf16 was not measured: None)."""
    if bf16_s is None or not bf16_s > 0 or not fp32_s > 0:
        return "fp32"
    return "bf16" if fp32_s / bf16_s >= min_speedup else "fp32"


def probe_model(shape: ProbeShape) -> torch.nn.Module:
    """The model ``auto`` times: rdpp's ``Att2in`` at ``shape``'s widths (the paper's dropout), its
    weights drawn from a fixed seed without touching the caller's random state."""
    from rdpp_cli.models.att2in import Att2in, Att2inConfig  # the model layer, only when measuring

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Att2in(Att2inConfig(vocab_size=shape.vocab_size, input_encoding_size=shape.rnn_size,
                                   rnn_size=shape.rnn_size, att_hid_size=shape.rnn_size,
                                   att_feat_size=shape.att_feat_size, seq_length=shape.steps)).train()


def probe_step(model: torch.nn.Module, att: torch.Tensor, words: torch.Tensor, opt, precision: str) -> float:
    """One XE training step of ``model`` on ``att`` (B, R, D) and captions ``words`` (B, n, T), as
    ``rdpp train-xe`` takes it: the teacher-forced ``token_logprobs`` under ``precision``'s autocast,
    the mean negative log-likelihood per token, backward, the optimizer's step. Returns the loss."""
    with autocast(precision, "cpu"):
        token_logp, mask = model.token_logprobs(att, words)
    loss = -token_logp.sum() / mask.sum()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def probe_cpu_bf16(shape: ProbeShape, repeats: int = 3) -> dict[str, float | None]:
    """Median seconds of ``probe_step`` in fp32 and bf16 on this CPU, interleaved (fp32, bf16,
    bf16, fp32, ...) after one warm-up of each. bf16 is None when its warm-up took over ``_ABANDON``
    times fp32's (conversion-only bf16). The dropout it draws leaves the caller's random state as it was."""
    gen = torch.Generator().manual_seed(0)
    att = torch.randn(shape.images, shape.regions, shape.att_feat_size, generator=gen).relu_()
    words = torch.randint(1, shape.vocab_size + 1, (shape.images, shape.seq_per_img, shape.steps), generator=gen)
    model = probe_model(shape)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def timed(prec: str) -> float:
        t = time.perf_counter()
        probe_step(model, att, words, opt, prec)
        return time.perf_counter() - t

    with torch.random.fork_rng(devices=[]):
        warm = {prec: timed(prec) for prec in ("fp32", "bf16")}
        if warm["bf16"] > _ABANDON * warm["fp32"]:
            return {"fp32_s": warm["fp32"], "bf16_s": None}
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        for r in range(repeats):
            for prec in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
                times[prec].append(timed(prec))
    return {"fp32_s": statistics.median(times["fp32"]), "bf16_s": statistics.median(times["bf16"])}


def cache_path() -> Path:
    """Where ``auto``'s CPU measurements are kept: ``$XDG_CACHE_HOME/rdpp/precision.json``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rdpp" / "precision.json"


def cpu_key(shape: ProbeShape) -> str:
    """The cache key: what the measurement depends on (CPU model, torch, threads, widths, what the
    probe times: an entry measured by another probe is measured again)."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    widths = f"{shape.rnn_size}/{shape.att_feat_size}/{shape.regions}/{shape.vocab_size}"
    return f"{model} | torch {torch.__version__} | {torch.get_num_threads()} threads | {widths} | Att2in XE step"


def read_cache(path: Path) -> dict:
    """The cache's entries ({} when the file is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_cache(path: Path, key: str, entry: dict) -> None:
    """Add ``entry`` under ``key`` (atomically: a temporary file renamed over the old one). A cache
    that cannot be written is skipped: the next run measures again."""
    data = read_cache(path)
    data[key] = entry
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)


def cpu_auto_precision(shape: ProbeShape) -> str:
    """``auto`` on this CPU: fp32 where the CPU lists no bf16 arithmetic (``native_bf16``: bf16
    would be converted to float32, never faster); otherwise the cached choice for
    ``cpu_key(shape)``, or the probe's, then cached."""
    if _cpu_flags() and not native_bf16("cpu"):
        return "fp32"
    path, key = cache_path(), cpu_key(shape)
    entry = read_cache(path).get(key)
    if not (isinstance(entry, dict) and entry.get("choice") in ("fp32", "bf16")):
        from rdpp_cli.console import note

        timing = probe_cpu_bf16(shape)
        entry = {**timing, "choice": choose_precision(timing["fp32_s"], timing["bf16_s"]),
                 "min_speedup": BF16_MIN_SPEEDUP, "shape": asdict(shape), "measured": time.strftime("%Y-%m-%d %H:%M")}
        write_cache(path, key, entry)
        ratio = f"{timing['fp32_s'] / timing['bf16_s']:.2f}x fp32's speed" if timing["bf16_s"] else "far slower"
        note(f"--precision auto: bf16 ran at {ratio} on this CPU (bf16 needs {BF16_MIN_SPEEDUP:.2f}x): "
             f"{entry['choice']} (measured once, cached in {path})")
    return entry["choice"]
