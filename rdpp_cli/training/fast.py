"""A run's steps, chosen once (``run_steps``): ``Steps`` (eager) or the fast path (``--fast on``,
``FastPath``): the same steps, shaped for a GPU's limits.

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
  replay them): the XE step's masks are drawn first (``xe_dropout``: ``draw_dropout`` at the label
  width, as the RL step draws its own), the RL step's are the sampling pass's, as always.
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

- **a compiler that fails** (``FastPath.fail``): under ``--fast auto`` a note, the functions run
  uncompiled from then on and the step (or validation) under way is taken again; under ``--fast
  on`` one RdppError; ``$RDPP_COMPILE_BACKEND`` picks torch.compile's backend.
- **compiling paid once**: inductor's FX-graph and AOT autograd caches in rdpp's cache folder
  (``keep_compiled_code``), a partial batch padded to the full one's graph (``_Compiled.fixed``),
  the compile seconds in the manifest (``compile_s``).

``--fast auto`` (the default) is on where the model's registry line (``fast_auto``) says it was measured
both faster and equal (benchmarks/models_speed.py --fast), per device type: so far one model on CUDA. It is recorded in
the manifest (``fast``, ``fast_option``) and is not part of the resume identity, like ``--device``:
the XE step's dropout is drawn at the label width (the same distribution, another stream, as on
another device).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from rdpp_cli.artifacts.files import cache_dir
from rdpp_cli.checks import FAST_CHOICES
from rdpp_cli.decoding.decode import DecodeConfig, Decoded, decode, static_decode
from rdpp_cli.errors import RdppError
from rdpp_cli.models.base import DropoutMasks, traceable_dropout
from rdpp_cli.training.distributed import call, unwrap
from rdpp_cli.training.loggers import PendingLogs


RECOMPILE_LIMIT = 64  # graphs per compiled function (torch's default: 8), see FastPath.__post_init__
WARMUP_CALLS = 3  # calls of a compiled function during which any failure is its compiling's (CUDA graphs capture late)
BACKEND_ENV = "RDPP_COMPILE_BACKEND"  # torch.compile's backend instead of the settings' (e.g. aot_eager, to debug)


class CompileFailed(Exception):
    """The fast path could not compile (or capture) a function under ``--fast auto``: it now runs
    eagerly, and the step or validation that was under way is taken again (``TrainingRecipe``)."""


def _first_line(e: BaseException) -> str:
    """``e`` in one line for a note or an error: its type and its message's first line, of the error
    the compiler met where torch wraps it ("backend='inductor' raised:" says nothing)."""
    while getattr(e, "inner_exception", None) is not None:
        e = e.inner_exception
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _compile_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are always a compiler's (dynamo's, inductor's), whenever they come."""
    from torch._dynamo.exc import TorchDynamoException

    return (TorchDynamoException,)


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


def run_steps(option: str, device: torch.device | str, model: nn.Module, asked: str | None = None) -> "Steps":
    """The steps of a run of ``model`` on ``device`` with ``--fast option``, chosen once: ``FastPath``
    (compiled) or ``Steps`` (eager). A model without the fast path (``supports_fast`` False): ``auto``
    is eager, ``on`` an RdppError. The fast path scores the model's token ids as the data's words, so
    it is only built for a model that speaks them (the identity bridge, asserted). ``asked``: the
    setting the user gave, where ``option`` is the one a resumed run recorded (a compile failure
    under ``auto`` falls back, under ``on`` is an error)."""
    device = torch.device(device)
    m = unwrap(model)
    if not getattr(m, "supports_fast", False):
        if option == "on":
            raise RdppError(f"--fast on: the {type(m).__name__} model has no fast path; "
                            "train it with --fast auto or --fast off")
        resolve_fast(option, device, model)  # a bad setting is refused all the same
        return Steps()
    if resolve_fast(option, device, model) == "off":
        return Steps()
    if getattr(m, "bridge", None) is not None:  # its ids are not the data's words: the fast reward would misread them
        raise TypeError(f"the fast path scores token ids as the data's words; {type(m).__name__} has a token bridge "
                        "of its own, so it must not claim supports_fast")
    return FastPath(device, _settings(device), option=asked or option)


def _settings(device: torch.device) -> FastSettings:
    """The fast path's settings on ``device``'s type, with ``$RDPP_COMPILE_BACKEND`` as its backend
    when set."""
    s = SETTINGS.get(device.type, FastSettings())
    backend = os.environ.get(BACKEND_ENV)
    return replace(s, backend=backend) if backend else s


def fast_path(option: str, device: torch.device | str, model: nn.Module | None = None) -> "FastPath | None":
    """The ``FastPath`` of ``run_steps`` (without a model: as ``resolve_fast`` says), or None where the
    run is eager (for the benchmarks and tests that hold a fast path alone)."""
    if model is None:
        return FastPath(torch.device(device), _settings(torch.device(device)),
                        option=option) if resolve_fast(option, device) == "on" else None
    steps = run_steps(option, device, model)
    return steps if isinstance(steps, FastPath) else None


class Steps:
    """A run's steps as one object, chosen once (``run_steps``): what the stages call to decode, to
    take the teacher-forced pass, to score the reward and to build the optimizer. This class is the
    eager path: every function as written, dropout drawn inside the pass, the reward in numpy on the
    host (``NumpyScoring``, the words through the model's bridge), every step's numbers read at once;
    ``FastPath`` is the same steps compiled."""

    fast = "off"  # the --fast setting the run takes, for the manifest and the precision probe
    log_every: int | None = None  # steps between reads of the numbers (None: every step, at once)

    def decode(self, model: nn.Module, att: Tensor, cfg: DecodeConfig, att_mask: Tensor | None = None,
               fc: Tensor | None = None, drop: DropoutMasks | None = None, uniforms: Tensor | None = None
               ) -> Decoded:
        """Captions of ``model`` (``decoding.decode.decode``; their randomness ``drop``, ``uniforms``
        drawn before it, ``decoding.decode.draw_uniforms``)."""
        return decode(model, att, cfg, att_mask=att_mask, drop=drop, fc=fc, uniforms=uniforms)

    def token_logprobs(self, net: nn.Module, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The teacher-forced pass: ``token_logprobs`` of ``net`` (DDP-wrapped or not), (N, L+1) each."""
        return call(net, "token_logprobs", att, seqs, att_mask=att_mask, drop=drop, fc=fc)

    def xe_dropout(self, model: nn.Module, labels: Tensor, regions: int) -> DropoutMasks | None:
        """The dropout of an XE step over ``labels`` (B, k, L) drawn before its pass (None: the pass
        draws its own, as eager dropout does)."""
        return None

    def traceable(self, model: nn.Module, drop: DropoutMasks | None, batch: int, regions: int
                  ) -> DropoutMasks | None:
        """``drop`` as the step's pass reads it (the eager pass reads it as it is)."""
        return drop

    def compiled(self, fn: Callable, row_wise: bool = False) -> Callable:
        """``fn`` (a function of tensors without gradients: the reward, validation's CIDEr-D) as the
        steps run it (``row_wise``: one number per image, see ``FastPath.compiled``)."""
        return fn

    def compiled_step(self, fn: Callable) -> Callable:
        """``fn`` (a training step's function, with gradients) as the steps run it."""
        return fn

    def scoring(self, cider, data, index, device: torch.device) -> tuple[Any, Any]:
        """The reward's scoring backend and the references of images ``index``: CIDEr-D in numpy on
        the host (``NumpyScoring``) against ``data.references_ids``."""
        from rdpp_cli.metrics.train_cider import NumpyScoring

        return NumpyScoring(cider), data.references_ids(index)

    def words(self, bridge, tokens: Tensor) -> Tensor:
        """Captions in the model's ids (..., T) as the scoring backend reads them: the data's word
        ids, through ``bridge`` (None: the model speaks the data's words), on the host."""
        return torch.from_numpy(bridge.data_ids(tokens)) if bridge is not None else tokens.cpu()

    def optimizer(self, params, lr: float, **adam) -> torch.optim.Adam:
        """Adam as the loop builds it (``adam``: its betas and eps)."""
        return torch.optim.Adam(params, lr=lr, **adam)

    def pending_logs(self) -> PendingLogs | None:
        """Where the steps' numbers wait to be read (None: read at once, as floats)."""
        return None

    def begin_step(self) -> None:
        """Mark a new training step."""

    def describe(self) -> str:
        """One line for the run's summary table."""
        return "off"

    def manifest_summary(self) -> dict[str, Any]:
        """What the run's manifest records of its steps beside ``fast``."""
        return {}

    def manifest_config(self) -> dict[str, Any]:
        """What the steps change in the manifest's config after the run (``fast`` once compiling failed)."""
        return {}


EAGER = Steps()


def device_cider(cider, device: torch.device):
    """The training reward on ``device`` (``train_cider_torch.device_scorer``); RdppError where its
    df's ids are out of the device scorer's range."""
    from rdpp_cli.metrics.train_cider_torch import device_scorer

    try:
        return device_scorer(cider, device)
    except ValueError as e:
        raise RdppError(f"--fast on: {e}; train with --fast off") from None


def _teacher_forced(net: nn.Module, att: Tensor, seqs: Tensor, att_mask: Tensor | None,
                    drop: DropoutMasks | None, fc: Tensor | None) -> tuple[Tensor, Tensor]:
    return call(net, "static_token_logprobs", att, seqs, att_mask=att_mask, drop=drop, fc=fc)


def compile_cache() -> Path:
    """Where compiled code is kept across runs and processes: ``$TORCHINDUCTOR_CACHE_DIR`` where the
    user set it, else ``$XDG_CACHE_HOME/rdpp/inductor`` (``~/.cache/rdpp/inductor``), not /tmp."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    return cache_dir("inductor")


def keep_compiled_code() -> Path:
    """Before the first compile: inductor's FX-graph cache and AOT autograd's cache on, in
    ``compile_cache()`` (torch reads the folder from ``$TORCHINDUCTOR_CACHE_DIR``, set here unless the
    user set it), so that a second run of the same shapes loads its kernels instead of compiling."""
    folder = compile_cache()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(folder))  # before inductor's import: it settles the folder
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return folder


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far (dynamo's capture and the backend's compile of
    every graph, and AOT autograd's lazy compile of the backward graphs; torch's own timers)."""
    from torch._dynamo.utils import compilation_time_metrics as timers

    return float(sum(sum(timers.get(k, ())) for k in ("_compile.compile_inner", "backward._backward_impl")))


def _graph_skips() -> int:
    """How often inductor has given up CUDA graphs for a compiled function in this process
    (torch's "skipping cudagraphs due to ..."), from its counters."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


@dataclass
class FastPath(Steps):
    """The steps compiled: the fast path of one run (see the module docstring)."""

    device: torch.device
    settings: FastSettings = field(default_factory=FastSettings)
    option: str = "on"  # the --fast setting that chose it (auto or on)

    fast = "on"

    def __post_init__(self) -> None:
        s = self.settings
        self.device = torch.device(self.device)
        self.failed: str | None = None  # the first line of the compile failure that made it eager
        self.cache = keep_compiled_code()
        self._compile_s0 = compile_seconds()
        # one graph per mode and input shape of each compiled function: a run's sampling pass alone
        # meets training sampling, SCST's and validation's greedy passes and the validation samples;
        # past torch's default of 8 it would run eagerly, silently
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self._tf = self._compile(_teacher_forced, s.train_mode, fixed=_fixed_teacher_forced)
        self._decode = (self._compile(static_decode, s.sample_mode, fixed=_fixed_decode) if s.compile_sampling
                        else static_decode)
        self._compiled: dict[Any, Any] = {}
        self._graphs = "reduce-overhead" in (s.train_mode, s.sample_mode) and self.device.type == "cuda"
        self._skips_before, self.graphs_skipped = _graph_skips(), False

    def _compile(self, fn, mode: str | None, fixed: "Callable | None" = None) -> "_Compiled":
        kw = {"mode": mode} if self.settings.backend == "inductor" and mode else {}
        return _Compiled(self, torch.compile(fn, backend=self.settings.backend, dynamic=False, fullgraph=True, **kw),
                         fn, fixed)

    def fail(self, e: BaseException) -> None:
        """A compiled function failed to compile or capture (``e``): under ``--fast on`` one RdppError
        (nothing of the step was applied; the run resumes with ``--fast off``); under ``auto`` a note,
        every function runs uncompiled from now on, and ``CompileFailed`` unwinds the step under way
        so that it is taken again."""
        line = _first_line(e)
        if self.option == "on":
            raise RdppError(f"--fast on: compiling the fast path failed ({line}); nothing of this step was "
                            "applied: rerun the same command with --fast off (it resumes from the last "
                            "checkpoint)") from None
        from rdpp_cli.console import note

        self.failed = line
        note(f"--fast auto: compiling the fast path failed ({line}); the run continues eagerly")
        raise CompileFailed(line) from e

    def manifest_config(self) -> dict[str, Any]:
        """``fast`` as the run ended: "off (compile failed: ...)" once compiling failed."""
        return {"fast": f"off (compile failed: {self.failed})"} if self.failed is not None else {}

    @property
    def log_every(self) -> int:  # type: ignore[override]
        return self.settings.log_every

    def pending_logs(self) -> PendingLogs:
        """The steps' numbers stay on the device, read every ``log_every`` steps in one transfer."""
        return PendingLogs(self.log_every)

    def describe(self) -> str:
        s = self.settings
        if self.failed is not None:
            return f"off (compile failed: {self.failed}; the steps ran uncompiled from then on)"
        parts = [f"torch.compile ({s.backend}, {s.train_mode or 'default'} mode)"]
        parts += ["the sampling pass compiled as one function"] if s.compile_sampling else []
        parts += ["fused Adam"] if s.fused_adam else []
        return (", ".join(parts) + f", losses read every {s.log_every} steps; compiling took {self.compile_s:.1f} s "
                f"(compiled code kept in {self.cache})")

    @property
    def compile_s(self) -> float:
        """Seconds spent compiling since this fast path was made (``compile_seconds``)."""
        return compile_seconds() - self._compile_s0

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
        skipped, and the seconds spent compiling (``compile_s``)."""
        return {"fast_cuda_graphs": ("skipped" if self.check_graphs() else "used") if self._graphs else "off",
                "compile_s": round(self.compile_s, 2)}

    def decode(self, model: nn.Module, att: Tensor, cfg: DecodeConfig, att_mask: Tensor | None = None,
               fc: Tensor | None = None, drop: DropoutMasks | None = None, uniforms: Tensor | None = None
               ) -> Decoded:
        """``static_decode`` compiled as one function: the whole greedy or sampling pass, its
        randomness (``drop``, ``uniforms``) drawn before it (``decoding.decode.draw_uniforms``); the
        captions keep their ``max_len`` columns."""
        cfg.check()
        drop = traceable_dropout(model, drop, att.shape[0], att.shape[1])  # masks only: a batch can be padded
        return self._decode(model, att, cfg, att_mask, fc, drop, uniforms)

    def compiled(self, fn, row_wise: bool = False):
        """``fn`` (a function of tensors, no gradient) compiled once per fast path, ``fullgraph`` (a
        host sync in it is an error), no CUDA graphs: how the reward and validation's CIDEr run.
        ``row_wise``: ``fn(scorer, tokens, refs)`` gives one number per image (validation's scores),
        so a partial batch is padded to the full one (``_fixed_rows``)."""
        if fn not in self._compiled:
            self._compiled[fn] = self._compile(torch.no_grad()(fn), None, fixed=_fixed_rows if row_wise else None)
        return self._compiled[fn]

    def token_logprobs(self, net: nn.Module, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``static_token_logprobs`` of ``net`` (DDP-wrapped or not), compiled: (N, L+1) each.
        ``drop`` is made readable by the compiled pass first (``models.base.traceable_dropout``)."""
        drop = traceable_dropout(unwrap(net), drop, att.shape[0], att.shape[1])
        return self._tf(net, att, seqs, att_mask, drop, fc)

    def traceable(self, model: nn.Module, drop: DropoutMasks | None, batch: int, regions: int
                  ) -> DropoutMasks | None:
        """``drop`` with anything a compiled region cannot read drawn out now (``traceable_dropout``)."""
        return traceable_dropout(model, drop, batch, regions)

    def compiled_step(self, fn):
        """``fn`` (a training step's function, with gradients) compiled as the teacher-forced pass is:
        one compiled function per ``fn``, kept (scheduled sampling's and label smoothing's XE step)."""
        key = (fn, "step")
        if key not in self._compiled:
            self._compiled[key] = self._compile(fn, self.settings.train_mode)
        return self._compiled[key]

    def scoring(self, cider, data, index, device: torch.device) -> tuple[Any, Any]:
        """CIDEr-D on the device (``DeviceTrainCider``) against the padded reference table of the
        whole data artifact, built there once (``ReferenceTable``): the same numbers to ~1e-15."""
        from rdpp_cli.metrics.train_cider_torch import reference_table

        return device_cider(cider, device), reference_table(data, device).take(index)

    def words(self, bridge, tokens: Tensor) -> Tensor:
        """The captions as they are: the fast path runs only models that speak the data's words."""
        return tokens

    def optimizer(self, params, lr: float, **adam) -> torch.optim.Adam:
        """Adam as the eager loop builds it (``adam``: its betas and eps), fused where the settings say."""
        fused = {"fused": True} if self.settings.fused_adam else {}
        return torch.optim.Adam(params, lr=lr, **adam, **fused)

    def xe_dropout(self, model: nn.Module, labels: Tensor, regions: int) -> DropoutMasks | None:
        """The dropout of an XE step over ``labels`` (B, k, L), drawn before the compiled pass as the
        RL step draws its masks (``model.draw_dropout`` over the batch's images, its caption rows and
        L+1 steps; None in eval mode): the eager step's distribution, from another stream."""
        if not model.training:
            return None
        seqs = labels.reshape(-1, labels.shape[-1])
        return model.draw_dropout(labels.shape[0], seqs.shape[0], seqs.shape[1] + 1, regions)



# -- one graph per stage: a partial batch padded to the full one --------------------------------------

def _pad(x: Tensor | None, images: int, full: int) -> Tensor | None:
    """``x`` with ``images`` images first ((images, ...) or (images * k, ...), image-major) padded to
    ``full`` images by repeating its last image's rows (real numbers: no padding value can overflow)."""
    if x is None or images >= full:
        return x
    per = x.shape[0] // images
    last = x[(images - 1) * per:]
    return torch.cat([x, last.repeat((full - images,) + (1,) * (x.dim() - 1))])


def _pad_drop(drop: DropoutMasks | None, images: int, full: int) -> DropoutMasks | None:
    if drop is None or images >= full:
        return drop
    return DropoutMasks({k: _pad(v, images, full) for k, v in drop.image.items()},
                        {k: _pad(v, images, full) for k, v in drop.row.items()})


def _fixed_teacher_forced(full: dict, net, att, seqs, att_mask, drop, fc):
    """``_teacher_forced``'s call at the fullest batch of its shapes (``full``: the most images seen
    per the other shapes), and how to take the real rows back out of its result."""
    B, N = att.shape[0], seqs.reshape(-1, seqs.shape[-1]).shape[0]
    key = (N // B, seqs.shape[-1], tuple(att.shape[1:]), drop is None)
    F = full[key] = max(full.get(key, B), B)
    args = (net, _pad(att, B, F), _pad(seqs, B, F), _pad(att_mask, B, F), _pad_drop(drop, B, F), _pad(fc, B, F))
    return args, lambda out: tuple(o[:N] for o in out)


def _fixed_decode(full: dict, model, att, cfg, att_mask, fc, drop, uniforms):
    """``static_decode``'s call at the fullest batch of its shapes (``_fixed_teacher_forced``): the
    uniforms (steps, rows) are padded along their rows."""
    B = att.shape[0]
    key = (repr(cfg), tuple(att.shape[1:]), model.training, drop is None, uniforms is None)
    F = full[key] = max(full.get(key, B), B)
    u = None if uniforms is None else _pad(uniforms.t(), B, F).t()
    args = (model, _pad(att, B, F), cfg, _pad(att_mask, B, F), _pad(fc, B, F), _pad_drop(drop, B, F), u)
    return args, lambda d: Decoded(d.tokens[:B], d.logprobs[:B], d.lengths[:B], d.seq_logprob[:B])


def _fixed_rows(full: dict, scorer, tokens, refs):
    """A row-wise score (one number per caption row of ``tokens``, validation's) at the fullest batch."""
    B = tokens.shape[0]
    refs_t, counts = refs if isinstance(refs, tuple) else (refs, None)
    key = (tuple(tokens.shape[1:]), tuple(refs_t.shape[1:]) if isinstance(refs_t, Tensor) else None)
    F = full[key] = max(full.get(key, B), B)
    refs = (_pad(refs_t, B, F), _pad(counts, B, F)) if isinstance(refs, tuple) else refs
    return (scorer, _pad(tokens, B, F), refs), lambda out: (tuple(o[:B] for o in out) if isinstance(out, tuple)
                                                           else out[:B])


class _Compiled:
    """One compiled function of a ``FastPath``: ``compiled`` (torch.compile's, lazy: it compiles at its
    first call per input shape) until the fast path has failed to compile, ``plain`` (the function
    itself) from then on. ``fixed(full, *args)``, where given, pads a partial batch to the fullest of
    its shapes seen so far and takes the real rows back out of the result, so that the last batch of
    an epoch (or of validation) reuses the full batch's graph instead of compiling another. A failure that is a compiler's (``_compile_errors``), or any failure of
    its first ``WARMUP_CALLS`` calls (a CUDA graph is captured at a later call than the compile), goes
    to ``FastPath.fail``; an RdppError is the input's, as eagerly."""

    def __init__(self, owner: FastPath, compiled: Callable, plain: Callable, fixed: Callable | None = None):
        self.owner, self.compiled, self.plain, self.fixed, self.calls = owner, compiled, plain, fixed, 0
        self.full: dict = {}  # the most images seen per the other shapes (``fixed``)

    def __call__(self, *args):
        if self.owner.failed is not None:
            return self.plain(*args)
        self.calls += 1
        unpad = None
        if self.fixed is not None:
            args, unpad = self.fixed(self.full, *args)
        try:
            out = self.compiled(*args)
        except (RdppError, torch.OutOfMemoryError):  # the input's or the device's, as eagerly
            raise
        except Exception as e:
            if isinstance(e, _compile_errors()) or self.calls <= WARMUP_CALLS:
                self.owner.fail(e)
            raise
        return out if unpad is None else unpad(out)
