"""Caption decoding over any model with ``encode / expand / init_state / step``.

Methods (``DecodeConfig.method``):

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

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

METHODS = ("greedy", "beam", "random", "topk", "nucleus", "dbs")

# What each method uses for a setting that is not given, as a function of the config, in this
# order (docs/decoding.md says where each comes from): top-k 10 (Fan et al., 2018, who introduced
# top-k sampling); nucleus p = 0.9 (Holtzman et al., 2020); beam search: n beams, at least 3
# (self-critical.pytorch's n captions by beam search; bw 3 for one caption); diverse beam search:
# one group per caption (self-critical.pytorch's `sample_n_method dbs`) with one beam each
# (Vijayakumar et al.'s G = B), or as many as n needs when one of the two is given; λ = 0.5 (both).
DEFAULTS: dict[str, dict] = {
    "topk": {"top_k": lambda c: 10},
    "nucleus": {"top_p": lambda c: 0.9},
    "beam": {"beam": lambda c: max(c.n, 3)},
    "dbs": {"groups": lambda c: -(-c.n // c.beam) if c.beam else c.n, "beam": lambda c: -(-c.n // max(c.groups, 1))},
}


@dataclass
class DecodeConfig:
    method: str = "greedy"  # greedy | beam | random | topk | nucleus | dbs
    n: int = 1  # captions per image (beam/dbs: the n best of the final beams; n <= beam*groups)
    max_len: int = 16  # most words per caption
    temperature: float = 1.0
    # None = the method's default (DEFAULTS), filled in by check(); unused settings stay None
    top_k: int | None = None
    top_p: float | None = None
    beam: int | None = None  # beams (per group for dbs)
    groups: int | None = None  # dbs groups
    diversity_lambda: float = 0.5
    length_norm: float = 0.0  # beam ranking: score / len**alpha (len counts the EOS)
    unk_id: int | None = None  # a word id never emitted (UNK suppression); None: every word allowed

    def check(self) -> "DecodeConfig":
        """Fill the method's defaults for settings left as None (docs/decoding.md); raise ValueError
        with one clear line when the settings make no sense."""
        if self.method not in METHODS:
            raise ValueError(f"unknown decoding method '{self.method}'; use one of {', '.join(METHODS)}")
        for name, value in DEFAULTS.get(self.method, {}).items():
            if getattr(self, name) is None:
                setattr(self, name, value(self))
        if self.n < 1:
            raise ValueError(f"--n must be at least 1 (got {self.n})")
        if self.max_len < 1:
            raise ValueError(f"--max-len must be at least 1 (got {self.max_len})")
        if self.method in ("random", "topk", "nucleus") and not self.temperature > 0:
            raise ValueError(f"--temperature must be > 0 (got {self.temperature}); use --method greedy for 0")
        if self.method == "topk" and self.top_k < 1:
            raise ValueError(f"--method topk needs --top-k ≥ 1 (got {self.top_k})")
        if self.method == "nucleus" and not 0 < self.top_p <= 1:
            raise ValueError(f"--method nucleus needs 0 < --top-p ≤ 1 (got {self.top_p})")
        if self.method in ("beam", "dbs"):
            groups = self.groups if self.method == "dbs" else 1
            if self.beam < 1 or groups < 1:
                raise ValueError(f"--beam and --groups must be ≥ 1 (got {self.beam}, {groups})")
            width = self.beam * groups
            if self.n > width:
                raise ValueError(f"--n {self.n} is more than the {width} beams of --method {self.method}; "
                                 f"raise --beam{' or --groups' if self.method == 'dbs' else ''} or lower --n")
            if self.length_norm < 0:
                raise ValueError(f"--length-norm must be ≥ 0 (got {self.length_norm})")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Decoded:
    tokens: Tensor  # (B, n, T) int64, 0-padded after the caption, T <= max_len
    logprobs: Tensor  # (B, n, T + 1) per-token log-probs of the words and the EOS (0 where masked)
    lengths: Tensor  # (B, n) number of words (EOS excluded)
    seq_logprob: Tensor  # (B, n) sum of token log-probs including the EOS step


@torch.no_grad()
def decode(model, att: Tensor, cfg: DecodeConfig, att_mask: Tensor | None = None,
           generator: torch.Generator | None = None, drop=None, static: bool = False) -> Decoded:
    """Decode ``cfg.n`` captions for each of the B images of ``att`` (B, R, D).

    The model's mode is left as it is (in train mode its dropout is active). ``generator`` (on the
    model's device) makes sampling reproducible; fresh dropout draws from torch's global RNG.
    ``drop`` (sampling methods only): pre-drawn dropout masks (``Att2in.draw_dropout``: the image's
    att mask and one embedding/output mask per caption row and step) used instead of fresh dropout,
    so that a teacher-forced pass with the same masks gives exactly the log-probs the captions were
    drawn with -- what on-policy RL sampling needs (rdpp_cli.training.finetune).
    ``static`` (greedy and sampling methods): every one of the ``max_len + 1`` steps runs and the
    outputs keep ``max_len`` tokens, so that nothing waits for the device and every shape is fixed
    (the training fast path); the captions are the same (a step after every caption ended adds only
    padding), the outputs just not trimmed.
    """
    cfg.check()
    if drop is not None and cfg.method not in ("random", "topk", "nucleus"):
        raise ValueError(f"dropout masks are for sampling methods, not --method {cfg.method}")
    enc = model.encode(att, att_mask, drop.att) if drop is not None else model.encode(att, att_mask)
    B = att.shape[0]
    if cfg.method in ("beam", "dbs"):
        groups = cfg.groups if cfg.method == "dbs" else 1
        lam = cfg.diversity_lambda if cfg.method == "dbs" else 0.0
        return _beam_search(model, enc, B, cfg, groups, lam)
    if cfg.method == "greedy":  # every copy is the same caption: decode once, repeat
        out = _sample(model, enc, B, 1, cfg, generator, static=static)
        return _repeat(out, cfg.n)
    return _sample(model, model.expand(enc, cfg.n), B, cfg.n, cfg, generator, drop, static)


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


# -- sampling (greedy, random, top-k, nucleus) ----------------------------------------------------

def _draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row of ``probs`` (N, K) (non-negative, any scale), by inverse-CDF sampling.

    The same distribution as ``torch.multinomial(probs, 1)``, ~18× cheaper at 9,488 words on CPU.
    On a GPU, where each kernel launch costs more than the arithmetic, ``torch.multinomial`` itself.
    """
    if probs.device.type != "cpu":
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    cdf = probs.cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return idx.squeeze(1).clamp_(max=probs.shape[-1] - 1)


_NUCLEUS_K = 128  # the nucleus is looked for among the top 128 words first (a full sort is slow)


def _draw_from_prefix(p: Tensor, i: Tensor, top_p: float, generator: torch.Generator | None) -> Tensor:
    """Word ids drawn from the smallest prefix of the descending probabilities ``p`` (ids ``i``)
    that reaches ``top_p`` (never empty)."""
    keep = (p.cumsum(-1) - p) < top_p
    keep[:, 0] = True
    return i.gather(1, _draw(p * keep, generator).unsqueeze(1)).squeeze(1)


def _nucleus(probs: Tensor, top_p: float, generator: torch.Generator | None) -> Tensor:
    """Sample from the smallest set of most probable words whose probability reaches ``top_p``."""
    if probs.device.type != "cpu":  # a full sort is cheap on a GPU; row selection would wait for it
        return _draw_from_prefix(*probs.sort(-1, descending=True), top_p, generator)
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


def _choose(lp: Tensor, cfg: DecodeConfig, generator: torch.Generator | None) -> Tensor:
    """Next word ids (N,) from log-probs lp (N, V+1) by the configured rule."""
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
        return idx.gather(1, _draw(torch.softmax(vals, -1), generator).unsqueeze(1)).squeeze(1)
    probs = torch.softmax(logits, -1)
    if cfg.method == "nucleus" and cfg.top_p < 1:
        return _nucleus(probs, cfg.top_p, generator)
    return _draw(probs, generator)


def _suppress(lp: Tensor, word: int) -> Tensor:
    """``lp`` with ``word`` made impossible (a copy: the caller's log-probs stay the model's)."""
    lp = lp.clone()
    lp[..., word] = float("-inf")
    return lp


def _sample(model, enc, B: int, n: int, cfg: DecodeConfig, generator, drop=None, static: bool = False) -> Decoded:
    N = B * n
    device = _device(model)
    state = model.init_state(N)
    it = torch.zeros(N, dtype=torch.long, device=device)
    done = torch.zeros(N, dtype=torch.bool, device=device)
    tokens = torch.zeros(N, cfg.max_len, dtype=torch.long, device=device)
    logps = torch.zeros(N, cfg.max_len + 1, device=device)
    for t in range(cfg.max_len + 1):
        if drop is None:
            lp, state = model.step(it, enc, state)
        else:
            lp, state = model.step(it, enc, state, (drop.embed[:, t], drop.out[:, t]))
        lp = lp.float()
        it = _choose(lp, cfg, generator) if t < cfg.max_len else torch.zeros_like(it)  # EOS forced at the end
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
    """Batched (diverse) beam search: rows are (image, group, beam); finished beams stay in their
    beam with a frozen score (they can only be extended by padding at no cost).

    Beams are ranked by ``aug``: the sum of log-probs minus the diversity penalties they paid
    (as self-critical.pytorch and Vijayakumar et al.'s code accumulate them), divided by
    ``len ** length_norm``; the log-probs reported are the model's own.
    """
    K, L = cfg.beam, cfg.max_len
    R = G * K
    device = _device(model)
    enc = model.expand(enc, R)
    h, c = model.init_state(B * R)
    it = torch.zeros(B * R, dtype=torch.long, device=device)
    aug = torch.zeros(B, G, K, device=device)  # ranking score: log-probs minus diversity penalties
    aug[:, :, 1:] = float("-inf")  # at t = 0 all beams of a group are the same: keep one
    done = torch.zeros(B, G, K, dtype=torch.bool, device=device)
    length = torch.zeros(B, G, K, device=device)  # tokens so far, the EOS included
    tokens = torch.zeros(B, G, K, L, dtype=torch.long, device=device)
    logps = torch.zeros(B, G, K, L + 1, device=device)  # the model's log-prob of each chosen token
    ar_b = torch.arange(B, device=device)
    for t in range(L + 1):
        lp, (h, c) = model.step(it, enc, (h, c))
        lp = lp.float().view(B, G, K, -1)
        V1 = lp.shape[-1]
        if t == L:  # force the EOS
            lp = torch.cat([lp[..., :1], torch.full_like(lp[..., 1:], float("-inf"))], -1)
        # finished beams continue with padding only, at no cost
        pad = torch.full((V1,), float("-inf"), device=device)
        pad[0] = 0.0
        lp = torch.where(done.unsqueeze(-1), pad, lp)
        norm = torch.where(done, length, length + 1).unsqueeze(-1).pow(cfg.length_norm) if cfg.length_norm else None
        counts = torch.zeros(B, 1, V1, device=device)  # words picked by earlier groups at this step
        parents, words, augs = [], [], []
        choice = _suppress(lp, cfg.unk_id) if cfg.unk_id is not None and t < L else lp
        for g in range(G):
            cand = aug[:, g].unsqueeze(-1) + choice[:, g]  # (B, K, V1)
            if lam and g:
                cand = cand - lam * counts * (~done[:, g]).unsqueeze(-1)
            rank = cand / norm[:, g] if norm is not None else cand
            best = rank.reshape(B, K * V1).topk(K, dim=-1).indices  # (B, K)
            parent, word = best // V1, best % V1
            parents.append(parent)
            words.append(word)
            augs.append(cand.reshape(B, K * V1).gather(1, best))
            if lam and g < G - 1:
                live = (~done[:, g].gather(1, parent)).float()
                counts.scatter_add_(2, word.unsqueeze(1), live.unsqueeze(1))
        parent = torch.stack(parents, 1)  # (B, G, K)
        word = torch.stack(words, 1)
        aug = torch.stack(augs, 1)
        step_lp = lp.view(B, G, K * V1).gather(2, parent * V1 + word)
        was_done = done.gather(2, parent)
        length = length.gather(2, parent) + (~was_done).float()
        tokens = tokens.gather(2, parent.unsqueeze(-1).expand_as(tokens))
        logps = logps.gather(2, parent.unsqueeze(-1).expand_as(logps))
        if t < L:
            tokens[..., t] = word
        logps[..., t] = step_lp.masked_fill(was_done, 0.0)
        done = was_done | (word == 0)
        rows = (parent + torch.arange(G, device=device).view(1, G, 1) * K
                + ar_b.view(B, 1, 1) * R).view(-1)  # the parent's row in the flat state
        h, c = h.index_select(0, rows), c.index_select(0, rows)
        it = word.view(-1)
        if bool(done.all()):
            break
    final = aug / length.clamp(min=1).pow(cfg.length_norm) if cfg.length_norm else aug
    lengths = (tokens > 0).long().cumprod(-1).sum(-1)
    # order: best first within each group; across groups round-robin (best of every group first)
    order = final.argsort(-1, descending=True)  # (B, G, K)
    pick = lambda x: x.gather(2, order.view(B, G, K, *([1] * (x.dim() - 3))).expand_as(x))  # noqa: E731
    tokens, logps, lengths = pick(tokens), pick(logps), pick(lengths)
    tokens = tokens.transpose(1, 2).reshape(B, R, -1)[:, :cfg.n]  # (rank, group) order
    logps = logps.transpose(1, 2).reshape(B, R, -1)[:, :cfg.n]
    lengths = lengths.transpose(1, 2).reshape(B, R)[:, :cfg.n]
    return _pack(tokens, logps, lengths)
