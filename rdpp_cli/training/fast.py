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
  function (``FastPath.compiled_step``).
- **dropout drawn before it.** The compiled region holds no random numbers (CUDA graphs cannot
  replay them): the XE step's masks are drawn first (``xe_dropout``; on a CPU the very draws eager
  dropout makes, so the numbers are eager's), the RL step's are the sampling pass's, as always.
- **the RL step's sampling as one graph**: the whole decoding pass (encoding, every one of the
  ``max_len + 1`` steps with finished rows masked, the packing; ``decoding.decode.static_decode``)
  is one compiled function (``FastSettings.sample_mode``), its randomness -- the dropout masks and
  one uniform per row and step -- drawn in advance from the step's generator, as the eager step
  draws it; the greedy captions of SCST and of validation likewise.
- **the reward on the device, as one graph**: CIDEr-D against a padded reference table of the
  whole data artifact built once on the device (``metrics.train_cider_torch.ReferenceTable``), the
  weights and the logged self-CIDEr without a host sync (the eigenproblems by Jacobi rotations,
  the pseudo-inverse fallback chosen by ``torch.where``), in float64, compiled
  (``RewardStep.device_weights``); validation's CIDEr likewise.
- **Adam fused** on CUDA (``fused=True``: one kernel for every parameter).
- **CUDA graphs checked**: where torch skipped them for a compiled function (its counter of
  "skipping cudagraphs due to ..."), a note says so once and the manifest records
  ``fast_cuda_graphs: skipped`` (``check_graphs``, ``manifest_summary``).
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
from rdpp_cli.decoding.decode import DecodeConfig, Decoded, static_decode
from rdpp_cli.errors import RdppError
from rdpp_cli.models.base import DropoutMasks, traceable_dropout
from rdpp_cli.training.distributed import call, unwrap



RECOMPILE_LIMIT = 64  # graphs per compiled function (torch's default: 8), see FastPath.__post_init__


@dataclass(frozen=True)
class FastSettings:
    """How the fast path runs on one kind of device (benchmarks/models_speed.py --fast compares variants).

    ``backend``: torch.compile's backend; ``train_mode`` / ``sample_mode``: its mode for the
    teacher-forced pass and for the whole sampling pass (None: the default; "reduce-overhead": CUDA
    graphs); ``compile_sampling``: compile the sampling pass at all; ``fused_adam``;
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


def _graph_skips() -> int:
    """How often inductor has given up CUDA graphs for a compiled function in this process
    (torch's "skipping cudagraphs due to ..."), from its counters."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


@dataclass
class FastPath:
    """The compiled functions and settings of one run's fast path (see the module docstring)."""

    device: torch.device
    settings: FastSettings = field(default_factory=FastSettings)

    def __post_init__(self) -> None:
        s = self.settings
        # one graph per mode and input shape of each compiled function: a run's sampling pass alone
        # meets training sampling, SCST's and validation's greedy passes and the validation samples,
        # each at a full and a last batch; past torch's default of 8 it would run eagerly, silently
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self._tf = self._compile(_teacher_forced, s.train_mode)
        self._decode = self._compile(static_decode, s.sample_mode) if s.compile_sampling else static_decode
        self._compiled: dict[Any, Any] = {}
        self._graphs = "reduce-overhead" in (s.train_mode, s.sample_mode) and self.device.type == "cuda"
        self._skips_before, self.graphs_skipped = _graph_skips(), False

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
        parts += ["the sampling pass compiled as one function"] if s.compile_sampling else []
        parts += ["fused Adam"] if s.fused_adam else []
        return ", ".join(parts) + f", losses read every {s.log_every} steps"

    def begin_step(self) -> None:
        """Mark a new training step for CUDA graphs (the last step's outputs are no longer read);
        the first time inductor is seen to have skipped CUDA graphs, say so (``graphs_skipped``)."""
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()
            self.check_graphs()

    def check_graphs(self) -> bool:
        """Whether inductor skipped CUDA graphs for a function compiled since this fast path was
        made (a note the first time: the run goes on, compiled but without graphs, slower and not
        the numbers the graphs gave; ``graphs_skipped`` goes to the manifest)."""
        if self._graphs and not self.graphs_skipped and _graph_skips() > self._skips_before:
            from rdpp_cli.console import note

            self.graphs_skipped = True
            note("the fast path runs without CUDA graphs: torch skipped them (its log says why: "
                 "TORCH_LOGS=cudagraphs); the steps are compiled, not replayed as graphs")
        return self.graphs_skipped

    def manifest_summary(self) -> dict[str, Any]:
        """What the run's manifest records of the fast path beside ``fast``: whether CUDA graphs were
        skipped."""
        return {"fast_cuda_graphs": ("skipped" if self.check_graphs() else "used") if self._graphs else "off"}

    def decode(self, model: nn.Module, att: Tensor, cfg: DecodeConfig, att_mask: Tensor | None = None,
               fc: Tensor | None = None, drop: DropoutMasks | None = None, uniforms: Tensor | None = None
               ) -> Decoded:
        """``static_decode`` compiled as one function: the whole greedy or sampling pass, its
        randomness (``drop``, ``uniforms``) drawn before it (``decoding.decode.draw_uniforms``)."""
        cfg.check()
        return self._decode(model, att, cfg, att_mask, fc, drop, uniforms)

    def compiled(self, fn):
        """``fn`` (a function of tensors, no gradient) compiled once per fast path, ``fullgraph`` (a
        host sync in it is an error), no CUDA graphs: how the reward and validation's CIDEr run."""
        if fn not in self._compiled:
            self._compiled[fn] = self._compile(torch.no_grad()(fn), None)
        return self._compiled[fn]

    def token_logprobs(self, net: nn.Module, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``static_token_logprobs`` of ``net`` (DDP-wrapped or not), compiled: (N, L+1) each.
        ``drop`` is made readable by the compiled pass first (``models.base.traceable_dropout``)."""
        drop = traceable_dropout(unwrap(net), drop, att.shape[0], att.shape[1])
        return self._tf(net, att, seqs, att_mask, drop, fc)

    def compiled_step(self, fn):
        """``fn`` (a training step's function, with gradients) compiled as the teacher-forced pass is:
        one compiled function per ``fn``, kept (scheduled sampling's and label smoothing's XE step)."""
        key = (fn, "step")
        if key not in self._compiled:
            self._compiled[key] = self._compile(fn, self.settings.train_mode)
        return self._compiled[key]

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
