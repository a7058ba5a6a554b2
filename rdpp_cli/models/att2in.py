"""Att2in: the image captioner of Rennie et al., "Self-critical Sequence Training" (CVPR 2017).

An LSTM captioner with soft attention over a grid (or set) of image regions. What makes it "Att2in":
the attention context enters *only* the LSTM's cell input (the "in" transform), not the gates and
not the LSTM input, which is the word embedding alone. This file follows the core of
self-critical.pytorch's ``Att2in2Model`` (the variant used by Wang & Chan's R-DPP code):

    a_i   = Dropout(ReLU(W_a att_i))                      att features embedded to rnn_size  (att_embed)
    k_i   = W_k a_i                                       attention keys, once per image     (ctx2att)
    x_t   = Dropout(ReLU(E[w_{t-1}]))                     word embedding, w_{-1} = 0 (BOS)   (embed)
    e_ti  = w_α · tanh(k_i + W_q h_{t-1}) + b_α           scores queried by previous h       (h2att, alpha_net)
    α_t   = softmax_i(e_ti)   (masked when att_mask)
    z_t   = Σ_i α_ti a_i                                  attention context
    s     = W_x x_t + W_h h_{t-1}                         5·rnn_size pre-activations          (i2h, h2h)
    i, f, o = σ(s[:3H])
    g     = max(s[3H:4H] + W_z1 z_t, s[4H:5H] + W_z2 z_t)  maxout "in" transform with the context (a2c)
    c_t   = f ⊙ c_{t-1} + i ⊙ g ;  h_t = o ⊙ tanh(c_t)
    p(w_t) = log_softmax(W_o Dropout(h_t))                 over vocab_size + 1 words, 0 = EOS   (logit)

Word id 0 is both the BOS input and the EOS output. ``fc`` (pooled) features are not used by Att2in
(self-critical.pytorch's Att2in2 sets ``fc_embed`` to the identity and never reads it); the config
keeps ``fc_feat_size`` so checkpoints record the data they were made for and every model of the
toolkit takes the same ``(fc, att)`` inputs.

Speed (see docs/model.md): the keys are computed once per image and *shared* by the image's n
captions through broadcasting ``(B, 1, R, A) + (B, n, 1, A)``; the word-embedding half of the LSTM
pre-activation is one matmul for all time steps; the output layer and its log-softmax run once over
all time steps stacked after the loop; the attention scores are computed a few images at a time
(cache-sized tanh blocks) and their backward recomputes ``tanh`` instead of storing it. The
arithmetic is the same as the step-by-step reference.

Under bf16/fp16 autocast (``--precision``, rdpp_cli.precision) the linear layers and the
attention context run in the low precision; the attention keys and scores, the LSTM cell state and
every log-softmax stay float32 (in bf16 the scores were slower on CPU and 100x less accurate), so
log-probabilities are always float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Att2inConfig:
    vocab_size: int  # number of words V; logits have V + 1 entries (0 = EOS)
    input_encoding_size: int = 512  # word embedding size
    rnn_size: int = 512  # LSTM hidden size (also the embedded att feature size)
    att_hid_size: int = 512  # attention hidden size
    fc_feat_size: int = 2048  # recorded, unused by Att2in
    att_feat_size: int = 2048
    drop_prob_lm: float = 0.5
    seq_length: int = 16  # default maximum caption length (words)


PRESETS: dict[str, dict] = {
    # the paper's (and self-critical.pytorch's) sizes
    "paper": dict(input_encoding_size=512, rnn_size=512, att_hid_size=512, drop_prob_lm=0.5),
    # for CPU runs on the bundled synthetic set
    "small": dict(input_encoding_size=256, rnn_size=256, att_hid_size=256, drop_prob_lm=0.3),
}


def config_from_preset(preset: str, vocab_size: int, fc_feat_size: int, att_feat_size: int,
                       seq_length: int, **overrides) -> Att2inConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    kw = dict(PRESETS[preset], vocab_size=vocab_size, fc_feat_size=fc_feat_size,
              att_feat_size=att_feat_size, seq_length=seq_length)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return Att2inConfig(**kw)


class Encoded(NamedTuple):
    """Images prepared once for decoding: rows of the LSTM state map to images by ``row // per_image``."""

    att: Tensor  # (B, R, H) embedded att features
    keys: Tensor  # (B, R, A) attention keys, stored doubled: 2 · ctx2att(att)
    mask: Tensor | None  # (B, R) 1 = real region, or None
    per_image: int = 1  # LSTM rows per image (set by Att2in.expand)


class DropoutMasks(NamedTuple):
    """Dropout drawn in advance (kept entries hold 1/(1-p), dropped ones 0), so that two passes over
    the same captions -- the sampling loop and the teacher-forced pass that carries the policy
    gradient -- see the very same dropout: the log-probabilities in the loss are then exactly those
    the captions were drawn from (on-policy). Made by :meth:`Att2in.draw_dropout`.

    ``att`` (B, R, H): the embedded att features of each image (shared by its rows, as an image is
    encoded once); ``embed`` (N, S, E) and ``out`` (N, S, H): the word embedding fed at step t and
    the LSTM output at step t of each caption row, for S steps.
    """

    att: Tensor
    embed: Tensor
    out: Tensor

    def rows(self, index: Tensor) -> "DropoutMasks":
        """The masks of caption rows ``index`` (the att masks are per image and kept)."""
        return self._replace(embed=self.embed[index], out=self.out[index])


def _f32(x: Tensor) -> Tensor:
    """x in float32 if autocast made it bfloat16/float16; float32 and float64 are kept."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


_CHUNK = 1 << 19  # elements of a (b, n, R, A) block: ~2 MB, stays in cache


def _chunks(per_image: int, x: Tensor) -> int:
    """Images per block: cache-sized on the CPU; on a GPU one block (a kernel per image would make
    the launches, not the arithmetic, the cost: 4x slower than the plain expression on an H200)."""
    if x.device.type != "cpu":
        return x.shape[0]
    return max(1, _CHUNK // per_image)


# The attention scores  e[b, j, r] = w · tanh(k[b, r] + q[b, j])  for keys k (B, R, A), queries
# q (B, n, A), w (A,) are the model's hottest spot (B·n·R·A = 25M tanh per step at COCO shapes).
# Two things make them ~3× faster on CPU than the one-line expression, with the same function:
#   - tanh(u) = 2σ(2u) − 1, so  e = 2 (σ(2k + 2q) @ w) − Σw  (torch's sigmoid is ~3.5× cheaper
#     than its tanh; the difference is float rounding, ~1e-7);
#   - a few images at a time, so the (b, n, R, A) block stays in cache (on a GPU, all images in one
#     block); backward recomputes the block instead of keeping a 100 MB tensor alive for every time step.
# ``k2`` below is 2k (computed once per image batch), ``q`` the raw query.


def _att_scores(k2: Tensor, q: Tensor, w: Tensor) -> Tensor:
    B, R, A = k2.shape
    n = q.shape[1]
    out = q.new_empty(B, n, R)
    c = _chunks(n * R * A, k2)
    q2 = q * 2.0
    buf = k2.new_empty(min(c, B), n, R, A)  # one block, reused: a fresh 2 MB tensor per block costs page faults
    for i in range(0, B, c):
        sig = buf[:min(c, B - i)]
        torch.add(k2[i:i + c].unsqueeze(1), q2[i:i + c].unsqueeze(2), out=sig).sigmoid_()  # (c, n, R, A)
        torch.matmul(sig, w, out=out[i:i + c])
    return out.mul_(2.0).sub_(w.sum())


class _AttScores(torch.autograd.Function):
    """``_att_scores`` with its gradient (inputs k2 = 2k, q, w)."""

    @staticmethod
    def forward(ctx, k2: Tensor, q: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(k2, q, w)
        return _att_scores(k2, q, w)

    @staticmethod
    def backward(ctx, g: Tensor):
        k2, q, w = ctx.saved_tensors
        B, R, A = k2.shape
        n = q.shape[1]
        gk, gq, gw = torch.empty_like(k2), torch.empty_like(q), torch.zeros_like(w)
        w4 = 4.0 * w
        c = _chunks(n * R * A, k2)
        q2 = q * 2.0
        bufs = k2.new_empty(2, min(c, B), n, R, A)  # σ and its gradient, reused block after block
        for i in range(0, B, c):
            m = min(c, B - i)
            sig, d = bufs[0, :m], bufs[1, :m]
            torch.add(k2[i:i + c].unsqueeze(1), q2[i:i + c].unsqueeze(2), out=sig).sigmoid_()
            gc = g[i:i + c]
            gw += gc.reshape(1, -1).mm(sig.reshape(-1, A)).view(A)  # Σ g σ (then ×2 − Σg below)
            # d e / d u = w (1 − tanh²u) = 4 w σ (1 − σ)
            torch.mul(gc.unsqueeze(-1), w4, out=d)
            torch.ops.aten.sigmoid_backward.grad_input(d, sig, grad_input=d)
            torch.sum(d, 1, out=gk[i:i + c])  # gradient w.r.t. k2 is half of this: see below
            torch.sum(d, 2, out=gq[i:i + c])
        gw.mul_(2.0).sub_(g.sum())
        return gk.mul_(0.5), gq, gw


class Att2in(nn.Module):
    def __init__(self, config: Att2inConfig):
        super().__init__()
        self.config = c = config
        H, A, E = c.rnn_size, c.att_hid_size, c.input_encoding_size
        self.embed = nn.Embedding(c.vocab_size + 1, E)  # + ReLU + dropout
        self.att_embed = nn.Linear(c.att_feat_size, H)  # + ReLU + dropout
        self.ctx2att = nn.Linear(H, A)
        self.h2att = nn.Linear(H, A)
        self.alpha_net = nn.Linear(A, 1)
        self.i2h = nn.Linear(E, 5 * H)
        self.h2h = nn.Linear(H, 5 * H)
        self.a2c = nn.Linear(H, 2 * H)
        self.logit = nn.Linear(H, c.vocab_size + 1)
        self.dropout = nn.Dropout(c.drop_prob_lm)

    # -- images ------------------------------------------------------------------------------
    def encode(self, fc: Tensor | None, att: Tensor, att_mask: Tensor | None = None,
               drop: Tensor | None = None) -> Encoded:
        """Embed the att features and precompute the attention keys, once per image (fc is unused).
        ``drop`` (B, R, H): a pre-drawn dropout mask (``DropoutMasks.att``) instead of fresh dropout."""
        a = F.relu(self.att_embed(att))
        a = a * drop if drop is not None else self.dropout(a)
        if att_mask is not None:
            att_mask = att_mask.to(a.dtype)
        # keys doubled (see _att_scores) and kept in float32 under autocast: see _attend
        return Encoded(a, 2.0 * _f32(self.ctx2att(a)), att_mask, 1)

    @staticmethod
    def expand(enc: Encoded, n: int) -> Encoded:
        """Each image repeated n times (row b*n + j is image b); a view, nothing is copied."""
        return enc._replace(per_image=enc.per_image * n)

    def init_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        w = self.h2h.weight
        z = w.new_zeros(batch_size, self.config.rnn_size)
        return z, z.clone()

    def draw_dropout(self, batch: int, rows: int, steps: int, regions: int,
                     generator: torch.Generator | None = None) -> DropoutMasks:
        """Dropout masks for ``batch`` images of ``regions`` att regions and ``rows`` caption rows of
        ``steps`` steps, drawn from ``generator`` with this model's dropout probability."""
        w = self.h2h.weight
        keep = 1.0 - self.config.drop_prob_lm
        c = self.config

        def draw(*shape: int) -> Tensor:
            if keep >= 1.0:
                return w.new_ones(shape)
            return w.new_empty(shape).bernoulli_(keep, generator=generator).div_(keep)

        return DropoutMasks(draw(batch, regions, c.rnn_size), draw(rows, steps, c.input_encoding_size),
                            draw(rows, steps, c.rnn_size))

    # -- one LSTM step -----------------------------------------------------------------------
    def _attend(self, h: Tensor, enc: Encoded, q: Tensor) -> Tensor:
        """Attention context (N, H) for hidden states h (N, H) with projected queries q (N, A)."""
        B, R, H = enc.att.shape
        n = h.shape[0] // B
        q = _f32(q.view(B, n, -1))  # under bf16 autocast the scores stay float32 (docs/training.md)
        w = self.alpha_net.weight[0]
        k2 = enc.keys
        if torch.is_grad_enabled() and (q.requires_grad or k2.requires_grad or w.requires_grad):
            scores = _AttScores.apply(k2, q, w)
        else:
            scores = _att_scores(k2, q, w)
        scores = scores + self.alpha_net.bias  # (B, n, R)
        weight = F.softmax(scores, dim=-1)
        if enc.mask is not None:  # as the reference: zero the padding, renormalise
            weight = weight * enc.mask.unsqueeze(1)
            weight = weight / weight.sum(-1, keepdim=True)
        return torch.bmm(weight, enc.att).view(B * n, H)  # (B, n, R) @ (B, R, H)

    def _cell(self, x_proj: Tensor, enc: Encoded, state: tuple[Tensor, Tensor], w_hq: Tensor,
              b_hq: Tensor) -> tuple[Tensor, Tensor]:
        """One step given the input's i2h projection x_proj (N, 5H); returns (h, c)."""
        h, c = state
        H = self.config.rnn_size
        # (split/chunk rather than slicing: their backward concatenates instead of filling zeros)
        hh, q = F.linear(h, w_hq, b_hq).split([5 * H, w_hq.shape[0] - 5 * H], 1)  # h2h, h2att in one matmul
        z = self._attend(h, enc, q)
        s_gates, s_in = (x_proj + hh).split([3 * H, 2 * H], 1)
        i, f, o = torch.sigmoid(s_gates).chunk(3, 1)
        g1, g2 = (s_in + self.a2c(z)).chunk(2, 1)
        g = torch.maximum(g1, g2)  # maxout
        c = f * c + i * g
        h = o * torch.tanh(c)
        return h, c

    def _hq(self) -> tuple[Tensor, Tensor]:
        return (torch.cat([self.h2h.weight, self.h2att.weight], 0),
                torch.cat([self.h2h.bias, self.h2att.bias], 0))

    def step(self, it: Tensor, enc: Encoded, state: tuple[Tensor, Tensor],
             drop: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Feed word ids ``it`` (N,) (0 = BOS); returns log-probs (N, V + 1) of the next word and the state.
        ``drop``: this step's pre-drawn (embedding, output) dropout masks instead of fresh dropout."""
        x = F.relu(self.embed(it))
        x = x * drop[0] if drop is not None else self.dropout(x)
        h, c = self._cell(self.i2h(x), enc, state, *self._hq())
        o = h * drop[1] if drop is not None else self.dropout(h)
        logprobs = F.log_softmax(_f32(self.logit(o)), dim=-1)
        return logprobs, (h, c)

    # -- teacher forcing -----------------------------------------------------------------------
    def _hidden(self, fc: Tensor | None, att: Tensor, inputs: Tensor, att_mask: Tensor | None,
                drop: DropoutMasks | None = None) -> Tensor:
        """LSTM outputs h (N, T, H) for input word ids (N, T) (inputs[:, 0] = 0 = BOS)."""
        B, N = att.shape[0], inputs.shape[0]
        if N % B:
            raise ValueError(f"{N} captions for {B} images: each image needs the same number of captions")
        enc = self.expand(self.encode(fc, att, att_mask, drop.att if drop is not None else None), N // B)
        x = F.relu(self.embed(inputs))
        x = x * drop.embed[:, :x.shape[1]] if drop is not None else self.dropout(x)
        x_proj = self.i2h(x)  # (N, T, 5H): the input half of every step in one matmul
        w_hq, b_hq = self._hq()
        state = self.init_state(N)
        hs = []
        for x_t in x_proj.unbind(1):
            state = self._cell(x_t, enc, state, w_hq, b_hq)
            hs.append(state[0])
        return torch.stack(hs, 1)

    def forward(self, fc: Tensor | None, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                drop: DropoutMasks | None = None) -> Tensor:
        """Log-probs (B*n, L+1, V+1) under teacher forcing for seqs (B, n, L) or (B*n, L).

        Input at t=0 is 0 (BOS), then seqs[:, t-1]; output t predicts seqs[:, t] (t < L) and, at
        t = L, the EOS. Each image is encoded once and shared by its n captions. ``drop``: replay
        pre-drawn dropout masks (e.g. those a sampling pass used) instead of drawing fresh ones.
        """
        seqs = seqs.reshape(-1, seqs.shape[-1])
        inputs = torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs], 1)  # (N, L+1), BOS first
        h = self._hidden(fc, att, inputs, att_mask, drop)
        h = h * drop.out[:, :h.shape[1]] if drop is not None else self.dropout(h)
        return F.log_softmax(_f32(self.logit(h)), dim=-1)  # once, over all steps

    def token_logprobs(self, fc: Tensor | None, att: Tensor, seqs: Tensor,
                       att_mask: Tensor | None = None, drop: DropoutMasks | None = None) -> tuple[Tensor, Tensor]:
        """``sequence_logprobs(self(fc, att, seqs), seqs)``, computed faster: the LSTM stops after the
        longest caption's EOS and the output layer runs only on the tokens that count (those up to
        each caption's first EOS), with a fused log-softmax + gather. Returns (token_logp, mask),
        both (N, L+1); use it for the XE loss and for policy-gradient log-probs (``drop``: replay
        the dropout masks the captions were sampled with).
        """
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = _targets(seqs)
        T = max(int(mask.sum(1).max()), 1)  # steps needed
        inputs = torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs[:, :T - 1]], 1)
        h = self._hidden(fc, att, inputs, att_mask, drop)  # (N, T, H)
        keep = mask[:, :T]
        h = h[keep] * drop.out[:, :T][keep] if drop is not None else self.dropout(h[keep])
        logits = self.logit(h)  # (tokens, V+1); bf16/fp16 under autocast, the log-probs float32
        tok = _TokenLogProb.apply(logits, target[:, :T][keep].long())
        out = tok.new_zeros(mask.shape).masked_scatter(mask, tok)
        return out, mask.to(out.dtype)


_ROWS = 64  # rows of logits per block in _TokenLogProb on a CPU: 64 × 9,488 float32 ≈ 2.4 MB


class _TokenLogProb(torch.autograd.Function):
    """``log_softmax(logits)[i, target[i]]`` for logits (N, K), in float32 (or float64) whatever
    the logits' dtype, without materialising the (N, K) log-softmax: a few rows at a time (all of
    them on a GPU) the row's logsumexp is taken in float32 and the target's logit subtracted;
    backward writes ``g · (onehot − softmax)`` block by block, the subtraction in float32, into a
    gradient of the logits' dtype. Under bf16 autocast this replaces the float32 copy of the
    logits, the log-softmax, the gather and their three backward passes (~25 % of the output
    layer's time on a CPU); the value is cross-entropy's up to float rounding (~1e-6)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor) -> Tensor:
        acc = torch.promote_types(logits.dtype, torch.float32)
        N = logits.shape[0]
        rows = _ROWS if logits.device.type == "cpu" else max(N, 1)
        lse = torch.empty(N, dtype=acc, device=logits.device)
        for i in range(0, N, rows):
            torch.logsumexp(logits[i:i + rows].to(acc), -1, out=lse[i:i + rows])
        ctx.save_for_backward(logits, target, lse)
        return logits.gather(1, target.unsqueeze(1)).squeeze(1).to(acc) - lse

    @staticmethod
    def backward(ctx, g: Tensor):
        logits, target, lse = ctx.saved_tensors
        N = logits.shape[0]
        rows = _ROWS if logits.device.type == "cpu" else max(N, 1)
        grad = torch.empty_like(logits)
        for i in range(0, N, rows):
            p = torch.sub(logits[i:i + rows].to(lse.dtype), lse[i:i + rows, None]).exp_()  # softmax (a new tensor)
            p.scatter_add_(1, target[i:i + rows, None], p.new_full((p.shape[0], 1), -1.0))  # − onehot
            grad[i:i + rows] = p.mul_(-g[i:i + rows, None].to(p.dtype))
        return grad, None


def _targets(seqs: Tensor) -> tuple[Tensor, Tensor]:
    """Targets (N, L+1) = seqs then EOS, and the bool mask of tokens up to and including the first EOS."""
    target = torch.cat([seqs, seqs.new_zeros(seqs.shape[0], 1)], 1)
    is_eos = (target == 0).to(torch.int32)
    return target, (is_eos.cumsum(1) - is_eos) == 0  # no EOS strictly before t


def sequence_logprobs(logprobs: Tensor, seqs: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token log-probs of ``seqs`` followed by EOS, and the mask of tokens that count.

    logprobs (N, L+1, V+1) from ``Att2in.forward``; seqs (N, L) 0-padded. The target at step t is
    seqs[:, t] for t < L and EOS (0) at t = L; the mask covers every token up to and including the
    first EOS, so the EOS counts once and padding after it is ignored. Returns (token_logp, mask),
    both (N, L+1), token_logp already 0 where the mask is 0.
    """
    target, mask = _targets(seqs.reshape(-1, seqs.shape[-1]))
    logp = logprobs.gather(2, target.unsqueeze(2).long()).squeeze(2)
    mask = mask.to(logp.dtype)
    return logp * mask, mask
