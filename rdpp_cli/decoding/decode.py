"""Caption decoding over any captioner with the ``CaptionModel`` interface (``rdpp_cli.models.base``):
``encode / expand / init_state / step``; the decoding state and the dropout masks are the model's,
untouched here except that beam search reorders the state's rows (``select_rows``).

Methods (``DecodeConfig.method``; the config and its defaults: ``rdpp_cli.decoding.config``):

- ``greedy``   the arg-max word at every step;
- ``random``   multinomial sampling from softmax(log p / temperature);
- ``topk``     sampling among the ``top_k`` most probable words (after temperature);
- ``nucleus``  sampling from the smallest set of words whose probability reaches ``top_p``;
- ``beam``     beam search of width ``beam`` (optionally length-normalised: score / len**alpha);
- ``dbs``      diverse beam search (Vijayakumar et al., 2018): ``groups`` groups of ``beam`` beams;
               at each step group g's candidates lose ``diversity_lambda`` per earlier group that
               chose the same word at that step (Hamming diversity).

Everything is batched over images *and* over the n captions (or beams) of each image: the images
are encoded once and the encoding is shared by the image's rows (``model.expand``), never copied.
Rows of the decoding batch are ordered image-major (row b*n + j is image b); beam search reorders
rows only within an image, so the shared encoding stays valid.

Output layout, shared by all methods (and matching ``sequence_logprobs(model(att, tokens), tokens)``):

- ``tokens``  (B, n, T) word ids, 0-padded after the caption; T = the longest caption in the batch
  (≥ 1, ≤ max_len). Valid as ``seqs`` for ``model.forward``.
- ``logprobs`` (B, n, T + 1): the model's log-probability (temperature 1, no top-k/top-p
  truncation) of each word, and of the EOS at position ``lengths``; 0 elsewhere.
- ``lengths`` (B, n) number of words (EOS excluded).
- ``seq_logprob`` (B, n) = logprobs.sum(-1), the caption's log-probability including its EOS.

A caption that reaches ``max_len`` words is ended there: the EOS is forced at step max_len and its
log-probability counted, so every returned caption is a complete sequence of the model.

UNK suppression (``unk_id``): the word is never chosen, by any method (as self-critical.pytorch's
evaluation decoding with its default ``suppress_UNK``); the log-probabilities reported stay the
model's own. Evaluation callers (``rdpp sample``, ``rdpp caption``, validation) set it from the
vocabulary; RL sampling leaves it None, as the reference's does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rdpp_cli.decoding.config import METHODS, DecodeConfig
from rdpp_cli.models.base import blocked_cumsum, draw_by_cdf, select_rows, static_state

__all__ = ["METHODS", "SAMPLING", "DecodeConfig", "Decoded", "decode", "draw_uniforms", "static_decode"]

SAMPLING = ("random", "topk", "nucleus")


@dataclass
class Decoded:
    tokens: Tensor  # (B, n, T) int64, 0-padded after the caption, T <= max_len
    logprobs: Tensor  # (B, n, T + 1) per-token log-probs of the words and the EOS (0 where masked)
    lengths: Tensor  # (B, n) number of words (EOS excluded)
    seq_logprob: Tensor  # (B, n) sum of token log-probs including the EOS step


@torch.no_grad()
def decode(model, att: Tensor, cfg: DecodeConfig, att_mask: Tensor | None = None,
           generator: torch.Generator | None = None, drop=None, static: bool = False,
           fc: Tensor | None = None, uniforms: Tensor | None = None) -> Decoded:
    """Decode ``cfg.n`` captions for each of the B images of ``att`` (B, R, D) (and their pooled
    features ``fc`` (B, F), read by the models that use them).

    The model's mode is left as it is (in train mode its dropout is active). ``generator`` (on the
    model's device) makes sampling reproducible; fresh dropout draws from torch's global RNG.
    ``drop`` (sampling methods only): pre-drawn dropout masks (``model.draw_dropout``: the image
    masks and those of every caption row and step) used instead of fresh dropout,
    so that a teacher-forced pass with the same masks gives exactly the log-probs the captions were
    drawn with -- what on-policy RL sampling needs (rdpp_cli.training.finetune).
    ``static`` (greedy and sampling methods): every one of the ``max_len + 1`` steps runs and the
    outputs keep ``max_len`` tokens, so that nothing waits for the device and every shape is fixed
    (the training fast path; ``static_decode``); the captions are the same (a step after every
    caption ended adds only padding), the outputs just not trimmed.
    ``uniforms`` (sampling methods): the randomness of the whole pass drawn in advance
    (``draw_uniforms``: (max_len, B*n) uniforms, one per row and step), used for inverse-CDF draws
    on every device instead of drawing from ``generator`` step by step; static decoding draws them
    itself when none are given. On a CPU they are the very numbers the step-by-step draws take from
    the same generator, so the captions are the same either way.
    """
    cfg.check()
    if (drop is not None or uniforms is not None) and cfg.method not in SAMPLING:
        raise ValueError(f"dropout masks and uniforms are for sampling methods, not --method {cfg.method}")
    if static and cfg.method in ("greedy", *SAMPLING):
        if uniforms is None and cfg.method in SAMPLING:
            uniforms = draw_uniforms(att.shape[0] * cfg.n, cfg.max_len, generator, att.device)
        return static_decode(model, att, cfg, att_mask, fc, drop, uniforms)
    enc = model.encode(att, att_mask, fc=fc, drop=drop)
    B = att.shape[0]
    if cfg.method in ("beam", "dbs"):
        groups = cfg.groups if cfg.method == "dbs" else 1
        lam = cfg.diversity_lambda if cfg.method == "dbs" else 0.0
        return _beam_search(model, enc, B, cfg, groups, lam)
    if cfg.method == "greedy":  # every copy is the same caption: decode once, repeat
        out = _sample(model, enc, B, 1, cfg, generator)
        return _repeat(out, cfg.n)
    return _sample(model, model.expand(enc, cfg.n), B, cfg.n, cfg, generator, drop, uniforms)


def draw_uniforms(rows: int, max_len: int, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> Tensor:
    """The randomness of one sampling pass over ``rows`` caption rows, drawn in advance from
    ``generator``: (max_len, rows) float32 uniforms in [0, 1), row t for decoding step t."""
    return torch.rand(max_len, rows, generator=generator, device=device)


@torch.no_grad()
def static_decode(model, att: Tensor, cfg: DecodeConfig, att_mask: Tensor | None = None, fc: Tensor | None = None,
                  drop=None, uniforms: Tensor | None = None) -> Decoded:
    """``decode(static=True)`` for greedy and sampling methods, as one function of tensors: every
    one of the ``max_len + 1`` steps runs with finished rows masked, the randomness is
    ``uniforms`` (``draw_uniforms``), and nothing reads a tensor on the host, so that
    ``torch.compile(static_decode, fullgraph=True)`` captures the whole pass -- encoding, every
    step, the packing -- as one graph (the training fast path, ``rdpp_cli.training.fast``)."""
    B = att.shape[0]
    enc = model.encode(att, att_mask, fc=fc, drop=drop)
    if cfg.method == "greedy":
        return _repeat(_sample(model, enc, B, 1, cfg, None, static=True), cfg.n)
    return _sample(model, model.expand(enc, cfg.n), B, cfg.n, cfg, None, drop, uniforms, static=True)


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


# -- sampling (greedy, random, top-k, nucleus) ----------------------------------------------------

def _draw(probs: Tensor, generator: torch.Generator | None, u: Tensor | None = None) -> Tensor:
    """One index per row of ``probs`` (N, K) (non-negative, any scale), by inverse-CDF sampling
    (``draw_by_cdf``: blocked cumulative sums, so that it compiles at any vocabulary) with the
    uniforms ``u`` (N,) (None: drawn now from ``generator``).

    The same distribution as ``torch.multinomial(probs, 1)``, and cheaper on a CPU
    (benchmarks/README.md, "models_speed.py --what draw", has the figure).
    Without ``u``, on a GPU, where each kernel launch costs more than the arithmetic,
    ``torch.multinomial`` itself.
    """
    if u is None and probs.device.type != "cpu":
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    if u is None:
        u = torch.rand(probs.shape[0], generator=generator, device=probs.device, dtype=probs.dtype)
    return draw_by_cdf(probs, u)


_NUCLEUS_K = 128  # the nucleus is looked for among the top 128 words first (a full sort is slow)


def _draw_from_prefix(p: Tensor, i: Tensor, top_p: float, generator: torch.Generator | None,
                      u: Tensor | None = None) -> Tensor:
    """Word ids drawn from the smallest prefix of the descending probabilities ``p`` (ids ``i``)
    that reaches ``top_p`` (never empty)."""
    keep = (blocked_cumsum(p) - p) < top_p
    keep[:, 0] = True
    return i.gather(1, _draw(p * keep, generator, u).unsqueeze(1)).squeeze(1)


def _nucleus(probs: Tensor, top_p: float, generator: torch.Generator | None, u: Tensor | None = None) -> Tensor:
    """Sample from the smallest set of most probable words whose probability reaches ``top_p``."""
    if probs.device.type != "cpu" or u is not None:  # a full sort; row selection would wait for the device
        return _draw_from_prefix(*probs.sort(-1, descending=True), top_p, generator, u)
    V = probs.shape[-1]
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    sp, si = probs.topk(min(_NUCLEUS_K, V), dim=-1)  # sorted, descending
    beyond = sp.sum(-1) < top_p if sp.shape[-1] < V else torch.zeros_like(out, dtype=torch.bool)
    for rows, full_sort in ((~beyond, False), (beyond, True)):
        if not bool(rows.any()):
            continue
        p, i = probs[rows].sort(-1, descending=True) if full_sort else (sp[rows], si[rows])
        out[rows] = _draw_from_prefix(p, i, top_p, generator)
    return out


def _choose(lp: Tensor, cfg: DecodeConfig, generator: torch.Generator | None, u: Tensor | None = None) -> Tensor:
    """Next word ids (N,) from log-probs lp (N, V+1) by the configured rule (``u`` (N,): this
    step's uniforms, drawn in advance)."""
    if cfg.unk_id is not None:
        lp = _suppress(lp, cfg.unk_id)
    if cfg.method == "greedy":
        return lp.argmax(-1)
    logits = lp / cfg.temperature if cfg.temperature != 1 else lp
    if cfg.method == "topk":
        k = min(cfg.top_k, logits.shape[-1])
        vals, idx = logits.topk(k, dim=-1)
        if k == 1:
            return idx[:, 0]
        return idx.gather(1, _draw(torch.softmax(vals, -1), generator, u).unsqueeze(1)).squeeze(1)
    probs = torch.softmax(logits, -1)
    if cfg.method == "nucleus" and cfg.top_p < 1:
        return _nucleus(probs, cfg.top_p, generator, u)
    return _draw(probs, generator, u)


def _suppress(lp: Tensor, word: int) -> Tensor:
    """``lp`` with ``word`` made impossible (a copy: the caller's log-probs stay the model's)."""
    lp = lp.clone()
    lp[..., word] = float("-inf")
    return lp


def _sample(model, enc, B: int, n: int, cfg: DecodeConfig, generator, drop=None, uniforms: Tensor | None = None,
            static: bool = False) -> Decoded:
    """Greedy or sampling decoding of B*n rows; ``static``: every step runs, nothing waits for the
    device (no early exit when every caption has ended)."""
    N = B * n
    device = _device(model)
    state = static_state(model, N, cfg.max_len + 1) if static else model.init_state(N)  # static: fixed shapes
    it = torch.zeros(N, dtype=torch.long, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    tokens = torch.zeros(N, cfg.max_len, dtype=torch.long, device=device)
    logps = torch.zeros(N, cfg.max_len + 1, device=device)
    for t in range(cfg.max_len + 1):
        lp, state = model.step(it, enc, state, drop.at(t) if drop is not None else None)
        lp = lp.float()
        u = uniforms[t] if uniforms is not None and t < cfg.max_len else None
        it = _choose(lp, cfg, generator, u) if t < cfg.max_len else torch.zeros_like(it)  # EOS forced at the end
        it = it.masked_fill(done, 0)
        logps[:, t] = lp.gather(1, it.unsqueeze(1)).squeeze(1).masked_fill(done, 0.0)
        if t < cfg.max_len:
            tokens[:, t] = it
        done = done | (it == 0)
        if not static and bool(done.all()):
            break
    lengths = (tokens > 0).long().cumprod(1).sum(1)  # words before the first EOS
    return _pack(tokens.view(B, n, -1), logps.view(B, n, -1), lengths.view(B, n), static)


def _pack(tokens: Tensor, logps: Tensor, lengths: Tensor, static: bool = False) -> Decoded:
    """Trim to the longest caption (``static``: keep every column) and zero everything after each
    caption's EOS."""
    if static:
        T = tokens.shape[-1]
    else:
        T = max(int(lengths.max()), 1) if lengths.numel() else 1
    pos = torch.arange(tokens.shape[-1], device=tokens.device)
    tokens = tokens * (pos < lengths.unsqueeze(-1))
    pos1 = torch.arange(logps.shape[-1], device=tokens.device)
    logps = logps * (pos1 <= lengths.unsqueeze(-1))
    tokens, logps = tokens[..., :T].contiguous(), logps[..., :T + 1].contiguous()
    return Decoded(tokens, logps, lengths, logps.sum(-1))


def _repeat(d: Decoded, n: int) -> Decoded:
    if n == 1:
        return d
    return Decoded(*(x.repeat_interleave(n, 1) for x in (d.tokens, d.logprobs, d.lengths, d.seq_logprob)))


# -- beam search and diverse beam search ----------------------------------------------------------

def _beam_search(model, enc, B: int, cfg: DecodeConfig, G: int, lam: float) -> Decoded:
    """Batched (diverse) beam search: rows are (image, group, beam). A beam that ends (picks the
    EOS) is set aside among its group's finished captions and its slot goes to a live continuation,
    as self-critical.pytorch's ``beam_search`` keeps its ``done_beams``; the K best finished
    captions of each group are returned, so no caption found is lost to beams that end lower.

    Beams are ranked by ``aug``: the sum of log-probs minus the diversity penalties they paid
    (as self-critical.pytorch and Vijayakumar et al.'s code accumulate them); finished captions by
    ``aug / len ** length_norm`` (``len`` counting the EOS); the log-probs reported are the model's own.
    """
    K, L = cfg.beam, cfg.max_len
    R = G * K
    device = _device(model)
    enc = model.expand(enc, R)
    state = model.init_state(B * R)
    it = torch.zeros(B * R, dtype=torch.long, device=device)
    beams = _Beams.start(B, G, K, L, device)
    first_row = (torch.arange(G, device=device).view(1, G, 1) * K
                 + torch.arange(B, device=device).view(B, 1, 1) * R)  # of each (image, group) in the flat state
    can_stop = not cfg.length_norm and lam >= 0  # scores only fall: a beam below the K-th finished stays below
    for t in range(L + 1):
        lp, state = model.step(it, enc, state)
        lp = _continuations(lp.float().view(B, G, K, -1), force_eos=t == L)
        choice = _suppress(lp, cfg.unk_id) if cfg.unk_id is not None and t < L else lp
        parent, word = beams.advance(t, lp, choice, cfg.length_norm, lam)
        if beams.settled(can_stop):
            break
        rows = (parent + first_row).view(-1)  # the parent's row in the flat state
        state = select_rows(state, rows)
        it = word.view(-1)
    return beams.best_first(cfg.n)


def _continuations(lp: Tensor, force_eos: bool) -> Tensor:
    """The log-probs (B, G, K, V+1) of each beam's next word: the EOS only at the last step
    (``force_eos``)."""
    if force_eos:
        lp = torch.cat([lp[..., :1], torch.full_like(lp[..., 1:], float("-inf"))], -1)
    return lp


@dataclass
class _Beams:
    """The live beams of every (image, group) -- ranking score, words, log-probs -- and the K best
    finished captions of each (image, group), best first."""

    aug: Tensor  # (B, G, K) ranking score of the live beams: log-probs minus diversity penalties; -inf: none
    tokens: Tensor  # (B, G, K, L)
    logps: Tensor  # (B, G, K, L + 1) the model's log-prob of each chosen token
    fin_score: Tensor  # (B, G, K) finished captions' final score (aug / len**alpha), descending; -inf: none
    fin_tokens: Tensor  # (B, G, K, L)
    fin_logps: Tensor  # (B, G, K, L + 1)
    fin_length: Tensor  # (B, G, K) words (EOS excluded)

    @classmethod
    def start(cls, B: int, G: int, K: int, L: int, device) -> _Beams:
        aug = torch.zeros(B, G, K, device=device)
        aug[:, :, 1:] = float("-inf")  # at t = 0 all beams of a group are the same: keep one
        tokens = torch.zeros(B, G, K, L, dtype=torch.long, device=device)
        logps = torch.zeros(B, G, K, L + 1, device=device)
        return cls(aug, tokens, logps, torch.full_like(aug, float("-inf")), tokens.clone(), logps.clone(),
                   torch.zeros(B, G, K, dtype=torch.long, device=device))

    def advance(self, t: int, lp: Tensor, choice: Tensor, length_norm: float, lam: float) -> tuple[Tensor, Tensor]:
        """Step ``t``: each group keeps its K best continuations (``choice``: the log-probs words are
        chosen by; ``lp``: the model's, recorded) and sets aside those that ended; returns each new
        beam's parent and word (B, G, K)."""
        B, G, K, V1 = lp.shape
        parent, word, aug = _pick(self.aug, choice, lam)
        step_lp = lp.view(B, G, K * V1).gather(2, parent * V1 + word)
        self.tokens = self.tokens.gather(2, parent.unsqueeze(-1).expand_as(self.tokens))
        self.logps = self.logps.gather(2, parent.unsqueeze(-1).expand_as(self.logps))
        if t < self.tokens.shape[-1]:
            self.tokens[..., t] = word
        self.logps[..., t] = step_lp
        ended = (word == 0) & (aug > float("-inf"))
        score = aug / float(t + 1) ** length_norm if length_norm else aug
        self._set_aside(score.masked_fill(~ended, float("-inf")), t)
        self.aug = aug.masked_fill(word == 0, float("-inf"))  # an ended beam is not continued
        return parent, word

    def _set_aside(self, score: Tensor, t: int) -> None:
        """Merge the beams that ended at step ``t`` (``score`` finite) into the K best finished
        captions; ties keep the earlier (shorter) one first, as a stable sort of the peer's list does."""
        K = score.shape[-1]
        if not bool((score > float("-inf")).any()):
            return
        length = torch.full_like(self.fin_length, t)
        both = torch.cat([self.fin_score, score], -1)
        order = both.sort(dim=-1, descending=True, stable=True).indices[..., :K]  # (B, G, K) into 2K
        take = lambda old, new: torch.cat([old, new], 2).gather(  # noqa: E731
            2, order.view(*order.shape, *([1] * (old.dim() - 3))).expand(*order.shape, *old.shape[3:]))
        self.fin_score = both.gather(-1, order)
        self.fin_tokens, self.fin_logps = take(self.fin_tokens, self.tokens), take(self.fin_logps, self.logps)
        self.fin_length = take(self.fin_length, length)

    def settled(self, can_stop: bool) -> bool:
        """No live beam is left, or (``can_stop``: scores can only fall) none scores above its
        group's K-th finished caption, so none can enter the captions returned."""
        best_live = self.aug.max(-1).values
        if not bool((best_live > float("-inf")).any()):
            return True
        return can_stop and bool((best_live < self.fin_score[..., -1]).all())

    def best_first(self, n: int) -> Decoded:
        """The n best finished captions per image: best first within each group; across groups
        round-robin (the best of every group first)."""
        B, G, K = self.fin_score.shape
        tokens = self.fin_tokens.transpose(1, 2).reshape(B, G * K, -1)[:, :n]  # (rank, group) order
        logps = self.fin_logps.transpose(1, 2).reshape(B, G * K, -1)[:, :n]
        lengths = self.fin_length.transpose(1, 2).reshape(B, G * K)[:, :n]
        return _pack(tokens, logps, lengths)


def _pick(aug: Tensor, choice: Tensor, lam: float) -> tuple[Tensor, Tensor, Tensor]:
    """Each group's K best continuations, group by group: a word earlier groups' beams chose at this
    step costs ``lam`` per beam (Hamming diversity). Returns parent, word and new score (B, G, K)."""
    B, G, K, V1 = choice.shape
    counts = torch.zeros(B, 1, V1, device=choice.device)  # words picked by earlier groups at this step
    parents, words, augs = [], [], []
    for g in range(G):
        cand = aug[:, g].unsqueeze(-1) + choice[:, g]  # (B, K, V1)
        if lam and g:
            cand = cand - lam * counts
        best = cand.reshape(B, K * V1).topk(K, dim=-1)
        parent, word = best.indices // V1, best.indices % V1
        parents.append(parent)
        words.append(word)
        augs.append(best.values)
        if lam and g < G - 1:
            live = (best.values > float("-inf")).float()
            counts.scatter_add_(2, word.unsqueeze(1), live.unsqueeze(1))
    return torch.stack(parents, 1), torch.stack(words, 1), torch.stack(augs, 1)
