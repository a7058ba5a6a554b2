"""The training fast path (``--fast on``): the same steps, shaped for a GPU's limits.

A training step of an LSTM captioner at the paper's shapes is bound by kernel launches and host work (a Python
loop over 17 time steps forward and backward), not by arithmetic. With ``--fast on`` the stages
run the same mathematics another way (docs/training.md, "The fast path"):

- **one compiled teacher-forced pass.** Every model's ``static_token_logprobs`` (every shape fixed by
  the label width: all L + 1 steps run, the output layer every position, nothing waits for the
  device) under ``torch.compile`` (``FastSettings.train_mode``; on CUDA ``"reduce-overhead"``, i.e.
  CUDA graphs); under the compiler the models' hand-written kernels give way to the plain expressions, which it fuses itself
  (``models/ops.py``). One compiled function serves the XE loss and the RL steps' policy log-probs
  (one graph per input shape); scheduled sampling and label smoothing compile the XE step's own
  function (``FastPath.compiled``).
- **dropout drawn before it.** The compiled region holds no random numbers (CUDA graphs cannot
  replay them): the XE step's masks are drawn first (``xe_dropout``; on a CPU the very draws eager
  dropout makes, so the numbers are eager's), the RL step's are the sampling pass's, as always.
- **the RL step's sampling without waiting**: every one of the ``max_len + 1`` decoding steps runs
  (``decode(static=True)``) and each step is compiled (``FastSettings.sample_mode``); the reward
  (CIDEr-D, the R-DPP weights, the logged self-CIDEr) is computed on the model's device in float64
  (``metrics.train_cider_torch``), equal to the numpy path to ~1e-15.
- **Adam fused** on CUDA (``fused=True``: one kernel for every parameter).
- **the loss read every ``log_every`` steps**: the step's numbers stay on the device and are read
  back in one transfer (``loggers.PendingLogs``); the divergence check runs on each of them then, in
  order, and before every validation and checkpoint, so no non-finite weights are ever saved.

``--fast auto`` (the default) is on where the model's registry line (``fast_auto``) says it was measured
both faster and equal (benchmarks/models_speed.py --fast), per device type: so far one model on CUDA. It is recorded in
the manifest (``fast``, ``fast_option``) and is not part of the resume identity, like ``--device``:
on a CPU it gives the
eager numbers to float32 rounding; on CUDA the XE step's dropout is drawn at the label width from
the GPU's generator (the same distribution, another stream, as on another device).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from rdpp_cli.checks import FAST_CHOICES
from rdpp_cli.errors import RdppError
from rdpp_cli.models.base import DropoutMasks, traceable_dropout
from rdpp_cli.training.distributed import call, unwrap



@dataclass(frozen=True)
class FastSettings:
    """How the fast path runs on one kind of device (benchmarks/models_speed.py --fast compares variants).

    ``backend``: torch.compile's backend; ``train_mode`` / ``sample_mode``: its mode for the
    teacher-forced pass and for one decoding step (None: the default; "reduce-overhead": CUDA
    graphs); ``compile_sampling``: compile the decoding step at all; ``fused_adam``;
    ``log_every``: steps between reads of the losses on the host."""

    backend: str = "inductor"
    train_mode: str | None = None
    sample_mode: str | None = None
    compile_sampling: bool = True
    fused_adam: bool = False
    log_every: int = 25


SETTINGS: dict[str, FastSettings] = {
    "cpu": FastSettings(),
    "cuda": FastSettings(train_mode="reduce-overhead", fused_adam=True),
}


def _model_class(model: nn.Module | str | None) -> str | None:
    """The class name of ``model`` (a module, DDP-wrapped or not, or the name) as the registry knows it."""
    if model is None or isinstance(model, str):
        return model
    return type(unwrap(model)).__name__


def resolve_fast(option: str, device: torch.device | str, model: nn.Module | str | None = None) -> str:
    """``--fast`` for a run of ``model`` (a module or its class name) on ``device``: "on" or "off"
    (``auto``: on where the model's registry line lists the device type in ``fast_auto``, i.e. where the fast
    path was measured faster than the eager step and equal to it; off for a model the registry does not know)."""
    if option not in FAST_CHOICES:
        raise RdppError(f"--fast {option!r} is not a --fast setting; use one of {', '.join(FAST_CHOICES)}")
    if option == "auto":
        from rdpp_cli.models.registry import spec_of_class

        spec = spec_of_class(_model_class(model) or "")
        return "on" if spec is not None and torch.device(device).type in spec.fast_auto else "off"
    return option


def fast_path(option: str, device: torch.device | str, model: nn.Module | None = None) -> "FastPath | None":
    """The fast path of a run of ``model`` on ``device`` with ``--fast option``, or None when it is
    off. A model without it (``supports_fast`` False): ``auto`` is off, ``on`` an RdppError."""
    device = torch.device(device)
    if model is not None and not getattr(unwrap(model), "supports_fast", False):
        if option == "on":
            raise RdppError(f"--fast on: the {type(unwrap(model)).__name__} model has no fast path; "
                            "train it with --fast auto or --fast off")
        return None
    if resolve_fast(option, device, model) == "off":
        return None
    return FastPath(device, SETTINGS.get(device.type, FastSettings()))


def _teacher_forced(net: nn.Module, att: Tensor, seqs: Tensor, att_mask: Tensor | None,
                    drop: DropoutMasks | None, fc: Tensor | None) -> tuple[Tensor, Tensor]:
    return call(net, "static_token_logprobs", att, seqs, att_mask=att_mask, drop=drop, fc=fc)


def _decoding_step(model: nn.Module, it: Tensor, enc: Any, state: tuple,
                   drop: dict[str, Tensor] | None) -> tuple[Tensor, tuple]:
    return model.step(it, enc, state, drop)


class CompiledDecoder:
    """``model`` as ``rdpp_cli.decoding.decode`` sees it, with its one decoding step compiled
    (everything else is the model's own). The step holds no random numbers: the RL step's dropout
    is drawn in advance, and greedy decoding runs in eval mode."""

    def __init__(self, model: nn.Module, step) -> None:
        self.model, self._step = model, step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def step(self, it: Tensor, enc: Any, state: tuple,
             drop: dict[str, Tensor] | None = None) -> tuple[Tensor, tuple]:
        return self._step(self.model, it, enc, state, drop)


@dataclass
class FastPath:
    """The compiled functions and settings of one run's fast path (see the module docstring)."""

    device: torch.device
    settings: FastSettings = field(default_factory=FastSettings)

    def __post_init__(self) -> None:
        s = self.settings
        self._tf = self._compile(_teacher_forced, s.train_mode)
        self._step = self._compile(_decoding_step, s.sample_mode) if s.compile_sampling else _decoding_step
        self._graphs = "reduce-overhead" in (s.train_mode, s.sample_mode) and self.device.type == "cuda"
        self._compiled: dict = {}

    def _compile(self, fn, mode: str | None):
        kw = {"mode": mode} if self.settings.backend == "inductor" and mode else {}
        return torch.compile(fn, backend=self.settings.backend, dynamic=False, fullgraph=True, **kw)

    @property
    def log_every(self) -> int:
        return self.settings.log_every

    def describe(self) -> str:
        """One line for the run's summary table."""
        s = self.settings
        parts = [f"torch.compile ({s.backend}, {s.train_mode or 'default'} mode)"]
        parts += ["compiled sampling steps"] if s.compile_sampling else []
        parts += ["fused Adam"] if s.fused_adam else []
        return ", ".join(parts) + f", losses read every {s.log_every} steps"

    def begin_step(self) -> None:
        """Mark a new training step for CUDA graphs (the last step's outputs are no longer read)."""
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def token_logprobs(self, net: nn.Module, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``static_token_logprobs`` of ``net`` (DDP-wrapped or not), compiled: (N, L+1) each.
        ``drop`` is made readable by the compiled pass first (``models.base.traceable_dropout``)."""
        drop = traceable_dropout(unwrap(net), drop, att.shape[0], att.shape[1])
        return self._tf(net, att, seqs, att_mask, drop, fc)

    def compiled(self, fn):
        """``fn`` compiled as the teacher-forced pass is (one compiled function per ``fn``, kept)."""
        if fn not in self._compiled:
            self._compiled[fn] = self._compile(fn, self.settings.train_mode)
        return self._compiled[fn]

    def decoder(self, model: nn.Module) -> CompiledDecoder:
        """``model`` for ``decode`` with its decoding step compiled."""
        return CompiledDecoder(model, self._step)

    def optimizer(self, params, lr: float, **adam) -> torch.optim.Adam:
        """Adam as the eager loop builds it (``adam``: its betas and eps), fused where the settings say."""
        fused = {"fused": True} if self.settings.fused_adam else {}
        return torch.optim.Adam(params, lr=lr, **adam, **fused)

    def xe_dropout(self, model: nn.Module, labels: Tensor, regions: int) -> DropoutMasks | None:
        """The dropout of an XE step over ``labels`` (B, k, L), drawn before the compiled pass, laid
        out at the label width (None in eval mode or without dropout). On a CPU the very draws eager
        dropout makes (``model.eager_dropout``), so the fast step gives the eager numbers; elsewhere
        one draw each at the label width (no host wait)."""
        if not model.training:
            return None
        if self.device.type != "cpu":
            seqs = labels.reshape(-1, labels.shape[-1])
            return model.draw_dropout(labels.shape[0], seqs.shape[0], seqs.shape[1] + 1, regions)
        return model.eager_dropout(labels, regions)
