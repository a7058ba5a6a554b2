"""Att2in: the image captioner of Rennie et al., "Self-critical Sequence Training" (CVPR 2017).

An LSTM captioner with soft attention over image regions; the attention context enters *only* the
LSTM's cell input (the "in" transform), not the gates nor the LSTM input (the word embedding alone).
It follows the core of self-critical.pytorch's ``Att2in2Model``, which Wang & Chan's R-DPP code trains:

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

Word id 0 is both the BOS input and the EOS output. Only att features are read (the data's pooled
``fc`` features are not an input; self-critical.pytorch's Att2in2 never reads them either).

Each image's keys are computed once and shared by its n captions, the output layer runs once after
the LSTM loop, and two kernels (rdpp_cli/models/ops.py) compute the attention scores and the target
log-probs faster with the same arithmetic (docs/model.md, "Speed"). Under bf16/fp16 autocast the
linear layers run in the low precision; keys, scores, cell state and log-softmax stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from rdpp_cli.models.base import DropoutMasks, bernoulli_masks, sequence_logprobs, targets
from rdpp_cli.models.ops import attention_scores, f32, token_logprob

__all__ = ["Att2in", "Att2inConfig", "Encoded", "DropoutMasks", "sequence_logprobs"]


@dataclass
class Att2inConfig:
    vocab_size: int  # number of words V; logits have V + 1 entries (0 = EOS)
    input_encoding_size: int = 512  # word embedding size
    rnn_size: int = 512  # LSTM hidden size (also the embedded att feature size)
    att_hid_size: int = 512  # attention hidden size
    att_feat_size: int = 2048
    drop_prob_lm: float = 0.5
    seq_length: int = 16  # default maximum caption length (words)


class Encoded(NamedTuple):
    """Images prepared once for decoding: rows of the LSTM state map to images by ``row // per_image``."""

    att: Tensor  # (B, R, H) embedded att features
    keys: Tensor  # (B, R, A) attention keys, stored doubled: 2 · ctx2att(att)
    mask: Tensor | None  # (B, R) 1 = real region, or None
    per_image: int = 1  # LSTM rows per image (set by Att2in.expand)


class Att2in(nn.Module):
    """The captioner of the module docstring, with the ``CaptionModel`` interface (models/base.py)."""

    uses_fc = False  # self-critical.pytorch's Att2in2 reads only the att features
    supports_fast = True  # static_token_logprobs: the training fast path

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
    def encode(self, att: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
               drop: DropoutMasks | None = None) -> Encoded:
        """Embed the att features and precompute the attention keys, once per image (``fc`` is
        not read). ``drop``: pre-drawn masks (their ``att`` (B, R, H)) instead of fresh dropout."""
        a = F.relu(self.att_embed(att))
        a = a * drop.att if drop is not None else self.dropout(a)
        mask = None if att_mask is None else att_mask.to(a.dtype)
        # keys doubled (see ops.attention_scores) and kept in float32 under autocast: see _attend
        return Encoded(a, 2.0 * f32(self.ctx2att(a)), mask, 1)

    @staticmethod
    def expand(enc: Encoded, n: int) -> Encoded:
        """Each image repeated n times (row b*n + j is image b); a view, nothing is copied."""
        return enc._replace(per_image=enc.per_image * n)

    def init_state(self, batch_size: int) -> tuple[Tensor, Tensor]:
        z = self.h2h.weight.new_zeros(batch_size, self.config.rnn_size)
        return z, z.clone()

    def draw_dropout(self, batch: int, rows: int, steps: int, regions: int,
                     generator: torch.Generator | None = None) -> DropoutMasks:
        """Dropout masks for ``batch`` images of ``regions`` att regions and ``rows`` caption rows of
        ``steps`` steps, drawn from ``generator`` with this model's dropout probability."""
        c = self.config
        m = bernoulli_masks(self.h2h.weight, c.drop_prob_lm, {"att": (batch, regions, c.rnn_size),
                                                              "embed": (rows, steps, c.input_encoding_size),
                                                              "out": (rows, steps, c.rnn_size)}, generator)
        return DropoutMasks(image={"att": m["att"]}, row={"embed": m["embed"], "out": m["out"]})

    # -- one LSTM step -----------------------------------------------------------------------
    def _attend(self, h: Tensor, enc: Encoded, q: Tensor) -> Tensor:
        """Attention context (N, H) for hidden states h (N, H) with projected queries q (N, A)."""
        B, R, H = enc.att.shape
        n = h.shape[0] // B
        q = f32(q.view(B, n, -1))  # under bf16 autocast the scores stay float32 (docs/training.md)
        scores = attention_scores(enc.keys, q, self.alpha_net.weight[0]) + self.alpha_net.bias  # (B, n, R)
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
        g = torch.maximum(*(s_in + self.a2c(z)).chunk(2, 1))  # maxout
        c = f * c + i * g
        return o * torch.tanh(c), c  # h, c

    def _hq(self) -> tuple[Tensor, Tensor]:
        return (torch.cat([self.h2h.weight, self.h2att.weight], 0),
                torch.cat([self.h2h.bias, self.h2att.bias], 0))

    def step(self, it: Tensor, enc: Encoded, state: tuple[Tensor, Tensor],
             drop: dict[str, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Feed word ids ``it`` (N,) (0 = BOS); returns log-probs (N, V + 1) of the next word and the state.
        ``drop``: this step's pre-drawn masks (``DropoutMasks.at(t)``: embed, out) instead of fresh dropout."""
        x = F.relu(self.embed(it))
        x = x * drop["embed"] if drop is not None else self.dropout(x)
        h, c = self._cell(self.i2h(x), enc, state, *self._hq())
        o = h * drop["out"] if drop is not None else self.dropout(h)
        logprobs = F.log_softmax(f32(self.logit(o)), dim=-1)
        return logprobs, (h, c)

    # -- teacher forcing -----------------------------------------------------------------------
    def _hidden(self, att: Tensor, inputs: Tensor, att_mask: Tensor | None,
                drop: DropoutMasks | None = None) -> Tensor:
        """LSTM outputs h (N, T, H) for input word ids (N, T) (inputs[:, 0] = 0 = BOS)."""
        B, N = att.shape[0], inputs.shape[0]
        if N % B:
            raise ValueError(f"{N} captions for {B} images: each image needs the same number of captions")
        enc = self.expand(self.encode(att, att_mask, drop=drop), N // B)
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

    def _outputs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None, drop: DropoutMasks | None) -> Tensor:
        """The output layer's inputs (N, L+1, H) at every step for seqs (N, L), BOS first, dropped out."""
        h = self._hidden(att, torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs], 1), att_mask, drop)
        return h * drop.out[:, :h.shape[1]] if drop is not None else self.dropout(h)

    def forward(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                drop: DropoutMasks | None = None, fc: Tensor | None = None) -> Tensor:
        """Log-probs (B*n, L+1, V+1) under teacher forcing for seqs (B, n, L) or (B*n, L): input 0
        (BOS), then seqs[:, t-1]; output t predicts seqs[:, t] (t < L) and, at t = L, the EOS.
        ``drop``: replay pre-drawn dropout masks (e.g. a sampling pass's) instead of fresh dropout."""
        h = self._outputs(att, seqs.reshape(-1, seqs.shape[-1]), att_mask, drop)
        return F.log_softmax(f32(self.logit(h)), dim=-1)  # once, over all steps

    def token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``sequence_logprobs(self(att, seqs), seqs)`` (token_logp, mask), both (N, L+1), faster: the
        LSTM stops after the longest caption's EOS and the output layer runs only on the tokens that
        count, with a fused log-softmax + gather. For the XE loss and policy-gradient log-probs."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = targets(seqs)
        T = max(int(mask.sum(1).max()), 1)  # steps needed
        inputs = torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs[:, :T - 1]], 1)
        h = self._hidden(att, inputs, att_mask, drop)  # (N, T, H)
        keep = mask[:, :T]
        h = h[keep] * drop.out[:, :T][keep] if drop is not None else self.dropout(h[keep])
        logits = self.logit(h)  # (tokens, V+1); bf16/fp16 under autocast, the log-probs float32
        tok = token_logprob(logits, target[:, :T][keep].long())
        out = tok.new_zeros(mask.shape).masked_scatter(mask, tok)
        return out, mask.to(out.dtype)

    def static_token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                              drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``token_logprobs`` with every shape fixed by the inputs' shapes: the LSTM runs all L+1
        steps and the output layer every position (those past a caption's EOS are zeroed), and
        nothing waits for the device -- the form a compiled step or a CUDA graph needs. The same
        numbers: a step past the EOS never reaches an earlier position. ``drop`` (N, ≥ L+1 steps)."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = targets(seqs)
        h = self._outputs(att, seqs, att_mask, drop)  # (N, L+1, H)
        tok = token_logprob(self.logit(h).flatten(0, 1), target.flatten().long()).view(target.shape)
        mask = mask.to(tok.dtype)
        return tok * mask, mask
