"""What every rdpp captioner offers the stages: the ``CaptionModel`` interface and its shared parts.

A captioner is an ``nn.Module`` built from one config dataclass (``model.config``: ``vocab_size``,
``seq_length``, ``att_feat_size`` at least) that decodes a word at a time and scores whole captions
by teacher forcing. Decoding (``rdpp_cli.decoding.decode``), the XE and RL steps
(``rdpp_cli.training``) and ``rdpp caption`` see only these methods, so a new model is its file,
one line in ``rdpp_cli.models.registry`` and its tests (CONTRIBUTING.md, "A new model"):

- ``encode(att, att_mask=None, fc=None, drop=None) -> enc``: the images prepared once (B images);
  what ``enc`` holds is the model's own business. ``fc`` (B, F): the pooled features, for models
  whose ``uses_fc`` is True (others ignore them). ``drop``: pre-drawn dropout masks (below).
- ``expand(enc, n) -> enc``: each image serving ``n`` rows (row ``b*n + j`` is image b), with no
  copy where the model can avoid one.
- ``init_state(rows) -> state``: the decoding state of ``rows`` rows, a tuple (nested tuples
  allowed) of tensors whose first dimension is the row. Nothing else may be in it: beam search
  reorders the rows of every tensor in it (``select_rows``), whatever the model keeps there (LSTM
  states, a key/value cache).
- ``step(it, enc, state, drop=None) -> (logprobs, state)``: feed word ids ``it`` (N,) (0 = BOS at
  the first step) and get float32-able log-probs (N, V+1) of the next word (0 = EOS). ``drop``:
  this step's masks, ``DropoutMasks.at(t)``.
- ``token_logprobs(att, seqs, att_mask=None, drop=None, fc=None) -> (token_logp, mask)``: the
  log-prob of every token of ``seqs`` (N, L) (B, n, L), then the EOS, under teacher forcing:
  both (N, L+1), as ``sequence_logprobs(model(att, seqs), seqs)``; ``forward`` gives the full
  (N, L+1, V+1) log-probs.
- ``draw_dropout(batch, rows, steps, regions, generator=None) -> DropoutMasks``: every dropout
  mask a sampling pass of ``steps`` steps over ``rows`` caption rows of ``batch`` images would draw,
  drawn in advance; passed to ``encode``/``step`` while sampling and to ``token_logprobs`` after,
  the two passes see the same dropout, so the log-probs that carry the policy gradient are those
  the captions were drawn with (on-policy RL).

Class attributes (in the Protocol): ``uses_fc`` (whether ``encode`` reads ``fc``) and
``supports_fast`` (whether the training fast path, ``rdpp_cli.training.fast``, can compile it).

Optional capabilities, looked up by name
----------------------------------------
Beyond the Protocol, the stages look a few methods and config fields up by name (``getattr`` /
``hasattr``); a model that lacks one gets the fallback said here. This list is the whole set: a
new lookup on a model belongs here too (CONTRIBUTING.md, "A new model").

The fast path (``supports_fast = True`` promises the first two; ``training.fast.run_steps`` reads
``supports_fast`` with ``getattr(..., False)``: absent or False, ``--fast auto`` is off and
``--fast on`` is refused in one line):

- ``static_token_logprobs(att, seqs, att_mask=None, drop=None, fc=None)``: ``token_logprobs``
  with every shape fixed by the inputs' (all L+1 steps run, nothing waits for the device); its
  dropout comes drawn in advance (``draw_dropout``), as the RL step's does. The fast path compiles
  it; ``precision_probe.probe_step`` times it for ``--precision auto`` when the run's ``--fast`` is on and
  the model has it (``hasattr``), else the eager ``token_logprobs``.
- the data's words as its ids (no ``bridge`` of its own): the fast reward scores the ids as words
  (``training.fast.run_steps`` refuses a model that claims ``supports_fast`` with a bridge).
- ``init_static_state(rows, steps) -> state``: a decoding state whose tensors keep their shapes
  for ``steps`` steps (the Transformer's ``StaticKV``: a preallocated key/value cache, written at
  each row's position), so that a compiled or captured sampling loop calls ``step`` with the same
  shapes at every step. Looked up by ``static_state`` below; absent: ``init_state``, which must then
  be fixed-size already (the LSTM models').
- ``traceable_dropout(drop, batch, regions) -> DropoutMasks``: ``drop`` with anything a compiled
  region cannot read (a generator's seed) drawn out into masks now. Looked up by
  ``traceable_dropout`` below; absent: ``drop`` as it is.

A model with a vocabulary of its own (a tokenizer's, as ``models.hf``):

- ``bridge(words, data_seq_length) -> bridge``: the two-way map between the model's token ids and
  the data's words (``models.bridge.bridge_for``, used by the training loop, the RL reward,
  validation and ``rdpp sample``/``caption``). Absent: ``WordBridge``, the model's ids are the
  data's word ids. Its presence also tells ``checkpoint.own_vocabulary`` that the checkpoint's
  ``vocab`` is the data's words, not the model's output ids.
- ``export(out, encoder_folder)``: writes the model back in its library's own format
  (``captioning.export_hf``, ``rdpp export-hf``). Absent: ``rdpp export-hf`` refuses the model in
  one line. It reads ``config.source`` (the folder the model was read from) when ``--hf-model``
  is not given.

A pretrained model read from a folder instead of built from sizes:

- ``from_folder(folder, data_seq_length=...)`` (a classmethod): called by
  ``training.xe.folder_model`` when the model's registry line names a ``folder_option`` (the
  ``train-xe`` option holding the folder, declared in ``training/options.py``). Absent (no
  ``folder_option``): the model is built from its registry sizes.
- ``max_decode_len``: the most tokens its decoder can position after the start token (a Hugging
  Face decoder's positions less one); ``rdpp sample`` and ``rdpp caption`` refuse a ``--max-len``
  beyond it in one line (``decoding.sample.Decoder.decode_config``). Absent: no limit.

Config fields read by name besides ``vocab_size``, ``seq_length`` and ``att_feat_size``:

- ``config.d_model``: the Noam schedule's scale (``training.loop``); a model without it refuses
  ``--lr-schedule noam`` in one line.
- ``config.fc_feat_size``: the pooled features' size for the precision probe's batch
  (``precision.ProbeShape.of``; absent: 2048).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class CaptionModel(Protocol):
    """The interface of the module docstring (``isinstance(model, CaptionModel)`` checks the names)."""

    config: Any
    uses_fc: bool
    supports_fast: bool

    def encode(self, att: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
               drop: "DropoutMasks | None" = None) -> Any: ...

    def expand(self, enc: Any, n: int) -> Any: ...

    def init_state(self, rows: int) -> tuple: ...

    def step(self, it: Tensor, enc: Any, state: tuple, drop: dict[str, Tensor] | None = None
             ) -> tuple[Tensor, tuple]: ...

    def token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: "DropoutMasks | None" = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]: ...

    def draw_dropout(self, batch: int, rows: int, steps: int, regions: int,
                     generator: torch.Generator | None = None) -> "DropoutMasks": ...


def select_rows(state: Any, rows: Tensor) -> Any:
    """``state`` with every tensor's rows (first dimension) taken at ``rows``: how beam search
    follows each beam's parent, for any model's state (tensors in nested tuples/lists)."""
    if isinstance(state, Tensor):
        return state.index_select(0, rows)
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a named state (e.g. transformer.StaticKV)
        return type(state)(*(select_rows(s, rows) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(select_rows(s, rows) for s in state)
    if state is None:
        return None
    raise TypeError(f"a decoding state holds tensors in tuples, not {type(state).__name__}")


@dataclass
class DropoutMasks:
    """Dropout drawn in advance (kept entries 1/(1-p), dropped 0; or bool masks a model scales
    itself), named by the model that draws them.

    ``image``: masks per image (B, ...), used by ``encode``; ``row``: masks per caption row and
    step (N, S, ...), step ``t``'s slice used by ``step`` (``at(t)``) and all of them by the
    teacher-forced pass. Attribute access reads either (``masks.att``, ``masks.embed``)."""

    image: dict[str, Tensor] = field(default_factory=dict)
    row: dict[str, Tensor] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Tensor:
        for part in ("image", "row"):
            d = self.__dict__.get(part, {})
            if name in d:
                return d[name]
        raise AttributeError(name)

    @property
    def steps(self) -> int:
        """Steps the row masks cover (0 without row masks)."""
        return next(iter(self.row.values())).shape[1] if self.row else 0

    def at(self, t: int) -> dict[str, Tensor]:
        """Step ``t``'s row masks (N, ...), each a tensor of its own (contiguous)."""
        return {k: v[:, t].contiguous() for k, v in self.row.items()}

    def rows(self, index: Tensor) -> "DropoutMasks":
        """The masks of caption rows ``index`` (the image masks are kept)."""
        return DropoutMasks(dict(self.image), {k: v[index] for k, v in self.row.items()})

    def with_rows_before(self, first: "DropoutMasks", images: int) -> "DropoutMasks":
        """Per image b: ``first``'s rows of image b, then these rows of image b (``first`` and
        these masks each hold ``images`` × their own rows-per-image rows, image-major); the image
        masks are these. Both must cover the same steps. (XE+λCIDEr: references, then samples.)"""
        def interleave(a: Tensor, b: Tensor) -> Tensor:
            return torch.cat([a.view(images, -1, *a.shape[1:]), b.view(images, -1, *b.shape[1:])], 1).flatten(0, 1)

        return DropoutMasks(dict(self.image), {k: interleave(first.row[k], v) for k, v in self.row.items()})


def bernoulli_masks(like: Tensor, p: float, shapes: dict[str, tuple[int, ...]],
                    generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Inverted-dropout masks of the given shapes for dropout probability ``p``, on ``like``'s
    device and dtype, drawn in the dict's order from ``generator`` (all ones when ``p`` is 0)."""
    keep = 1.0 - p
    out = {}
    for name, shape in shapes.items():
        out[name] = (like.new_ones(shape) if keep >= 1.0
                     else like.new_empty(shape).bernoulli_(keep, generator=generator).div_(keep))
    return out


def targets(seqs: Tensor) -> tuple[Tensor, Tensor]:
    """Targets (N, L+1) = seqs then EOS, and the bool mask of tokens up to and including the first EOS."""
    target = torch.cat([seqs, seqs.new_zeros(seqs.shape[0], 1)], 1)
    is_eos = (target == 0).to(torch.int32)
    return target, (is_eos.cumsum(1) - is_eos) == 0  # no EOS strictly before t


def sequence_logprobs(logprobs: Tensor, seqs: Tensor) -> tuple[Tensor, Tensor]:
    """(token_logp, mask), both (N, L+1), of ``seqs`` (N, L, 0-padded) followed by EOS under
    logprobs (N, L+1, V+1) from a model's ``forward``: the mask covers every token up to and
    including the first EOS (counted once; padding never), and token_logp is 0 where the mask is 0."""
    target, mask = targets(seqs.reshape(-1, seqs.shape[-1]))
    logp = logprobs.gather(2, target.unsqueeze(2).long()).squeeze(2)
    mask = mask.to(logp.dtype)
    return logp * mask, mask


def stepwise_logprobs(model, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
                      feed=None) -> Tensor:
    """Log-probs (N, L+1, V+1) of ``seqs`` (N, L) or (B, n, L) computed a step at a time through
    ``encode``/``step`` (fresh dropout in train mode): what ``forward`` computes in one pass, and
    the form scheduled sampling needs. ``feed(t, inputs_t, previous_logprobs) -> inputs_t``, when
    given, may replace the word fed at step t ≥ 1 (scheduled sampling feeds the model's own)."""
    seqs = seqs.reshape(-1, seqs.shape[-1])
    N, L = seqs.shape
    B = att.shape[0]
    if N % B:
        raise ValueError(f"{N} captions for {B} images: each image needs the same number of captions")
    enc = model.expand(model.encode(att, att_mask, fc=fc), N // B)
    state = model.init_state(N)
    inputs = torch.cat([seqs.new_zeros(N, 1), seqs], 1)
    out = []
    for t in range(L + 1):
        it = inputs[:, t]
        if feed is not None and t >= 1:
            it = feed(t, it, out[-1])
        lp, state = model.step(it, enc, state)
        out.append(lp)
    return torch.stack(out, 1)


def static_state(model, rows: int, steps: int) -> tuple:
    """A decoding state of ``rows`` rows that keeps its shapes for ``steps`` steps of ``model.step``
    (``init_static_state`` where the model has one, else ``init_state``, fixed-size already)."""
    init = getattr(model, "init_static_state", None)
    return init(rows, steps) if init is not None else model.init_state(rows)


def traceable_dropout(model, drop: "DropoutMasks | None", batch: int, regions: int) -> "DropoutMasks | None":
    """``drop`` as a compiled pass can read it (``model.traceable_dropout`` where the model has one)."""
    fn = getattr(model, "traceable_dropout", None)
    return drop if drop is None or fn is None else fn(drop, batch, regions)


SCAN_BLOCK = 128  # blocked_cumsum's block: both of its scans stay short for any vocabulary


def blocked_cumsum(x: Tensor, block: int = SCAN_BLOCK) -> Tensor:
    """``x.cumsum(-1)`` for ``x`` (N, K), taken as two short scans: within blocks of ``block``
    columns (the last one padded with zeros), then over the blocks' totals, added back as each
    block's offset. The same sums up to float rounding, and still non-decreasing where ``x`` is
    non-negative (each block starts from the running total the previous one ended on). Inductor
    lowers a scan over a whole 9,488-word row to a split scan whose Triton code it cannot generate;
    scans of at most ``block`` (and K / block) elements it lowers as plain ones."""
    return _padded_cumsum(x, block)[:, :x.shape[-1]]


def _padded_cumsum(x: Tensor, block: int = SCAN_BLOCK) -> Tensor:
    """``blocked_cumsum`` before the padding is cut off: (N, a multiple of ``block`` >= K), the
    padded columns holding the row's total."""
    N, K = x.shape
    if K <= block:
        return x.cumsum(-1)
    nb = -(-K // block)
    inner = torch.nn.functional.pad(x, (0, nb * block - K)).view(N, nb, block).cumsum(-1)
    ends = inner[..., -1].cumsum(-1)  # the running total at the end of each block
    offset = torch.nn.functional.pad(ends[:, :-1], (1, 0))  # ... at its start
    return (inner + offset.unsqueeze(-1)).view(N, nb * block)


def draw_by_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """One index per row of ``probs`` (N, K) (non-negative, any scale) from uniforms ``u`` (N,) in
    [0, 1): the first index whose cumulative probability passes ``u`` of the row's total (inverse-CDF
    sampling: ``torch.multinomial``'s distribution, with the randomness drawn beforehand). The
    cumulative sums are ``blocked_cumsum``'s, so the draw compiles at any vocabulary. An index of
    probability 0 is never drawn: where the target reaches the total (u = 1, or rounding), the draw
    is the last index of positive probability, the first where the sums reach the total (adding a 0
    leaves a float sum as it is)."""
    cdf = _padded_cumsum(probs)
    total = cdf[:, -1:].contiguous()
    target = u.to(cdf.dtype).unsqueeze(1) * total
    if torch.compiler.is_compiling():
        # the same indices as counts (the sums never decrease: searchsorted(cdf, t, right=True) is the
        # number of sums <= t), a plain reduction every backend lowers; inductor's CUDA lowering of
        # searchsorted refuses the blocked sums (a view) with "NotImplementedError: View". Eager keeps
        # searchsorted, many times cheaper on a CPU than two passes of comparisons.
        idx, last = (cdf <= target).sum(-1), (cdf < total).sum(-1)
    else:
        idx, last = torch.searchsorted(cdf, target, right=True)[:, 0], torch.searchsorted(cdf, total)[:, 0]
    return torch.minimum(idx, last)  # last: the last index of positive probability


def scheduled_logprobs(model, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
                       drop: DropoutMasks | None = None, use: Tensor | None = None,
                       uniforms: Tensor | None = None) -> Tensor:
    """Log-probs (N, L+1, V+1) of ``seqs`` (N, L) or (B, n, L) under scheduled sampling, a step at a
    time through ``encode``/``step`` with a fixed-size state (``static_state``) and every random
    number drawn beforehand, so that the pass has fixed shapes and no host wait (compilable) and is
    a function of its inputs: ``drop`` the dropout masks (``draw_dropout``, N rows, ≥ L+1 steps; None:
    the mode's own dropout), ``use`` (N, L) bool whether step t+1 is fed the model's own word instead of
    the reference's, drawn (``draw_by_cdf``) from step t's distribution with ``uniforms[:, t]``.
    ``use`` None: the references throughout (teacher forcing, a step at a time)."""
    seqs = seqs.reshape(-1, seqs.shape[-1])
    (N, L), B = seqs.shape, att.shape[0]
    if N % B:
        raise ValueError(f"{N} captions for {B} images: each image needs the same number of captions")
    enc = model.expand(model.encode(att, att_mask, fc=fc, drop=drop), N // B)
    state = static_state(model, N, L + 1)
    it, out = seqs.new_zeros(N), []
    for t in range(L + 1):
        if t >= 1:
            it = seqs[:, t - 1]
            if use is not None:
                own = draw_by_cdf(out[-1].detach().float().exp(), uniforms[:, t - 1])
                it = torch.where(use[:, t - 1], own, it)
        lp, state = model.step(it, enc, state, drop.at(t) if drop is not None else None)
        out.append(lp)
    return torch.stack(out, 1)
