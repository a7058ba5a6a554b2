"""HFCaptioner: a pretrained Hugging Face ``VisionEncoderDecoderModel`` (a vision encoder with a
GPT-2 decoder) as an rdpp captioner (``--model hf --hf-model DIR``).

The vision encoder is frozen and runs once, at prepro time (``rdpp prepro --backbone hf:DIR``): its
last hidden states (B, R, D) are the data artifact's att features. This module is the decoder,
computed here from the ``GPT2LMHeadModel``'s own parameters (held as ``self.decoder``, so the state
dict is the Hugging Face one). With d the hidden size, h heads of d_k = d / h, s the attention scale
(1/√d_k when ``scale_attn_weights``, further / (layer + 1) when ``scale_attn_by_inverse_layer_idx``):

    encoder states  e = P(att)                      P = the model's ``enc_to_dec_proj`` when it has one
    input           x_t = Drop_e(wte[w_{t-1}] + wpe[t])    w_{-1} = decoder_start_token_id
    per layer       x ← x + Drop_r(c_proj(Drop_a(softmax(s q Kᵀ | causal)) V))       q, K, V = c_attn(ln_1(x))
                    x ← x + Drop_r(c_proj(Drop_a(softmax(s q Eᵀ)) F))               q = q_attn(ln_cross_attn(x)),
                                                                                   E, F = c_attn(e)
                    x ← x + Drop_r(mlp.c_proj(act(mlp.c_fc(ln_2(x)))))
    output          log p(w_t) = log_softmax(lm_head(ln_f(x_t)))

which is ``transformers``' GPT-2 forward (tests/test_model_hf.py: to 1e-5 in fp32 eval mode, and
greedy and beam-3 captions equal to ``generate``'s). Writing the pass out (instead of calling the
library's module) gives what rdpp's decoding and on-policy RL need: a decoding state of plain
tensors (per layer the self-attention keys and values so far, (N, h, t, d_k); beam search reorders
their rows), the cross-attention keys and values computed once per image in ``encode`` and shared
by its rows without a copy, and every dropout mask drawn in advance (``draw_dropout``).

**Token ids.** rdpp's id 0 is the EOS (and padding); the model's vocabulary has its own end token.
rdpp id 0 is the tokenizer's end token and ids 1 … V the model's other tokens in their order
(``hf_of[j]``: the Hugging Face id of rdpp id j; for GPT-2, whose end token is the last id, rdpp
id = Hugging Face id + 1). Decoding, the XE and RL steps and beam search all run on these ids; the
translation to and from the data artifact's words is ``TokenBridge`` (below; docs/model.md, "The
Hugging Face captioner").

Dropout drawn in advance (bool, kept = True, scaled by 1/(1 − p) where used), per caption row and
step: ``embed`` (N, S, d) (``embd_pdrop``), ``res`` (N, S, L, 3, d) the three residual dropouts
of each layer (``resid_pdrop``), ``self_attn`` (N, S, L, h, S) and ``cross_attn`` (N, S, L, h, R)
the attention probabilities (``attn_pdrop``). The encoder states carry no dropout.

``transformers`` is imported only when a model is built (the ``hf`` extra, ``pip install 'rdpp[hf]'``).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rdpp_cli.errors import RdppError
from rdpp_cli.models.base import DropoutMasks, targets

__all__ = ["HFCaptioner", "HFCaptionerConfig", "TokenBridge", "require_transformers", "read_folder"]

INSTALL = "pip install 'rdpp[hf]'"
TOKENS_PER_WORD = 2  # a caption of the data's L words is decoded to at most 2 L tokens


def require_transformers():
    """The ``transformers`` module; RdppError naming the extra to install without it."""
    try:
        import transformers
    except ImportError:
        raise RdppError(f"--model hf needs the transformers package, which is not installed; {INSTALL}") from None
    return transformers


@dataclass
class HFCaptionerConfig:
    """What builds the model without the folder it came from (saved in checkpoints): the Hugging
    Face config, the tokenizer's files and rdpp's sizes."""

    hf_config: dict  # VisionEncoderDecoderConfig.to_dict()
    tokenizer_files: dict = field(default_factory=dict)  # file name -> text (tokenizer.save_pretrained)
    vocab_size: int = 0  # V: rdpp ids 1 … V are the model's tokens other than the end token
    seq_length: int = 32  # the most tokens a caption is decoded to
    att_feat_size: int = 0  # the encoder's hidden size: the data artifact's att features
    eos_token_id: int = 0  # the Hugging Face id of the end token (rdpp id 0)
    decoder_start_token_id: int = 0  # the first input
    source: str = ""  # the folder it was read from
    encoder_sha256: str = ""  # of the folder's weights file (``weights_sha256``): its vision encoder's weights


# nothing to size: the folder is the model (both presets keep it as it is)


class Encoded(NamedTuple):
    """Images prepared once: each layer's cross-attention keys and values (B, h, R, d_k)."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    bias: Tensor | None  # (B, 1, 1, R): 0 for a real region, -inf for padding; or None
    per_image: int = 1  # rows per image (expand)


def _check_folder(path: Path, option: str) -> dict:
    """The folder's config.json, RdppError unless it is a VisionEncoderDecoderModel with a GPT-2 decoder."""
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise RdppError(f"{option}{path} has no config.json; pass a folder written by "
                        "VisionEncoderDecoderModel.save_pretrained")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (OSError, ValueError) as e:
        raise RdppError(f"{option}{path}: config.json cannot be read ({e}); pass a save_pretrained folder") from None
    if cfg.get("model_type") != "vision-encoder-decoder":
        raise RdppError(f"{option}{path} holds a {cfg.get('model_type')!r} model, not a VisionEncoderDecoderModel; "
                        "pass the folder of an image captioner such as nlpconnect/vit-gpt2-image-captioning")
    dec = cfg.get("decoder", {}).get("model_type")
    if dec != "gpt2":
        raise RdppError(f"{option}{path}: its decoder is {dec!r}; rdpp's hf model runs GPT-2 decoders; "
                        "pass a ViT-GPT2-style captioner")
    return cfg


def read_folder(path: str | Path, option: str = "--hf-model "):
    """(VisionEncoderDecoderModel in eval mode, tokenizer) of a save_pretrained folder; RdppError for
    a folder that is not one, or a tokenizer without an end token (``option`` names where it came from)."""
    path = Path(path)
    if not path.is_dir():
        raise RdppError(f"{option}{path} is not a folder; pass a VisionEncoderDecoderModel save_pretrained folder")
    _check_folder(path, option)
    tf = require_transformers()
    try:
        model = tf.VisionEncoderDecoderModel.from_pretrained(path)
        tok = tf.AutoTokenizer.from_pretrained(path)
    except _load_errors() as e:  # a file missing, cut short or damaged (a truncated model.safetensors)
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise RdppError(f"{option}{path} cannot be loaded ({first[:200]}); pass a complete save_pretrained folder "
                        "with its tokenizer") from None
    if end_token(model.config, tok) is None:
        raise RdppError(f"{option}{path}: its tokenizer has no end token (eos_token) and its config no "
                        "eos_token_id; set one in tokenizer_config.json")
    return model.eval(), tok


def _load_errors() -> tuple[type[BaseException], ...]:
    """What loading a damaged save_pretrained folder raises: a file missing or unreadable, JSON cut
    short, a safetensors file whose header or data is cut short (``SafetensorError``)."""
    from safetensors import SafetensorError

    return OSError, ValueError, RuntimeError, SafetensorError


def read_back(out: Path, model, tokenizer) -> None:
    """``LostWrite`` naming the file unless the folder ``out``, just saved from ``model`` and
    ``tokenizer``, loads back as them: every tensor equal, the same generation config and vocabulary
    (a write the disk lost while reporting success is found before the folder is renamed into place)."""
    from rdpp_cli.artifacts.files import LostWrite

    tf = require_transformers()
    lost = "(a write was lost although it reported success); nothing was replaced"
    try:
        again = tf.VisionEncoderDecoderModel.from_pretrained(out)
        tok = tf.AutoTokenizer.from_pretrained(out)
    except _load_errors() as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise LostWrite(5, f"read back after writing, it does not load ({first[:160]}) {lost}", str(out)) from None
    theirs, mine = again.state_dict(), model.state_dict()
    bad = [k for k, v in mine.items() if k not in theirs or not torch.equal(v, theirs[k])]
    if bad:
        raise LostWrite(5, f"read back after writing, {len(bad)} of {len(mine)} tensors differ from those written "
                           f"(such as {bad[0]}) {lost}", str(out / "model.safetensors"))
    if again.generation_config.to_dict() != model.generation_config.to_dict():
        raise LostWrite(5, f"read back after writing, its generation settings differ from those written {lost}",
                        str(out / "generation_config.json"))
    if tok.get_vocab() != tokenizer.get_vocab():
        raise LostWrite(5, f"read back after writing, its tokenizer differs from the one written {lost}", str(out))


def weights_sha256(folder: str | Path) -> str | None:
    """sha256 of a save_pretrained folder's weights file (its first ``*.safetensors``, else ``*.bin``;
    None without one): what a data artifact made with ``--backbone hf:DIR`` records as
    ``weights_sha256``, and what tells one encoder from another of the same config."""
    from rdpp_cli.artifacts import sha256_file

    files = sorted(Path(folder).glob("*.safetensors")) or sorted(Path(folder).glob("*.bin"))
    return sha256_file(files[0]) if files else None


def check_same_encoder(folder: str | Path, want: str | None, made: str, option: str) -> None:
    """RdppError unless ``folder``'s weights file has the sha256 ``want`` (None: nothing recorded,
    nothing to compare) that ``made`` (the data artifact or model whose features came from it) records."""
    got = weights_sha256(folder) if want else None
    if want and got != want:
        raise RdppError(f"{option}{folder}: its weights (sha256 {(got or 'none')[:12]}…) are not those of the vision "
                        f"encoder {made} was made with ({want[:12]}…), so the att features came from another "
                        "encoder; pass that folder, or make the data with this one (--backbone hf:DIR)")


def end_token(config, tokenizer) -> int | None:
    """The end token's id: the tokenizer's eos token, else the decoder config's eos_token_id."""
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos if eos is not None else getattr(config.decoder, "eos_token_id", None)


def _fit_limits(path: Path, decoder_config, tokens: int, seq_length: int) -> int:
    """``seq_length``, capped (with a note) where the decoder has fewer positions than a caption of
    that many tokens needs (the start token and the tokens: ``seq_length + 1``); RdppError for a
    tokenizer with more tokens than the decoder's embeddings (its ids would index past them)."""
    rows = decoder_config.vocab_size
    if tokens > rows:
        raise RdppError(f"--hf-model {path}: its tokenizer has {tokens} tokens but the decoder's embeddings hold {rows} "
                        "(vocab_size); pass a folder whose decoder was resized to its tokenizer "
                        "(model.decoder.resize_token_embeddings(len(tokenizer)), then save_pretrained)")
    positions = decoder_config.n_positions
    if seq_length + 1 > positions:
        from rdpp_cli.console import note

        note(f"--hf-model {path}: its decoder has {positions} positions, fewer than the {seq_length + 1} a caption of "
             f"{seq_length} tokens needs; captions are decoded to at most {positions - 1} tokens")
        seq_length = positions - 1
    return seq_length


def tokenizer_files(tokenizer) -> dict[str, str]:
    """The tokenizer's files as text (what ``save_pretrained`` writes), for a checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_text() for p in Path(tmp).iterdir() if p.is_file()}


def tokenizer_from_files(files: dict[str, str]):
    """The tokenizer ``tokenizer_files`` saved."""
    tf = require_transformers()
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)
        return tf.AutoTokenizer.from_pretrained(tmp)


class HFCaptioner(nn.Module):
    """The captioner of the module docstring, with the ``CaptionModel`` interface (models/base.py)."""

    uses_fc = False
    supports_fast = False

    def __init__(self, config: HFCaptionerConfig):
        super().__init__()
        tf = require_transformers()
        self.config = c = config
        vcfg = tf.VisionEncoderDecoderConfig.from_dict(c.hf_config)
        dcfg = vcfg.decoder
        self.decoder = tf.GPT2LMHeadModel(dcfg)
        self.enc_to_dec_proj = (nn.Linear(vcfg.encoder.hidden_size, dcfg.hidden_size)
                                if vcfg.encoder.hidden_size != dcfg.hidden_size
                                and getattr(dcfg, "cross_attention_hidden_size", None) is None else None)
        self.p_embed, self.p_res, self.p_attn = dcfg.embd_pdrop, dcfg.resid_pdrop, dcfg.attn_pdrop
        self.heads, self.d = dcfg.num_attention_heads, dcfg.hidden_size
        scale = (self.d // self.heads) ** -0.5 if dcfg.scale_attn_weights else 1.0
        self.scales = [scale / (i + 1) if dcfg.scale_attn_by_inverse_layer_idx else scale
                       for i in range(dcfg.num_hidden_layers)]
        V1 = dcfg.vocab_size
        hf_of = torch.tensor([c.eos_token_id] + [i for i in range(V1) if i != c.eos_token_id])
        self.register_buffer("hf_of", hf_of, persistent=False)  # rdpp id -> Hugging Face id
        self._tokenizer = None

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, path: str | Path, seq_length: int | None = None, data_seq_length: int = 16) -> "HFCaptioner":
        """The model of a save_pretrained folder, with its weights and tokenizer; captions of at most
        ``seq_length`` tokens (default ``TOKENS_PER_WORD`` × the data's ``data_seq_length`` words)."""
        seq_length = seq_length or TOKENS_PER_WORD * data_seq_length
        hf, tok = read_folder(path)
        vcfg = hf.config
        seq_length = _fit_limits(Path(path), vcfg.decoder, len(tok), seq_length)
        start = vcfg.decoder_start_token_id
        if start is None:
            start = vcfg.decoder.bos_token_id if vcfg.decoder.bos_token_id is not None else end_token(vcfg, tok)
        config = HFCaptionerConfig(
            hf_config=vcfg.to_dict(), tokenizer_files=tokenizer_files(tok), vocab_size=vcfg.decoder.vocab_size - 1,
            seq_length=seq_length, att_feat_size=vcfg.encoder.hidden_size, eos_token_id=int(end_token(vcfg, tok)),
            decoder_start_token_id=int(start), source=str(Path(path).resolve()),
            encoder_sha256=weights_sha256(path) or "")
        model = cls(config)
        model.decoder.load_state_dict(hf.decoder.state_dict())
        if model.enc_to_dec_proj is not None:
            model.enc_to_dec_proj.load_state_dict(hf.enc_to_dec_proj.state_dict())
        model._tokenizer = tok
        return model.eval()

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = tokenizer_from_files(self.config.tokenizer_files)
        return self._tokenizer

    def bridge(self, words: list[str], data_seq_length: int) -> "TokenBridge":
        """The translation between this model's token ids and a data artifact's ``words``."""
        return TokenBridge(self.tokenizer, self.hf_of.cpu(), words, data_seq_length, self.config.seq_length)

    def check_data(self, data_config: dict, data_path: Path, option: str) -> None:
        """RdppError unless this model's folder holds the vision encoder that made the data's att
        features (the data artifact's ``weights_sha256``, when it was made with ``--backbone hf:DIR``)."""
        if str(data_config.get("backbone", "")).startswith("hf:"):
            check_same_encoder(self.config.source, data_config.get("weights_sha256"), f"data artifact {data_path}",
                               option)

    def export(self, out: Path, encoder_folder: str | Path) -> None:
        """Write this model as a Hugging Face folder (``VisionEncoderDecoderModel.save_pretrained``,
        the tokenizer and the image processor) into ``out`` (an empty folder): the vision encoder and
        image processor of ``encoder_folder`` (the folder the model came from: its weights file has
        the ``encoder_sha256`` recorded in training), this decoder."""
        tf = require_transformers()
        check_same_encoder(encoder_folder, self.config.encoder_sha256 or None, "this model", "--hf-model ")
        hf, _ = read_folder(encoder_folder)
        mine = tf.VisionEncoderDecoderConfig.from_dict(self.config.hf_config).encoder.to_dict()
        if {k: v for k, v in hf.config.encoder.to_dict().items() if k != "_name_or_path"} != \
                {k: v for k, v in mine.items() if k != "_name_or_path"}:
            raise RdppError(f"--hf-model {encoder_folder}: its vision encoder is not the one this model was trained "
                            f"with (its config differs from {self.config.source or 'the checkpoint'}'s); pass that folder")
        hf.decoder.load_state_dict(self.decoder.state_dict())
        if self.enc_to_dec_proj is not None:
            hf.enc_to_dec_proj.load_state_dict(self.enc_to_dec_proj.state_dict())
        hf.generation_config.decoder_start_token_id = self.config.decoder_start_token_id
        hf.generation_config.eos_token_id = self.config.eos_token_id
        # rdpp's captions hold at most seq_length tokens: generate ends one cut there with the end token
        hf.generation_config.max_new_tokens = self.config.seq_length + 1
        hf.generation_config.forced_eos_token_id = self.config.eos_token_id
        hf.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        try:
            tf.AutoImageProcessor.from_pretrained(encoder_folder).save_pretrained(out)
        except (OSError, ValueError):
            pass  # a folder without an image processor: the model still loads
        read_back(out, hf, self.tokenizer)

    # -- the CaptionModel interface --------------------------------------------------------------
    def encode(self, att: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
               drop: DropoutMasks | None = None) -> Encoded:
        """Each layer's cross-attention keys and values of the B images' encoder states (once per image)."""
        e = att
        if self.enc_to_dec_proj is not None:
            e = self.enc_to_dec_proj(e)
        keys, values = [], []
        for blk in self.decoder.transformer.h:
            k, v = blk.crossattention.c_attn(e).split(self.d, 2)
            keys.append(self._heads(k))
            values.append(self._heads(v))
        bias = None
        if att_mask is not None:
            bias = torch.zeros(att_mask.shape, dtype=keys[0].dtype, device=att.device)
            bias = bias.masked_fill(att_mask == 0, float("-inf"))[:, None, None, :]
        return Encoded(tuple(keys), tuple(values), bias)

    @staticmethod
    def expand(enc: Encoded, n: int) -> Encoded:
        """Each image serving n rows (row b*n + j is image b); nothing is copied."""
        return enc._replace(per_image=enc.per_image * n)

    def init_state(self, rows: int) -> tuple[Tensor, ...]:
        """Empty key/value caches: (k, v) of every layer, each (rows, h, 0, d_k)."""
        w = self.decoder.transformer.wte.weight
        empty = w.new_zeros(rows, self.heads, 0, self.d // self.heads)
        return (empty,) * (2 * len(self.decoder.transformer.h))

    def step(self, it: Tensor, enc: Encoded, state: tuple[Tensor, ...], drop: dict[str, Tensor] | None = None
             ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Log-probs (N, V+1) of the next token after feeding rdpp ids ``it`` (N,) (the start token
        at the first step), and the caches extended by it."""
        t0 = state[0].shape[2]
        ids = (torch.full_like(it, self.config.decoder_start_token_id) if t0 == 0 else self.hf_of[it]).unsqueeze(1)
        masks = None if drop is None else {k: v.unsqueeze(1) for k, v in drop.items()}
        y, state = self._decode(ids, enc, state, masks)
        return self._logprobs(y[:, 0]), state

    def forward(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                drop: DropoutMasks | None = None, fc: Tensor | None = None) -> Tensor:
        """Log-probs (N, L+1, V+1) under teacher forcing of rdpp ids ``seqs`` (B, n, L) or (N, L)."""
        return self._logprobs(self._teacher_forced(att, seqs, att_mask, drop))

    def token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``sequence_logprobs(self(att, seqs), seqs)``: (token_logp, mask), both (N, L+1), without
        reordering the whole output: the target's logit (at its Hugging Face id) minus the logsumexp."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = targets(seqs)
        y = self._teacher_forced(att, seqs, att_mask, drop)
        logits = self.decoder.lm_head(self.decoder.transformer.ln_f(y)).float()
        logp = logits.gather(2, self.hf_of[target].unsqueeze(2)).squeeze(2) - logits.logsumexp(-1)
        mask = mask.to(logp.dtype)
        return logp * mask, mask

    def _teacher_forced(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None,
                        drop: DropoutMasks | None) -> Tensor:
        """Hidden states (N, L+1, d) before ``ln_f``: the start token, then ``seqs`` (rdpp ids)."""
        B = att.shape[0]
        seqs = seqs.reshape(-1, seqs.shape[-1])
        N, L = seqs.shape
        start = seqs.new_full((N, 1), self.config.decoder_start_token_id)
        ids = torch.cat([start, self.hf_of[seqs]], 1)
        masks = None
        if drop is not None:
            masks = {k: v[:, :L + 1] for k, v in drop.row.items()}
            masks["self_attn"] = masks["self_attn"][..., :L + 1]
        enc = self.expand(self.encode(att, att_mask), N // B)
        return self._decode(ids, enc, self.init_state(N), masks)[0]

    def draw_dropout(self, batch: int, rows: int, steps: int, regions: int,
                     generator: torch.Generator | None = None) -> DropoutMasks:
        """The masks of a sampling pass (module docstring), drawn from ``generator``."""
        device = self.hf_of.device
        L, h, d = len(self.decoder.transformer.h), self.heads, self.d
        spec = {"embed": ((rows, steps, d), self.p_embed), "res": ((rows, steps, L, 3, d), self.p_res),
                "self_attn": ((rows, steps, L, h, steps), self.p_attn),
                "cross_attn": ((rows, steps, L, h, regions), self.p_attn)}
        row = {k: torch.empty(s, dtype=torch.bool, device=device).bernoulli_(1 - p, generator=generator)
               for k, (s, p) in spec.items()}
        return DropoutMasks(row=row)

    # -- the decoder -----------------------------------------------------------------------------
    def _heads(self, x: Tensor) -> Tensor:
        return x.view(*x.shape[:-1], self.heads, -1).transpose(-3, -2)  # (..., T, d) -> (..., h, T, d_k)

    def _drop(self, x: Tensor, p: float, mask: Tensor | None) -> Tensor:
        if mask is not None:
            return x * mask.to(x.dtype) * (1.0 / (1.0 - p)) if p > 0 else x
        return F.dropout(x, p, True) if self.training and p > 0 else x

    def _logprobs(self, y: Tensor) -> Tensor:
        logits = self.decoder.lm_head(self.decoder.transformer.ln_f(y)).float()
        return F.log_softmax(logits, dim=-1).index_select(-1, self.hf_of)

    def _decode(self, ids: Tensor, enc: Encoded, past: tuple[Tensor, ...], masks: dict[str, Tensor] | None
                ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Hidden states (N, T, d) before ``ln_f`` for Hugging Face ids (N, T) at the positions after
        ``past``, and the caches extended by them. ``masks``: laid out (N, T, ...), or None."""
        tr = self.decoder.transformer
        t0, T = past[0].shape[2], ids.shape[1]
        x = tr.wte(ids) + tr.wpe(torch.arange(t0, t0 + T, device=ids.device))
        x = self._drop(x, self.p_embed, None if masks is None else masks["embed"])
        caches: list[Tensor] = []
        for i, blk in enumerate(tr.h):
            mi = None if masks is None else {k: v[:, :, i] for k, v in masks.items() if k != "embed"}
            x, kv = self._layer(i, blk, x, enc, past[2 * i:2 * i + 2], mi or {})
            caches += kv
        return x, tuple(caches)

    def _layer(self, i: int, blk: nn.Module, x: Tensor, enc: Encoded, past: tuple[Tensor, Tensor],
               m: dict[str, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        N, T, d = x.shape
        res = m.get("res")
        q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(d, 2)
        k, v = torch.cat([past[0], self._heads(k)], 2), torch.cat([past[1], self._heads(v)], 2)
        w = (self._heads(q) @ k.transpose(-1, -2)) * self.scales[i]  # (N, h, T, t0 + T)
        if T > 1:
            t0 = k.shape[2] - T
            causal = torch.arange(k.shape[2], device=x.device)[None, :] > (t0 + torch.arange(T, device=x.device))[:, None]
            w = w.masked_fill(causal, float("-inf"))
        pm = m.get("self_attn")
        w = self._drop(w.softmax(-1), self.p_attn, None if pm is None else pm[..., :k.shape[2]].transpose(1, 2))
        a = (w @ v).transpose(1, 2).reshape(N, T, d)
        x = x + self._drop(blk.attn.c_proj(a), self.p_res, None if res is None else res[:, :, 0])
        ca = blk.crossattention
        a = self._cross(self._heads(ca.q_attn(blk.ln_cross_attn(x))), enc, i, m.get("cross_attn"))
        x = x + self._drop(ca.c_proj(a), self.p_res, None if res is None else res[:, :, 1])
        mlp = blk.mlp
        x = x + self._drop(mlp.c_proj(mlp.act(mlp.c_fc(blk.ln_2(x)))), self.p_res, None if res is None else res[:, :, 2])
        return x, (k, v)

    def _cross(self, q: Tensor, enc: Encoded, i: int, pm: Tensor | None) -> Tensor:
        """Cross-attention of queries (N, h, T, d_k) over their images' encoder states; the n rows of
        an image attend together (its keys and values are not copied). ``pm``: (N, T, h, R) or None."""
        N, h, T, dk = q.shape
        k, v = enc.keys[i], enc.values[i]
        B, n = k.shape[0], enc.per_image
        qb = q.reshape(B, n, h, T, dk).transpose(1, 2).reshape(B, h, n * T, dk)
        w = (qb @ k.transpose(-1, -2)) * self.scales[i]  # (B, h, nT, R)
        if enc.bias is not None:
            w = w + enc.bias
        if pm is not None:
            pm = pm.reshape(B, n, T, h, -1).permute(0, 3, 1, 2, 4).reshape(B, h, n * T, -1)
        w = self._drop(w.softmax(-1), self.p_attn, pm)
        return (w @ v).view(B, h, n, T, dk).permute(0, 2, 3, 1, 4).reshape(N, T, h * dk)


# ----------------------------------------------------------------------------------------------
# the bridge between the model's tokens and the data artifact's words
# ----------------------------------------------------------------------------------------------

class TokenBridge:
    """The translation between a tokenizer's ids (as rdpp ids: 0 = the end token, ``hf_of``) and a
    data artifact's words (``words[i]`` has id i + 1, 0 = EOS/padding).

    - ``model_labels``: the data's word labels (..., L) -> the model's ids (..., T) for XE: the words
      joined by spaces, tokenized by the model's tokenizer, clipped to ``max_len`` tokens
      (remembered per caption, so an epoch tokenizes each reference once);
    - ``texts``: the model's ids -> captions as text (the tokenizer's decoding, then rdpp's word
      rule, ``data.karpathy.tokenize``: lower case, [a-z0-9]+ words, joined by spaces);
    - ``data_ids``: the model's ids -> the data's word ids (unknown words UNK, clipped to the
      data's caption length): what the training reward (CIDEr-D on words) reads.
    """

    def __init__(self, tokenizer, hf_of: Tensor, words: list[str], data_seq_length: int, max_len: int):
        from rdpp_cli.data.vocab import UNK

        self.tokenizer, self.words, self.data_seq_length, self.max_len = tokenizer, list(words), data_seq_length, max_len
        self.hf_of = hf_of.numpy()
        self.rdpp_of = np.zeros(len(self.hf_of), dtype=np.int64)
        self.rdpp_of[self.hf_of] = np.arange(len(self.hf_of))
        self.w2i = {w: i + 1 for i, w in enumerate(self.words)}
        self.unk = self.w2i.get(UNK, 0)
        self.unk_id = None  # the model's vocabulary has no UNK to suppress
        self._labels: dict[bytes, np.ndarray] = {}

    def rdpp_of_ids(self, ids) -> np.ndarray:
        """The rdpp ids of Hugging Face token ids."""
        return self.rdpp_of[np.asarray(ids, dtype=np.int64)]

    def _tokens(self, row: np.ndarray) -> np.ndarray:
        key = row.tobytes()
        got = self._labels.get(key)
        if got is None:
            from rdpp_cli.data.vocab import decode_ids

            text = decode_ids(self.words, row)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:self.max_len]
            got = self._labels[key] = self.rdpp_of[np.asarray(ids, dtype=np.int64)] if ids else np.zeros(0, np.int64)
        return got

    def model_labels(self, labels: Tensor) -> Tensor:
        """Word labels (..., L) -> token labels (..., T) (rdpp ids, 0-padded), T the longest."""
        flat = labels.reshape(-1, labels.shape[-1]).cpu().numpy().astype(np.int32)
        toks = [self._tokens(r) for r in flat]
        out = np.zeros((len(toks), max([len(t) for t in toks] + [1])), dtype=np.int64)
        for i, t in enumerate(toks):
            out[i, :len(t)] = t
        return torch.from_numpy(out).view(*labels.shape[:-1], -1).to(labels.device)

    def texts(self, tokens) -> list[str]:
        """Token ids (N, T) (stopping at each row's first 0) -> captions as space-joined words."""
        from rdpp_cli.data.karpathy import tokenize

        out = []
        for row in np.asarray(tokens.cpu() if isinstance(tokens, Tensor) else tokens).reshape(-1, np.shape(tokens)[-1]):
            end = int(np.argmax(row == 0)) if (row == 0).any() else len(row)
            text = self.tokenizer.decode(self.hf_of[row[:end]].tolist(), skip_special_tokens=True)
            out.append(" ".join(tokenize(text)))
        return out

    def data_ids(self, tokens) -> np.ndarray:
        """Token ids (..., T) -> the data's word ids (..., data_seq_length) int32, UNK for unknown words."""
        shape = np.shape(tokens)[:-1]
        out = np.zeros((int(np.prod(shape)), self.data_seq_length), dtype=np.int32)
        for i, text in enumerate(self.texts(tokens)):
            ids = [self.w2i.get(w, self.unk) for w in text.split()][:self.data_seq_length]
            out[i, :len(ids)] = ids
        return out.reshape(*shape, self.data_seq_length)
