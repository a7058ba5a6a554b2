"""UpDown: the captioner of Anderson et al., "Bottom-Up and Top-Down Attention for Image Captioning
and Visual Question Answering" (CVPR 2018), as self-critical.pytorch's ``UpDownModel``.

Two LSTMs per step: an attention LSTM that sees the whole image (the pooled ``fc`` features), the
previous word and the language LSTM's last output, and queries the regions; a language LSTM that
reads the attended regions and writes the word:

    a_i   = Dropout(ReLU(W_a att_i))                       att features embedded to rnn_size (att_embed)
    k_i   = W_k a_i                                        attention keys, once per image    (ctx2att)
    v     = Dropout(ReLU(W_f fc))                          pooled features embedded, once per image (fc_embed)
    x_t   = Dropout(ReLU(E[w_{t-1}]))                      word embedding, w_{-1} = 0 (BOS)  (embed)
    h¹_t, c¹_t = LSTM¹([h²_{t-1}; v; x_t], (h¹_{t-1}, c¹_{t-1}))                           (att_lstm)
    e_ti  = w_α · tanh(k_i + W_q h¹_t) + b_α               scores queried by the attention LSTM (h2att, alpha_net)
    α_t   = softmax_i(e_ti)   (times att_mask, renormalised, when a mask is given)
    z_t   = Σ_i α_ti a_i                                   attended regions
    h²_t, c²_t = LSTM²([z_t; h¹_t], (h²_{t-1}, c²_{t-1}))                                  (lang_lstm)
    p(w_t) = log_softmax(W_o Dropout(h²_t))                over vocab_size + 1 words, 0 = EOS  (logit)

LSTM¹ and LSTM² are ``nn.LSTMCell``s (gates i, f, g, o; ``W_ih [input] + b_ih + W_hh h + b_hh``).
Word id 0 is both the BOS input and the EOS output. The state holds (h¹, c¹, h², c²), each (N, H)
with the caption row first, so that beam search can reorder it (``models.base.select_rows``).

Settings: the ``paper`` sizes of its line in ``models/registry.py`` are self-critical.pytorch's
configs/updown/updown.yml (rnn_size 1000, input_encoding_size 1000, att_hid_size 512, att_feat_size 2048) with its option parser's default
dropout 0.5 (updown.yml sets none); ``small`` is a CPU size for the bundled toy data. Parameter
names are the peer's without its ``Sequential``/``core`` prefixes (``embed``, ``fc_embed``,
``att_embed``, ``ctx2att``, ``att_lstm``, ``lang_lstm``, ``h2att``, ``alpha_net``, ``logit``).

The same arithmetic, arranged for speed (docs/model.md, "UpDown"): the att and fc embeddings and the
keys are computed once per image and shared by the image's n rows without a copy; the input weights
of LSTM¹ are split by what they multiply, so that v's part (with both biases) is one product per
image, x_t's part one product for every step of a teacher-forced pass, and h²_{t-1}'s part one
product together with LSTM²'s recurrent weights; h¹_t's query and its part of LSTM²'s input are one
product; the first step skips the zero state's products; under teacher forcing each caption's steps
stop at its EOS (the rows sorted longest first, so the rows still running are a prefix) and the
output layer runs once after the loop, on the tokens that count. The attention scores and the target
log-probs use ops.py's kernels (``attention_scores``: keys stored doubled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from rdpp_cli.models.base import DropoutMasks, bernoulli_masks, targets
from rdpp_cli.models.ops import attention_scores, f32, token_logprob

__all__ = ["UpDown", "UpDownConfig", "UpDownEncoded"]


@dataclass
class UpDownConfig:
    vocab_size: int  # number of words V; logits have V + 1 entries (0 = EOS)
    input_encoding_size: int = 1000  # word embedding size
    rnn_size: int = 1000  # both LSTMs' hidden size (also the embedded att and fc feature size)
    att_hid_size: int = 512  # attention hidden size
    att_feat_size: int = 2048
    fc_feat_size: int = 2048
    drop_prob_lm: float = 0.5
    seq_length: int = 16  # default maximum caption length (words)


class UpDownEncoded(NamedTuple):
    """Images prepared once for decoding; rows of the state map to images by ``row // per_image``."""

    att: Tensor  # (B, R, H) embedded att features
    keys: Tensor  # (B, R, A) attention keys, stored doubled: 2 · ctx2att(att)
    mask: Tensor | None  # (B, R) 1 = real region, or None
    fc_gates: Tensor  # (B, 4H) LSTM¹'s input product of the embedded fc features, with both biases
    w: dict  # the step's weights, regrouped once per pass (UpDown._weights)
    per_image: int = 1  # state rows per image (set by UpDown.expand)


class UpDown(nn.Module):
    """The captioner of the module docstring, with the ``CaptionModel`` interface (models/base.py)."""

    uses_fc = True  # LSTM¹ reads the embedded pooled features at every step
    supports_fast = True  # static_token_logprobs: the training fast path

    def __init__(self, config: UpDownConfig):
        super().__init__()
        self.config = c = config
        H, A, E = c.rnn_size, c.att_hid_size, c.input_encoding_size
        self.embed = nn.Embedding(c.vocab_size + 1, E)  # + ReLU + dropout
        self.fc_embed = nn.Linear(c.fc_feat_size, H)  # + ReLU + dropout
        self.att_embed = nn.Linear(c.att_feat_size, H)  # + ReLU + dropout
        self.ctx2att = nn.Linear(H, A)
        self.att_lstm = nn.LSTMCell(H + H + E, H)  # input [h²_{t-1}; v; x_t]
        self.h2att = nn.Linear(H, A)
        self.alpha_net = nn.Linear(A, 1)
        self.lang_lstm = nn.LSTMCell(H + H, H)  # input [z_t; h¹_t]
        self.logit = nn.Linear(H, c.vocab_size + 1)
        self.dropout = nn.Dropout(c.drop_prob_lm)

    # -- images ------------------------------------------------------------------------------
    def encode(self, att: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
               drop: DropoutMasks | None = None) -> UpDownEncoded:
        """Embed the att and fc features and precompute the keys and fc's LSTM¹ product, once per
        image. ``drop``: pre-drawn masks (``att`` (B, R, H), ``fc`` (B, H)) instead of fresh dropout."""
        if fc is None:
            raise ValueError("UpDown reads the pooled fc features (B, F): pass fc= beside att")
        H = self.config.rnn_size
        a = F.relu(self.att_embed(att))
        a = a * drop.att if drop is not None else self.dropout(a)
        v = F.relu(self.fc_embed(fc))
        v = v * drop.fc if drop is not None else self.dropout(v)
        lstm = self.att_lstm
        fc_gates = F.linear(v, lstm.weight_ih[:, H:2 * H], lstm.bias_ih + lstm.bias_hh)
        mask = None if att_mask is None else att_mask.to(a.dtype)
        # keys doubled (ops.attention_scores) and float32 under autocast, as Att2in's
        return UpDownEncoded(a, 2.0 * f32(self.ctx2att(a)), mask, fc_gates, self._weights(), 1)

    @staticmethod
    def expand(enc: UpDownEncoded, n: int) -> UpDownEncoded:
        """Each image repeated n times (row b*n + j is image b); a view, nothing is copied."""
        return enc._replace(per_image=enc.per_image * n)

    def init_state(self, rows: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        z = self.logit.weight.new_zeros(rows, self.config.rnn_size)
        return z, z.clone(), z.clone(), z.clone()  # h¹, c¹, h², c²

    def draw_dropout(self, batch: int, rows: int, steps: int, regions: int,
                     generator: torch.Generator | None = None) -> DropoutMasks:
        """Dropout masks for ``batch`` images of ``regions`` att regions and ``rows`` caption rows of
        ``steps`` steps, drawn from ``generator`` in this order: the embedded att features (B, R, H)
        and fc features (B, H) per image; the word embeddings (N, S, E) and the outputs (N, S, H)
        per row and step."""
        c = self.config
        m = bernoulli_masks(self.logit.weight, c.drop_prob_lm, {"att": (batch, regions, c.rnn_size),
                                                                "fc": (batch, c.rnn_size),
                                                                "embed": (rows, steps, c.input_encoding_size),
                                                                "out": (rows, steps, c.rnn_size)}, generator)
        return DropoutMasks(image={"att": m["att"], "fc": m["fc"]}, row={"embed": m["embed"], "out": m["out"]})

    # -- one step of the two LSTMs -----------------------------------------------------------
    def _weights(self) -> dict[str, Tensor]:
        """The products of a step, regrouped by what they multiply (module docstring)."""
        H = self.config.rnn_size
        a, lang = self.att_lstm, self.lang_lstm
        return {"x": a.weight_ih[:, 2 * H:],  # LSTM¹ on x_t
                "h2": torch.cat([a.weight_ih[:, :H], lang.weight_hh], 0),  # h²_{t-1}: LSTM¹ input, LSTM² recurrence
                "h1": a.weight_hh,  # h¹_{t-1}: LSTM¹ recurrence
                "q": torch.cat([self.h2att.weight, lang.weight_ih[:, H:]], 0),  # h¹_t: query, LSTM² input
                "q_bias": torch.cat([self.h2att.bias, lang.bias_ih + lang.bias_hh], 0),
                "z": lang.weight_ih[:, :H]}  # z_t: LSTM² input

    def _attend(self, q: Tensor, enc: UpDownEncoded, rows: Tensor | None = None) -> Tensor:
        """Attended regions z (n, H) for queries q (n, A) of all rows in order (``rows`` None) or of
        the rows ``rows`` (image-major indices): scored among all rows (0 for the others), whose
        images are then shared as for all."""
        B, R, H = enc.att.shape
        if rows is not None:
            q = q.new_zeros(B * enc.per_image, q.shape[1]).index_copy(0, rows, q)
        scores = attention_scores(enc.keys, f32(q.view(B, enc.per_image, -1)), self.alpha_net.weight[0])
        weight = F.softmax(scores + self.alpha_net.bias, dim=-1)  # (B, n, R)
        if enc.mask is not None:  # as the peer: zero the padding, renormalise
            weight = weight * enc.mask.unsqueeze(1)
            weight = weight / weight.sum(-1, keepdim=True)
        z = torch.bmm(weight, enc.att).view(-1, H)
        return z if rows is None else z.index_select(0, rows)

    @staticmethod
    def _lstm(gates: Tensor, c: Tensor | None) -> tuple[Tensor, Tensor]:
        """nn.LSTMCell's update from its pre-activations (N, 4H) (gates i, f, g, o); c None: zeros."""
        i, f, g, o = gates.chunk(4, 1)
        c_in = torch.sigmoid(i) * torch.tanh(g)
        c = c_in if c is None else torch.sigmoid(f) * c + c_in
        return torch.sigmoid(o) * torch.tanh(c), c

    def _core(self, x_gates: Tensor, enc: UpDownEncoded, state: tuple | None, rows: Tensor | None = None) -> tuple:
        """One step given LSTM¹'s input product of the word x_gates (n, 4H); returns the new state.
        ``state`` None: the zero state (its products are skipped). ``rows``: the image-major indices
        of these n rows when they are some of the rows (teacher forcing skips ended captions); the
        state's first n rows are theirs."""
        w, H = enc.w, self.config.rnn_size
        n = x_gates.shape[0]
        if rows is None:  # all rows, image-major: each image's fc product shared by its rows
            g1 = (x_gates.view(enc.att.shape[0], -1, 4 * H) + enc.fc_gates.unsqueeze(1)).view(n, 4 * H)
        else:
            g1 = x_gates + enc.fc_gates.index_select(0, rows // enc.per_image)
        h1 = c1 = c2 = g2 = None
        if state is not None:
            h1, c1, h2, c2 = (s[:n] for s in state)
            g1_h2, g2 = F.linear(h2, w["h2"]).split([4 * H, 4 * H], 1)
            g1 = torch.addmm(g1 + g1_h2, h1, w["h1"].t())
        h1, c1 = self._lstm(g1, c1)
        q, g2_h1 = F.linear(h1, w["q"], w["q_bias"]).split([w["q"].shape[0] - 4 * H, 4 * H], 1)
        g2 = g2_h1 if g2 is None else g2 + g2_h1
        h2, c2 = self._lstm(torch.addmm(g2, self._attend(q, enc, rows), w["z"].t()), c2)
        return h1, c1, h2, c2

    def step(self, it: Tensor, enc: UpDownEncoded, state: tuple,
             drop: dict[str, Tensor] | None = None) -> tuple[Tensor, tuple]:
        """Feed word ids ``it`` (N,) (0 = BOS); returns log-probs (N, V + 1) of the next word and the
        state. ``drop``: this step's pre-drawn masks (``DropoutMasks.at(t)``: embed, out)."""
        x = F.relu(self.embed(it))
        x = x * drop["embed"] if drop is not None else self.dropout(x)
        state = self._core(F.linear(x, enc.w["x"]), enc, state)
        h = state[2]
        o = h * drop["out"] if drop is not None else self.dropout(h)
        return F.log_softmax(f32(self.logit(o)), dim=-1), state

    # -- teacher forcing -----------------------------------------------------------------------
    @staticmethod
    def _tokens(N: int, T: int, device, steps: Tensor | None = None) -> tuple[Tensor, list[int], Tensor, Tensor]:
        """The token order of a teacher-forced pass (``_hidden``): the rows taken longest first
        (``order``), the rows running at each step (``counts``), and each token's row and step."""
        order, counts = torch.arange(N, device=device), [N] * T
        if steps is not None:
            order = torch.argsort(steps, descending=True, stable=True)
            counts = (steps.unsqueeze(1) > torch.arange(T, device=steps.device)).sum(0).tolist()
        rows = torch.cat([order[:n] for n in counts])
        cols = torch.cat([torch.full((n,), t, device=device) for t, n in enumerate(counts)])
        return order, counts, rows, cols

    def _hidden(self, att: Tensor, inputs: Tensor, att_mask: Tensor | None, fc: Tensor | None,
                drop: DropoutMasks | None, steps: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Language-LSTM outputs h² (tokens, H) for input word ids (N, T) (inputs[:, 0] = 0 = BOS),
        with each token's row and step (tokens,). ``steps`` None: every row at every step. ``steps``
        (N,): row r runs its first steps[r] steps only, the rows taken longest first, so that step
        t's rows are the first n_t = #{r: steps[r] > t} of that order. Tokens are step-major."""
        B, (N, T) = att.shape[0], inputs.shape
        if N % B:
            raise ValueError(f"{N} captions for {B} images: each image needs the same number of captions")
        enc = self.expand(self.encode(att, att_mask, fc=fc, drop=drop), N // B)
        order, counts, rows, cols = self._tokens(N, T, inputs.device, steps)
        x = F.relu(self.embed(inputs[rows, cols]))  # (tokens, E)
        x = x * drop.embed[rows, cols] if drop is not None else self.dropout(x)
        x_gates = F.linear(x, enc.w["x"]).split(counts)  # the word products of every token in one matmul
        state, hs = None, []
        for t, n in enumerate(counts):
            state = self._core(x_gates[t], enc, state, None if steps is None else order[:n])
            hs.append(state[2])
        return torch.cat(hs), rows, cols

    def forward(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                drop: DropoutMasks | None = None, fc: Tensor | None = None) -> Tensor:
        """Log-probs (B*n, L+1, V+1) under teacher forcing for seqs (B, n, L) or (B*n, L): input 0
        (BOS), then seqs[:, t-1]; output t predicts seqs[:, t] (t < L) and, at t = L, the EOS."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        h, _, _ = self._hidden(att, torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs], 1), att_mask, fc, drop)
        h = h.view(seqs.shape[1] + 1, seqs.shape[0], -1).transpose(0, 1)  # (N, L+1, H)
        h = h * drop.out[:, :h.shape[1]] if drop is not None else self.dropout(h)
        return F.log_softmax(f32(self.logit(h)), dim=-1)

    def token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``sequence_logprobs(self(att, seqs, fc=fc), seqs)`` (token_logp, mask), both (N, L+1),
        faster: each caption's LSTM steps stop at its EOS (the rows still running are a prefix of
        the rows sorted by length) and the word products and the output layer run once, on the
        tokens that count (the output layer with ops.token_logprob). For the XE loss and
        policy-gradient log-probs."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = targets(seqs)
        steps = mask.sum(1)  # tokens of each caption: its words and the EOS
        T = max(int(steps.max()), 1)
        inputs = torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs[:, :T - 1]], 1)
        h, rows, cols = self._hidden(att, inputs, att_mask, fc, drop, steps)
        h = h * drop.out[rows, cols] if drop is not None else self.dropout(h)
        tok = token_logprob(self.logit(h), target[rows, cols].long())
        out = tok.new_zeros(mask.shape).index_put((rows, cols), tok)
        return out, mask.to(out.dtype)

    def static_token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                              drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``token_logprobs`` with every shape fixed by the inputs' shapes: both LSTMs run all L+1
        steps for every row and the output layer every position (those past a caption's EOS are
        zeroed), and nothing waits for the device -- the form a compiled step or a CUDA graph needs.
        The same numbers: a step past the EOS never reaches an earlier position. ``drop`` (N, ≥ L+1 steps)."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        N, L = seqs.shape
        target, mask = targets(seqs)
        h, _, _ = self._hidden(att, torch.cat([seqs.new_zeros(N, 1), seqs], 1), att_mask, fc, drop)
        h = h.view(L + 1, N, -1).transpose(0, 1)  # (N, L+1, H)
        h = h * drop.out[:, :L + 1] if drop is not None else self.dropout(h)
        tok = token_logprob(self.logit(h).flatten(0, 1), target.flatten().long()).view(target.shape)
        mask = mask.to(tok.dtype)
        return tok * mask, mask
