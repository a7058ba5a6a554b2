"""Transformer: the encoder-decoder captioner of self-critical.pytorch's ``TransformerModel``.

Vaswani et al.'s Transformer ("Attention is all you need", 2017) in the "annotated Transformer"
form that self-critical.pytorch (captioning/models/TransformerModel.py) copies from
nlp.seas.harvard.edu: pre-norm sublayers, the image regions as the source sequence, the caption
as the target. With d = d_model, h heads of d_k = d / h, N_enc encoder and N_dec decoder layers:

    LN(x)       = w ⊙ (x − mean(x)) / (std(x) + ε) + b       the peer's own layer norm: the *unbiased*
                                                              std, ε = 1e-6 added to the std (not
                                                              nn.LayerNorm's √(biased var + ε))
    Sub(x, f)   = x + Dropout(f(LN(x)))                       every sublayer, norm first
    Att(q,K,V)  = Dropout(softmax(q Kᵀ / √d_k + mask)) V      per head; MHA = W_o [Att(W_q x, W_k y, W_v y)]_heads
    FFN(x)      = W_2 Dropout(ReLU(W_1 x))

    encoder   a_i = Dropout_lm(ReLU(W_a att_i))               att features embedded (att_embed, dropout drop_prob_lm)
              x ← Sub(x, MHA(x, x | region mask)); x ← Sub(x, FFN)        × N_enc
              m = LN(x)                                        the memory, once per image
    decoder   y_t = Dropout(√d · E[w_{t-1}] + PE(t))           w_{-1} = 0 (BOS); PE sinusoidal:
                                                              PE(t, 2i) = sin(t / 10000^{2i/d}), PE(t, 2i+1) = cos(·)
              y ← Sub(y, MHA(y, y | causal)); y ← Sub(y, MHA(y, m | region mask)); y ← Sub(y, FFN)   × N_dec
              p(w_t) = log_softmax(W_g LN(y_t))                over vocab_size + 1 words, 0 = EOS (generator)

Word id 0 is both the BOS input and the EOS output; only att features are read (``uses_fc = False``:
the peer sets ``fc_embed`` to the identity and never reads it). Parameters start as the peer's:
Glorot-uniform for every matrix of the encoder-decoder, torch's default for ``att_embed``.

Settings (the ``paper`` sizes of its line in ``models/registry.py``): the peer's
configs/transformer/transformer.yml -- N_enc = N_dec = 6,
d_model 512, d_ff 2048, 8 heads, dropout 0.1 -- and ``drop_prob_lm`` 0.5 on the embedded att
features, the peer's option default that transformer.yml leaves as it is (AttModel builds
``att_embed`` with it). That config trains with the Noam schedule: lr = d_model^-0.5 ·
min(step^-0.5, step · warmup^-1.5) with 20,000 warm-up steps (``noamopt_warmup``, factor 1), Adam
with betas (0.9, 0.98) and eps 1e-9 (the peer's ``NoamOpt``); rdpp's training loop owns the
schedule, the model only exposes ``config.d_model``.

Differences from the peer, none of which changes a log-probability that counts:

- Each image is encoded once and its memory shared by its n captions (``expand``: a view). The
  peer's teacher-forced pass repeats the features per caption before its encoder, so in train mode
  its encoder draws dropout per caption; here per image (eval mode: the same numbers).
- The decoder's self-attention is causal only. The peer's teacher-forced pass also hides the keys
  of padding *inputs* (the 0s after a caption's end); an output that counts (a word or the first
  EOS) only sees inputs before its position, none of them padding, so only outputs after the EOS
  differ -- and its own decoding does not hide them either.
- Padded regions (``att_mask`` 0) are hidden as keys in the encoder and the cross-attention, as
  the peer's; the peer's ``pack_wrapper`` also zeroes their embedding, which reaches nothing.

Decoding is incremental: the state keeps every decoder layer's self-attention keys and values of the
steps so far, (N, h, t, d_k) each, so step t costs O(t) instead of re-decoding the prefix (the
peer's ``core`` runs the whole decoder over all t words at every step and projects the memory's
keys and values again at every step); the memory's keys and values are projected once per image in
``encode``. Pre-norm makes the cache exact: a position's keys and values depend only on the
positions up to it. Without dropout masks the attention is torch's ``scaled_dot_product_attention``.

Dropout drawn in advance (``draw_dropout``, for on-policy RL): the decoder's masks per caption row
and step, as bool (kept = True, scaled by 1/(1 − p) where used), laid out (N, S, ...) with a layer
dimension: ``embed`` (N, S, d), ``sub`` (N, S, N_dec, 3, d) the three residual dropouts, ``ff``
(N, S, N_dec, d_ff), ``self_attn`` (N, S, N_dec, h, S) (step t reads its first t + 1 keys) and
``src_attn`` (N, S, N_dec, h, R) -- 137 MB at the paper's shapes (B = 50, m = 5 so N = 250,
S = 17, R = 196). The encoder's masks (att embedding, and per layer the attention probabilities
(B, h, R, R), two residuals and the FFN) would take another 278 MB as bool, so instead the image
part holds one ``seed`` (int64): ``encode`` given the masks draws every encoder mask from a
generator seeded with it, in a fixed order, so the sampling pass and the teacher-forced pass run
the very same encoder (tested); the encoder's draws are made twice instead of stored once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from rdpp_cli.models.base import DropoutMasks, targets
from rdpp_cli.models.ops import f32, token_logprob

__all__ = ["Transformer", "TransformerConfig", "LayerNorm", "positional_encoding"]


@dataclass
class TransformerConfig:
    """The model's sizes (saved in checkpoints). The peer's schedule for ``paper`` (the training
    loop's business): Noam, lr = d_model^-0.5 · min(step^-0.5, step · 20,000^-1.5), Adam betas
    (0.9, 0.98), eps 1e-9."""

    vocab_size: int  # number of words V; logits have V + 1 entries (0 = EOS)
    seq_length: int = 16  # default maximum caption length (words)
    att_feat_size: int = 2048
    N_enc: int = 6  # encoder layers
    N_dec: int = 6  # decoder layers
    d_model: int = 512
    d_ff: int = 2048  # inner size of the position-wise feed-forward layers
    num_att_heads: int = 8
    dropout: float = 0.1  # every dropout of the encoder-decoder
    drop_prob_lm: float = 0.5  # dropout of the embedded att features (the peer's AttModel option)


def positional_encoding(start: int, length: int, d: int, device=None) -> Tensor:
    """PE (length, d) of positions start … start + length − 1, the peer's formula and float32 ops."""
    position = torch.arange(start, start + length, device=device).unsqueeze(1).float()
    div_term = torch.exp(torch.arange(0, d, 2, device=device).float() * -(math.log(10000.0) / d))
    pe = torch.zeros(length, d, device=device)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


class LayerNorm(nn.Module):
    """``w (x − mean) / (std + eps) + b`` over the last dimension, std unbiased: the peer's own."""

    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        std, mean = torch.std_mean(x, -1, keepdim=True)
        return self.weight * (x - mean) / (std + self.eps) + self.bias


class Drop:
    """Where one pass's dropout comes from. A site calls ``drop(x, p, mask)``: with a pre-drawn
    ``mask`` -- bool (True = kept) ``x · mask / (1 − p)``, float (kept entries already 1 / (1 − p),
    as eager dropout draws them) ``x · mask`` -- else a fresh draw: the next of ``replay`` (the
    encoder's masks drawn in advance, in site order) when given, from ``generator`` when given, from
    torch's RNG in train mode, none in eval."""

    def __init__(self, training: bool, generator: torch.Generator | None = None, replay=None):
        self.training, self.generator = training, generator
        self.replay = None if replay is None else iter(replay)

    def active(self, p: float, mask: Tensor | None = None) -> bool:
        drawn = self.generator is not None or self.replay is not None
        return p > 0 and (mask is not None or drawn or self.training)

    def __call__(self, x: Tensor, p: float, mask: Tensor | None = None) -> Tensor:
        if not self.active(p, mask):
            return x
        if mask is None and self.replay is not None:
            mask = next(self.replay)
        if mask is None and self.generator is None:
            return F.dropout(x, p, True)
        if mask is None:
            mask = torch.empty(x.shape, dtype=torch.bool, device=x.device).bernoulli_(1 - p, generator=self.generator)
        return x * mask if mask.is_floating_point() else x * mask * (1.0 / (1.0 - p))

    def site(self, p: float, mask: Tensor | None = None) -> Callable[[Tensor], Tensor] | None:
        """This dropout as a function of x for one site, or None where it drops nothing."""
        return (lambda x: self(x, p, mask)) if self.active(p, mask) else None


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
              drop: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """``drop(softmax(q kᵀ / √d_k, keys where mask is False hidden)) v`` for (…, T, d_k) queries
    and (…, S, d_k) keys and values; torch's fused kernel when nothing is dropped."""
    if drop is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(drop(F.softmax(scores, dim=-1)), v)


def causal_mask(queries: int, keys: int, device=None) -> Tensor | None:
    """(queries, keys) bool: the last ``queries`` positions of ``keys`` each see the keys up to
    themselves; None for one query (it sees them all)."""
    if queries == 1:
        return None
    q = torch.arange(keys - queries, keys, device=device).unsqueeze(1)
    return torch.arange(keys, device=device) <= q


class MultiHeadAttention(nn.Module):
    """The four projections of multi-head attention (the peer's ``linears[0..3]``: q, k, v, o)."""

    def __init__(self, d_model: int, h: int):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def heads(self, x: Tensor, batch: int) -> Tensor:
        """(batch, T, d) → (batch, h, T, d_k)."""
        return x.view(batch, -1, self.h, self.d_k).transpose(1, 2)

    def merge(self, a: Tensor, shape: torch.Size) -> Tensor:
        """(batch, h, T, d_k) → ``shape`` (…, d) and the output projection."""
        return self.o(a.transpose(1, 2).reshape(shape))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor, drop: Drop, p: float, mask: Tensor | None = None) -> Tensor:
        return self.w_2(drop(F.relu(self.w_1(x)), p, mask))


class EncoderLayer(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.num_att_heads)
        self.feed_forward = FeedForward(c.d_model, c.d_ff)
        self.norms = nn.ModuleList(LayerNorm(c.d_model) for _ in range(2))
        self.p = c.dropout

    def forward(self, x: Tensor, mask: Tensor | None, drop: Drop) -> Tensor:
        """x (B, R, d); mask (B, 1, 1, R) bool (True = a real region) or None. The dropout draws,
        in this order: attention probabilities, residual, FFN, residual."""
        a, B = self.self_attn, x.shape[0]
        h = self.norms[0](x)
        att = attention(a.heads(a.q(h), B), a.heads(a.k(h), B), a.heads(a.v(h), B), mask, drop.site(self.p))
        x = x + drop(a.merge(att, x.shape), self.p)
        return x + drop(self.feed_forward(self.norms[1](x), drop, self.p), self.p)


class DecoderLayer(nn.Module):
    def __init__(self, c: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(c.d_model, c.num_att_heads)
        self.src_attn = MultiHeadAttention(c.d_model, c.num_att_heads)
        self.feed_forward = FeedForward(c.d_model, c.d_ff)
        self.norms = nn.ModuleList(LayerNorm(c.d_model) for _ in range(3))
        self.p = c.dropout

    def forward(self, x: Tensor, memory: tuple[Tensor, Tensor], memory_mask: Tensor | None,
                past: tuple[Tensor, Tensor], drop: Drop, masks: dict[str, Tensor] | None,
                at: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """x (N, T, d): positions t0 … t0+T−1 of N rows, after ``past`` = the self-attention keys
        and values of positions < t0 (N, h, t0, d_k); memory: the cross-attention keys and values
        (B, h, R, d_k) of the B images (row b·n + j is image b). ``masks``: this layer's pre-drawn
        masks (N, T, ...), or None. Returns x and the keys and values of positions < t0 + T.
        ``at`` (N,) (static decoding, T = 1): ``past`` is a preallocated cache (N, h, S, d_k) and
        row r's position is at[r]: its keys and values are written there, the keys after it hidden."""
        N, T, _ = x.shape
        a, p, m = self.self_attn, self.p, masks or {}
        h = self.norms[0](x)
        new = [a.heads(lin(h), N) for lin in (a.k, a.v)]
        if at is None:
            k, v = (torch.cat([c, n], 2) for c, n in zip(past, new))
            seen = causal_mask(T, k.shape[2], x.device)
        else:
            where = at.view(N, 1, 1, 1)
            k, v = (c.scatter(2, where.expand(-1, a.h, 1, a.d_k), n) for c, n in zip(past, new))
            seen = torch.arange(k.shape[2], device=x.device) <= where  # (N, 1, 1, S)
        pm = m.get("self_attn")
        pm = None if pm is None else pm[..., :k.shape[2]].transpose(1, 2)  # (N, h, T, keys so far)
        att = attention(a.heads(a.q(h), N), k, v, seen, drop.site(p, pm))
        sub = m.get("sub")
        x = x + drop(a.merge(att, x.shape), p, None if sub is None else sub[:, :, 0])
        x = x + drop(self._cross(self.norms[1](x), memory, memory_mask, drop, m.get("src_attn")), p,
                     None if sub is None else sub[:, :, 1])
        x = x + drop(self.feed_forward(self.norms[2](x), drop, p, m.get("ff")), p, None if sub is None else sub[:, :, 2])
        return x, (k, v)

    def _cross(self, h: Tensor, memory: tuple[Tensor, Tensor], memory_mask: Tensor | None, drop: Drop,
               pm: Tensor | None) -> Tensor:
        """Cross-attention of h (N, T, d) over each row's image: rows are image-major, so the n·T
        queries of image b attend its memory together, which is never repeated per row."""
        a, (mk, mv) = self.src_attn, memory
        B = mk.shape[0]
        if pm is not None:  # (N, T, h, R) → (B, h, n·T, R)
            pm = pm.reshape(B, -1, *pm.shape[2:]).transpose(1, 2)
        att = attention(a.heads(a.q(h), B), mk, mv, memory_mask, drop.site(self.p, pm))  # (B, h, n·T, d_k)
        return a.merge(att, h.shape)


class Stack(nn.Module):
    """N layers and the final layer norm (the peer's ``Encoder`` / ``Decoder``)."""

    def __init__(self, layers: list[nn.Module], d_model: int):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = LayerNorm(d_model)


class Encoded(NamedTuple):
    """Images prepared once for decoding: each decoder layer's cross-attention keys and values."""

    keys: tuple[Tensor, ...]  # N_dec × (B, h, R, d_k)
    values: tuple[Tensor, ...]  # N_dec × (B, h, R, d_k)
    mask: Tensor | None  # (B, 1, 1, R) bool, True = a real region; or None
    per_image: int = 1  # decoding rows per image (set by expand)


class StaticKV(NamedTuple):
    """The fixed-size decoding state (``Transformer.init_static_state``): each row's position and the
    preallocated self-attention keys and values of every decoder layer, (k, v) per layer, each
    (rows, h, steps, d_k); a step writes position ``at[r]`` of row r and ``update`` moves it on.
    Beam search reorders its rows as any state's (``models.base.select_rows``)."""

    at: Tensor  # (rows,) long: the position the next step writes
    caches: tuple[Tensor, ...]  # 2 × N_dec tensors (rows, h, steps, d_k)

    def update(self, caches: tuple[Tensor, ...]) -> "StaticKV":
        """The state after one step that wrote ``caches``: every row one position on."""
        return StaticKV(self.at + 1, tuple(caches))


class Transformer(nn.Module):
    """The captioner of the module docstring, with the ``CaptionModel`` interface (models/base.py)."""

    uses_fc = False  # the peer's TransformerModel reads only the att features
    supports_fast = True  # static_token_logprobs, a preallocated cache (StaticKV): the fast path

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = c = config
        if c.d_model % c.num_att_heads:
            raise ValueError(f"d_model {c.d_model} is not a multiple of num_att_heads {c.num_att_heads}")
        self.att_embed = nn.Linear(c.att_feat_size, c.d_model)  # + ReLU + dropout drop_prob_lm
        self.encoder = Stack([EncoderLayer(c) for _ in range(c.N_enc)], c.d_model)
        self.decoder = Stack([DecoderLayer(c) for _ in range(c.N_dec)], c.d_model)
        self.embed = nn.Embedding(c.vocab_size + 1, c.d_model)  # × √d_model + PE, dropout
        self.generator = nn.Linear(c.d_model, c.vocab_size + 1)
        for name, p in self.named_parameters():  # the peer: Glorot for the encoder-decoder's matrices
            if p.dim() > 1 and not name.startswith("att_embed."):
                nn.init.xavier_uniform_(p)

    # -- images ------------------------------------------------------------------------------
    def encode(self, att: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
               drop: DropoutMasks | None = None) -> Encoded:
        """The memory of the B images and its keys and values for every decoder layer (``fc`` is
        not read). ``drop``: pre-drawn masks; the encoder's are their ``enc0``, ``enc1``, … (in site
        order, ``encoder_dropout``) or else drawn from their ``seed``."""
        c = self.config
        d = Drop(self.training)
        if drop is not None:
            d = Drop(self.training, replay=self._encoder_masks(drop, att.shape[0], att.shape[1]))
        mask = None if att_mask is None else att_mask.bool()[:, None, None, :]
        x = d(f32(F.relu(self.att_embed(att))), c.drop_prob_lm)  # the residual stream stays float32 under autocast
        for layer in self.encoder.layers:
            x = layer(x, mask, d)
        memory = self.encoder.norm(x)
        B = att.shape[0]
        layers = [layer.src_attn for layer in self.decoder.layers]
        return Encoded(tuple(a.heads(a.k(memory), B) for a in layers),
                       tuple(a.heads(a.v(memory), B) for a in layers), mask, 1)

    def _encoder_sites(self, B: int, R: int) -> list[tuple[float, tuple[int, ...]]]:
        """(p, shape) of every encoder dropout site, in the order ``encode`` reaches them: the att
        embedding, then per layer the attention probabilities, residual, FFN, residual."""
        c = self.config
        layer = [(c.dropout, (B, c.num_att_heads, R, R)), (c.dropout, (B, R, c.d_model)),
                 (c.dropout, (B, R, c.d_ff)), (c.dropout, (B, R, c.d_model))]
        return [(p, s) for p, s in [(c.drop_prob_lm, (B, R, c.d_model))] + layer * c.N_enc if p > 0]

    def _encoder_masks(self, drop: DropoutMasks, B: int, R: int) -> list[Tensor]:
        """The encoder's masks of ``drop``: its ``enc<i>`` masks, or else every site's drawn from a
        generator seeded with its ``seed`` (bool, in site order)."""
        if "seed" not in drop.image:
            return [drop.image[f"enc{i}"] for i in range(len(self._encoder_sites(B, R)))]
        gen = torch.Generator(device=self.generator.weight.device)
        gen.manual_seed(int(drop.image["seed"]))
        return [torch.empty(s, dtype=torch.bool, device=gen.device).bernoulli_(1 - p, generator=gen)
                for p, s in self._encoder_sites(B, R)]

    def traceable_dropout(self, drop: DropoutMasks, batch: int, regions: int) -> DropoutMasks:
        """``drop`` (for ``batch`` images of ``regions`` regions) with its encoder masks drawn from
        its ``seed`` now (``enc<i>``: the very masks ``encode`` would draw), so that a compiled pass
        reads them instead of seeding a generator, which a compiled region cannot."""
        if "seed" not in drop.image:
            return drop
        masks = self._encoder_masks(drop, batch, regions)
        return DropoutMasks({f"enc{i}": m for i, m in enumerate(masks)}, dict(drop.row))

    @staticmethod
    def expand(enc: Encoded, n: int) -> Encoded:
        """Each image serving n rows (row b*n + j is image b); nothing is copied."""
        return enc._replace(per_image=enc.per_image * n)

    def init_state(self, rows: int) -> tuple[Tensor, ...]:
        """Empty key/value caches: (k, v) of every decoder layer, each (rows, h, 0, d_k)."""
        c = self.config
        empty = self.generator.weight.new_zeros(rows, c.num_att_heads, 0, c.d_model // c.num_att_heads)
        return (empty,) * (2 * c.N_dec)

    def init_static_state(self, rows: int, steps: int) -> StaticKV:
        """A fixed-size decoding state for at most ``steps`` steps (``StaticKV``: each row's position,
        preallocated key/value caches (rows, h, steps, d_k), step t writing position t): every step
        has the same shapes (a compiled or captured sampling loop); the same numbers."""
        c = self.config
        cache = self.generator.weight.new_zeros(rows, c.num_att_heads, steps, c.d_model // c.num_att_heads)
        pos = torch.zeros(rows, dtype=torch.long, device=cache.device)
        return StaticKV(pos, tuple(cache.clone() for _ in range(2 * c.N_dec)))

    def draw_dropout(self, batch: int, rows: int, steps: int, regions: int,
                     generator: torch.Generator | None = None) -> DropoutMasks:
        """The masks of a sampling pass over ``batch`` images of ``regions`` regions and ``rows``
        caption rows of ``steps`` steps (module docstring), drawn from ``generator``."""
        c = self.config
        device = self.generator.weight.device
        L, h, d = c.N_dec, c.num_att_heads, c.d_model
        seed = torch.randint(2 ** 62, (1,), generator=generator, device=device)
        shapes = {"embed": (rows, steps, d), "sub": (rows, steps, L, 3, d), "ff": (rows, steps, L, c.d_ff),
                  "self_attn": (rows, steps, L, h, steps), "src_attn": (rows, steps, L, h, regions)}
        row = {k: torch.empty(s, dtype=torch.bool, device=device).bernoulli_(1 - c.dropout, generator=generator)
               for k, s in shapes.items()}
        return DropoutMasks(image={"seed": seed}, row=row)

    # -- the decoder ---------------------------------------------------------------------------
    def _decode(self, inputs: Tensor, enc: Encoded, past: tuple[Tensor, ...], masks: dict[str, Tensor] | None,
                at: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Decoder outputs (N, T, d) (after the final norm) for input word ids (N, T) at the
        positions after ``past`` (the key/value caches), and the caches extended by them.
        ``masks``: pre-drawn masks laid out (N, T, ...), or None for this mode's own dropout.
        ``at`` (N,): static decoding (T = 1), ``past`` preallocated and row r at position at[r]."""
        c = self.config
        drop = Drop(self.training)
        T, S = inputs.shape[1], past[0].shape[2]
        if at is None:
            pe = positional_encoding(S, T, c.d_model, inputs.device)
        else:  # the same rows of the same table: positional_encoding(t, 1) is row t of (0, S)
            pe = positional_encoding(0, S, c.d_model, inputs.device)[at].unsqueeze(1)
        x = self.embed(inputs) * math.sqrt(c.d_model) + pe
        x = drop(x, c.dropout, None if masks is None else masks["embed"])
        caches = []
        for i, layer in enumerate(self.decoder.layers):
            mi = None if masks is None else {k: v[:, :, i] for k, v in masks.items() if k != "embed"}
            x, kv = layer(x, (enc.keys[i], enc.values[i]), enc.mask, past[2 * i:2 * i + 2], drop, mi, at)
            caches += kv
        return self.decoder.norm(x), tuple(caches)

    def step(self, it: Tensor, enc: Encoded, state: tuple[Tensor, ...] | StaticKV,
             drop: dict[str, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, ...] | StaticKV]:
        """Feed word ids ``it`` (N,) (0 = BOS) at the position after the cached ones; log-probs
        (N, V + 1) of the next word and the caches one step longer (a ``StaticKV``,
        ``init_static_state``: the same shapes, written at each row's position, which moves on).
        ``drop``: this step's masks (``DropoutMasks.at(t)``), or None for this mode's own dropout."""
        masks = None if drop is None else {k: v.unsqueeze(1) for k, v in drop.items()}
        if isinstance(state, StaticKV):
            y, caches = self._decode(it.unsqueeze(1), enc, state.caches, masks, state.at)
            state = state.update(caches)
        else:
            y, state = self._decode(it.unsqueeze(1), enc, state, masks)
        return F.log_softmax(f32(self.generator(y[:, 0])), dim=-1), state

    # -- teacher forcing -----------------------------------------------------------------------
    def _teacher_forced(self, att: Tensor, inputs: Tensor, att_mask: Tensor | None,
                        drop: DropoutMasks | None) -> Tensor:
        """Decoder outputs (N, T, d) for input word ids (N, T) (inputs[:, 0] = 0 = BOS), in one pass."""
        B, (N, T) = att.shape[0], inputs.shape
        if N % B:
            raise ValueError(f"{N} captions for {B} images: each image needs the same number of captions")
        enc = self.expand(self.encode(att, att_mask, drop=drop), N // B)
        masks = None if drop is None else {k: v[:, :T] for k, v in drop.row.items()}
        return self._decode(inputs, enc, self.init_state(N), masks)[0]

    def forward(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                drop: DropoutMasks | None = None, fc: Tensor | None = None) -> Tensor:
        """Log-probs (B*n, L+1, V+1) under teacher forcing for seqs (B, n, L) or (B*n, L): input 0
        (BOS), then seqs[:, t-1]; output t predicts seqs[:, t] (t < L) and, at t = L, the EOS."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        y = self._teacher_forced(att, torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs], 1), att_mask, drop)
        return F.log_softmax(f32(self.generator(y)), dim=-1)

    def token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``sequence_logprobs(self(att, seqs), seqs)`` (token_logp, mask), both (N, L+1), faster:
        the decoder stops at the longest caption's EOS and the generator runs only on the tokens
        that count, with a fused log-softmax + gather."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = targets(seqs)
        T = max(int(mask.sum(1).max()), 1)  # positions needed
        inputs = torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs[:, :T - 1]], 1)
        y = self._teacher_forced(att, inputs, att_mask, drop)  # (N, T, d)
        keep = mask[:, :T]
        tok = token_logprob(self.generator(y[keep]), target[:, :T][keep].long())
        out = tok.new_zeros(mask.shape).masked_scatter(mask, tok)
        return out, mask.to(out.dtype)

    def static_token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                              drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``token_logprobs`` with every shape fixed by the inputs' shapes: the decoder runs all L+1
        positions and the generator every one (those past a caption's EOS are zeroed), nothing waits
        for the device -- the form a compiled step or a CUDA graph needs. The same numbers: attention
        is causal, so a position past the EOS never reaches an earlier one. ``drop`` (N, ≥ L+1 steps)."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = targets(seqs)
        y = self._teacher_forced(att, torch.cat([seqs.new_zeros(seqs.shape[0], 1), seqs], 1), att_mask, drop)
        tok = token_logprob(self.generator(y).flatten(0, 1), target.flatten().long()).view(target.shape)
        mask = mask.to(tok.dtype)
        return tok * mask, mask
