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
all time steps stacked after the loop; a fused attention-score function recomputes ``tanh`` in its
backward instead of storing it. The arithmetic is the same as the step-by-step reference.
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
    keys: Tensor  # (B, R, A) attention keys (ctx2att of att)
    mask: Tensor | None  # (B, R) 1 = real region, or None
    per_image: int = 1  # LSTM rows per image (set by Att2in.expand)


class _AttScores(torch.autograd.Function):
    """scores[b, j, r] = w · tanh(keys[b, r] + q[b, j]) (bias added by the caller).

    The same value autograd would give for the plain expression; backward recomputes the
    (B, n, R, A) tanh instead of keeping one per time step alive (17 × 100 MB at COCO shapes).
    """

    @staticmethod
    def forward(ctx, keys: Tensor, q: Tensor, w: Tensor) -> Tensor:
        t = torch.tanh(keys.unsqueeze(1) + q.unsqueeze(2))  # (B, n, R, A)
        ctx.save_for_backward(keys, q, w)
        return t @ w  # (B, n, R)

    @staticmethod
    def backward(ctx, g: Tensor):
        keys, q, w = ctx.saved_tensors
        t = torch.tanh(keys.unsqueeze(1) + q.unsqueeze(2))  # (B, n, R, A)
        gw = torch.einsum("bnr,bnra->a", g, t) if ctx.needs_input_grad[2] else None
        # d pre = g ⊗ w ⊙ (1 - t²), computed in place in t
        t.mul_(t).neg_().add_(1.0).mul_(g.unsqueeze(-1)).mul_(w)
        gk = t.sum(1) if ctx.needs_input_grad[0] else None
        gq = t.sum(2) if ctx.needs_input_grad[1] else None
        return gk, gq, gw


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
    def encode(self, fc: Tensor | None, att: Tensor, att_mask: Tensor | None = None) -> Encoded:
        """Embed the att features and precompute the attention keys, once per image (fc is unused)."""
        a = self.dropout(F.relu(self.att_embed(att)))
        if att_mask is not None:
            att_mask = att_mask.to(a.dtype)
        return Encoded(a, self.ctx2att(a), att_mask, 1)

    @staticmethod
    def expand(enc: Encoded, n: int) -> Encoded:
        """Each image repeated n times (row b*n + j is image b); a view, nothing is copied."""
        return enc._replace(per_image=enc.per_image * n)

    def init_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        w = self.h2h.weight
        z = w.new_zeros(batch_size, self.config.rnn_size)
        return z, z.clone()

    # -- one LSTM step -----------------------------------------------------------------------
    def _attend(self, h: Tensor, enc: Encoded, q: Tensor) -> Tensor:
        """Attention context (N, H) for hidden states h (N, H) with projected queries q (N, A)."""
        B, R, H = enc.att.shape
        n = h.shape[0] // B
        q = q.view(B, n, -1)
        if torch.is_grad_enabled() and (q.requires_grad or enc.keys.requires_grad):
            scores = _AttScores.apply(enc.keys, q, self.alpha_net.weight[0])
        else:
            scores = torch.tanh(enc.keys.unsqueeze(1) + q.unsqueeze(2)) @ self.alpha_net.weight[0]
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
        hq = F.linear(h, w_hq, b_hq)  # h2h and h2att in one matmul: (N, 5H + A)
        z = self._attend(h, enc, hq[:, 5 * H:])
        s = x_proj + hq[:, :5 * H]
        gates = torch.sigmoid(s[:, :3 * H])
        i, f, o = gates[:, :H], gates[:, H:2 * H], gates[:, 2 * H:]
        g = s[:, 3 * H:] + self.a2c(z)
        g = torch.maximum(g[:, :H], g[:, H:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        return h, c

    def _hq(self) -> tuple[Tensor, Tensor]:
        return (torch.cat([self.h2h.weight, self.h2att.weight], 0),
                torch.cat([self.h2h.bias, self.h2att.bias], 0))

    def step(self, it: Tensor, enc: Encoded, state: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Feed word ids ``it`` (N,) (0 = BOS); returns log-probs (N, V + 1) of the next word and the state."""
        x = self.dropout(F.relu(self.embed(it)))
        h, c = self._cell(self.i2h(x), enc, state, *self._hq())
        logprobs = F.log_softmax(self.logit(self.dropout(h)), dim=-1)
        return logprobs, (h, c)

    # -- teacher forcing -----------------------------------------------------------------------
    def forward(self, fc: Tensor | None, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None) -> Tensor:
        """Log-probs (B*n, L+1, V+1) under teacher forcing for seqs (B, n, L) or (B*n, L).

        Input at t=0 is 0 (BOS), then seqs[:, t-1]; output t predicts seqs[:, t] (t < L) and, at
        t = L, the EOS. Each image is encoded once and shared by its n captions.
        """
        B = att.shape[0]
        seqs = seqs.reshape(-1, seqs.shape[-1])
        N, L = seqs.shape
        if N % B:
            raise ValueError(f"{N} captions for {B} images: each image needs the same number of captions")
        enc = self.expand(self.encode(fc, att, att_mask), N // B)
        inputs = torch.cat([seqs.new_zeros(N, 1), seqs], 1)  # (N, L+1), BOS first
        x = self.dropout(F.relu(self.embed(inputs)))
        x_proj = self.i2h(x)  # (N, L+1, 5H): the input half of every step in one matmul
        w_hq, b_hq = self._hq()
        state = self.init_state(N)
        hs = []
        for t in range(L + 1):
            state = self._cell(x_proj[:, t], enc, state, w_hq, b_hq)
            hs.append(state[0])
        h = torch.stack(hs, 1)  # (N, L+1, H)
        return F.log_softmax(self.logit(self.dropout(h)), dim=-1)


def sequence_logprobs(logprobs: Tensor, seqs: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token log-probs of ``seqs`` followed by EOS, and the mask of tokens that count.

    logprobs (N, L+1, V+1) from ``Att2in.forward``; seqs (N, L) 0-padded. The target at step t is
    seqs[:, t] for t < L and EOS (0) at t = L; the mask covers every token up to and including the
    first EOS, so the EOS counts once and padding after it is ignored. Returns (token_logp, mask),
    both (N, L+1), token_logp already 0 where the mask is 0.
    """
    seqs = seqs.reshape(-1, seqs.shape[-1])
    target = torch.cat([seqs, seqs.new_zeros(seqs.shape[0], 1)], 1)
    is_eos = (target == 0).to(torch.int32)
    mask = (is_eos.cumsum(1) - is_eos) == 0  # no EOS strictly before t
    logp = logprobs.gather(2, target.unsqueeze(2).long()).squeeze(2)
    mask = mask.to(logp.dtype)
    return logp * mask, mask
