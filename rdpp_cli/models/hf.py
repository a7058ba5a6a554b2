"""HFCaptioner: a pretrained Hugging Face image captioner as an rdpp captioner (``--model hf
--hf-model DIR``), run by ``transformers``' own forward and key/value cache.

Three kinds of folder (``rdpp_cli.hf_folder``, docs/model.md "The Hugging Face captioner"):

==========================  ============================================  =====================================
folder                      the decoder rdpp trains (``self.decoder``)    how it reads the att features
==========================  ============================================  =====================================
VisionEncoderDecoderModel   its ``decoder``: any causal LM transformers    cross-attention over them (after the
                            runs with cross-attention (GPT-2, BERT,        model's ``enc_to_dec_proj`` when it
                            RoBERTa...), and ``enc_to_dec_proj``           has one)
BlipForConditionalGen.      its ``text_decoder`` (BERT-style)              cross-attention over them
GitForCausalLM              all of it but ``git.image_encoder``            projected by ``visual_projection`` and
                                                                           put before the text tokens
==========================  ============================================  =====================================

The vision encoder is frozen and runs once, at prepro time (``rdpp prepro --backbone hf:DIR``): its
last hidden states (B, R, D) are the data artifact's att features. ``encode`` prepares them once per
image; ``expand`` repeats them to the n rows of each image. Every pass is the library's forward of
``self.decoder`` (whose state dict is the Hugging Face one): teacher forcing is one call over the
start token and the caption; decoding calls it a token at a time with the library's cache, whose
tensors (per layer the self-attention keys and values so far and, for cross-attention, the image's
keys and values, each (N, h, t, d_k)) are the decoding state, so that beam search reorders their
rows (models/base.py, ``select_rows``).

**Token ids.** rdpp's id 0 is the EOS (and padding); the model's vocabulary has its own end token.
rdpp id 0 is the model's end token and ids 1 … V the model's other tokens in their order
(``hf_of[j]``: the Hugging Face id of rdpp id j). The end token is the one each kind's ``generate``
stops at (``hf_folder.end_token``) and the start token its first input (``hf_folder.start_token``).
The translation to and from the data artifact's words is ``models.bridge.TokenBridge``.

**On-policy RL.** The library draws its dropout inside its modules, so a sampling pass's masks cannot
be replayed. The rule instead: a pass given dropout masks (``draw_dropout``, what ``rdpp finetune``
draws for its on-policy samples and passes again to the log-probs that carry the gradient) runs
without dropout, as in eval mode. So the samples and their log-probs come from the same
distribution; XE training (no masks given) keeps the model's dropout.

``transformers`` is imported only when a model is built (the ``hf`` extra, ``pip install 'rdpp[hf]'``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rdpp_cli.errors import RdppError
from rdpp_cli.hf_folder import (check_same_encoder, end_token, positions, read_back, read_folder, require_transformers,
                                start_token, text_config, tokenizer_files, tokenizer_from_files, vision_config,
                                weights_sha256)
from rdpp_cli.models.base import DropoutMasks, targets
from rdpp_cli.models.bridge import TokenBridge

__all__ = ["HFCaptioner", "HFCaptionerConfig"]

TOKENS_PER_WORD = 2  # a caption of the data's L words is decoded to at most 2 L tokens


@dataclass
class HFCaptionerConfig:
    """What builds the model without the folder it came from (saved in checkpoints): the Hugging
    Face config, the tokenizer's files and rdpp's sizes."""

    hf_config: dict  # the folder's config (to_dict())
    tokenizer_files: dict = field(default_factory=dict)  # file name -> text (tokenizer.save_pretrained)
    vocab_size: int = 0  # V: rdpp ids 1 … V are the model's tokens other than the end token
    seq_length: int = 32  # the most tokens a caption is decoded to
    att_feat_size: int = 0  # the vision encoder's hidden size: the data artifact's att features
    eos_token_id: int = 0  # the Hugging Face id of the end token (rdpp id 0)
    decoder_start_token_id: int = 0  # the first input
    source: str = ""  # the folder it was read from
    encoder_sha256: str = ""  # of the folder's weights file (``weights_sha256``): its vision encoder's weights
    kind: str = "ved"  # hf_folder.KINDS: ved (VisionEncoderDecoderModel), blip, git


class Encoded(NamedTuple):
    """The images' encoder states as the decoder reads them, one row per caption row after ``expand``
    (``per_image`` rows an image), and once per image (``images``, ``image_mask``): the first step,
    the same start token on every row of an image, runs once per image (the cross-attention keys
    and values, GIT's image tokens) and is repeated to its rows."""

    states: Tensor  # (N, R, D)
    mask: Tensor | None  # (N, R) 1 for a real region, 0 for padding; or None
    images: Tensor  # (B, R, D)
    image_mask: Tensor | None  # (B, R)
    per_image: int = 1


class GivenFeatures(nn.Module):
    """GIT's ``image_encoder`` in rdpp: the att features (passed as ``pixel_values`` (N, 1, R, D),
    the rank GIT's forward expects of an image) are its last hidden states."""

    def forward(self, pixel_values: Tensor, **_: Any):
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=pixel_values[:, 0])


def full_config(kind: str, hf_config: dict):
    """The folder's transformers config of ``kind`` from its dict."""
    tf = require_transformers()
    cls = {"ved": tf.VisionEncoderDecoderConfig, "blip": tf.BlipConfig, "git": tf.GitConfig}[kind]
    return cls.from_dict(hf_config)


def _fit_limits(path: Path, text_cfg, tokens: int, seq_length: int) -> int:
    """``seq_length``, capped (with a note) where the decoder embeds fewer positions than a caption
    of that many tokens needs (the start token and the tokens: ``seq_length + 1``); RdppError for a
    tokenizer with more tokens than the decoder's embeddings (its ids would index past them)."""
    rows = text_cfg.vocab_size
    if tokens > rows:
        raise RdppError(f"--hf-model {path}: its tokenizer has {tokens} tokens but the decoder's embeddings hold {rows} "
                        "(vocab_size); pass a folder whose decoder was resized to its tokenizer "
                        "(resize_token_embeddings(len(tokenizer)), then save_pretrained)")
    limit = positions(text_cfg)
    if seq_length + 1 > limit:
        from rdpp_cli.console import note

        note(f"--hf-model {path}: its decoder has {limit} positions, fewer than the {seq_length + 1} a caption of "
             f"{seq_length} tokens needs; captions are decoded to at most {limit - 1} tokens")
        seq_length = limit - 1
    return seq_length


def _dynamic_cache(pairs: list[tuple[Tensor, Tensor]]):
    """A ``DynamicCache`` holding each layer's (keys, values) as they are (``DynamicCache(pairs)``
    would copy them into its layers)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache()
    for k, v in pairs:
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        cache.layers.append(layer)
    return cache


class HFCaptioner(nn.Module):
    """The captioner of the module docstring, with the ``CaptionModel`` interface (models/base.py)."""

    uses_fc = False
    supports_fast = False

    def __init__(self, config: HFCaptionerConfig):
        super().__init__()
        tf = require_transformers()
        self.config = c = config
        full = full_config(c.kind, c.hf_config)
        tcfg = text_config(c.kind, full)
        self.max_decode_len = positions(tcfg) - 1  # the most tokens a caption can take after the start token
        self.enc_to_dec_proj = None
        if c.kind == "ved":
            self.decoder = tf.AutoModelForCausalLM.from_config(tcfg)
            own_width = getattr(tcfg, "cross_attention_hidden_size", None) is not None
            if full.encoder.hidden_size != tcfg.hidden_size and not own_width:
                self.enc_to_dec_proj = nn.Linear(full.encoder.hidden_size, tcfg.hidden_size)
        elif c.kind == "blip":
            from transformers.models.blip.modeling_blip_text import BlipTextLMHeadModel

            self.decoder = BlipTextLMHeadModel(tcfg)
        else:
            self.decoder = tf.GitForCausalLM(full)
            self.decoder.git.image_encoder = GivenFeatures()  # the att features are its output
        self.cross = c.kind != "git"  # the image is read by cross-attention (else: tokens before the text)
        hf_of = torch.tensor([c.eos_token_id] + [i for i in range(tcfg.vocab_size) if i != c.eos_token_id])
        self.register_buffer("hf_of", hf_of, persistent=False)  # rdpp id -> Hugging Face id
        self._tokenizer = None

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, path: str | Path, seq_length: int | None = None, data_seq_length: int = 16) -> "HFCaptioner":
        """The model of a save_pretrained folder, with its weights and tokenizer; captions of at most
        ``seq_length`` tokens (default ``TOKENS_PER_WORD`` × the data's ``data_seq_length`` words),
        fewer where the decoder has fewer positions."""
        seq_length = seq_length or TOKENS_PER_WORD * data_seq_length
        hf, tok, kind = read_folder(path)
        tcfg = text_config(kind, hf.config)
        seq_length = _fit_limits(Path(path), tcfg, len(tok), seq_length)
        config = HFCaptionerConfig(
            hf_config=hf.config.to_dict(), tokenizer_files=tokenizer_files(tok), vocab_size=tcfg.vocab_size - 1,
            seq_length=seq_length, att_feat_size=vision_config(kind, hf.config).hidden_size,
            eos_token_id=int(end_token(kind, hf.config, tok)), decoder_start_token_id=start_token(kind, hf.config, tok),
            source=str(Path(path).resolve()), encoder_sha256=weights_sha256(path) or "", kind=kind)
        model = cls(config)
        model._load_from(hf)
        model._tokenizer = tok
        return model.eval()

    def _parts(self, hf) -> list[tuple[nn.Module, nn.Module]]:
        """(this model's module, the module of the full transformers model ``hf`` it is)."""
        if self.config.kind == "ved":
            pairs = [(self.decoder, hf.decoder)]
            return pairs + ([(self.enc_to_dec_proj, hf.enc_to_dec_proj)] if self.enc_to_dec_proj is not None else [])
        return [(self.decoder, hf.text_decoder if self.config.kind == "blip" else hf)]

    def _load_from(self, hf) -> None:
        """This model's weights from the full model ``hf`` (GIT: all of it but its image encoder)."""
        for mine, theirs in self._parts(hf):
            state = {k: v for k, v in theirs.state_dict().items() if not k.startswith("git.image_encoder.")}
            mine.load_state_dict(state)

    def _save_into(self, hf) -> None:
        """This model's weights into the full model ``hf`` (its image encoder left as it is)."""
        for mine, theirs in self._parts(hf):
            missing, unexpected = theirs.load_state_dict(mine.state_dict(), strict=False)
            if unexpected or any(not k.startswith("git.image_encoder.") for k in missing):
                bad = (unexpected or missing)[:3]
                raise RuntimeError(f"the decoder's weights do not fit {type(hf).__name__}: {bad}")

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = tokenizer_from_files(self.config.tokenizer_files)
        return self._tokenizer

    def bridge(self, words: list[str], data_seq_length: int) -> TokenBridge:
        """The translation between this model's token ids and a data artifact's ``words``."""
        return TokenBridge(self.tokenizer, self.hf_of.cpu(), words, data_seq_length, self.config.seq_length)

    def check_data(self, data_config: dict, data_path: Path, option: str) -> None:
        """RdppError unless this model's folder holds the vision encoder that made the data's att
        features (the data artifact's ``weights_sha256``, when it was made with ``--backbone hf:DIR``)."""
        if str(data_config.get("backbone", "")).startswith("hf:"):
            check_same_encoder(self.config.source, data_config.get("weights_sha256"), f"data artifact {data_path}",
                               option)

    def export(self, out: Path, encoder_folder: str | Path) -> None:
        """Write this model as a Hugging Face folder (the full model's ``save_pretrained``, the
        tokenizer and the image processor) into ``out`` (an empty folder): the vision encoder and
        image processor of ``encoder_folder`` (the folder the model came from: its weights file has
        the ``encoder_sha256`` recorded in training), this decoder. The generation config ends a
        caption where rdpp's do: at the end token, or forced after ``seq_length`` tokens."""
        check_same_encoder(encoder_folder, self.config.encoder_sha256 or None, "this model", "--hf-model ")
        hf, _, kind = read_folder(encoder_folder)
        mine = vision_config(self.config.kind, full_config(self.config.kind, self.config.hf_config)).to_dict()
        theirs = vision_config(kind, hf.config).to_dict() if kind == self.config.kind else {}
        if {k: v for k, v in theirs.items() if k != "_name_or_path"} != \
                {k: v for k, v in mine.items() if k != "_name_or_path"}:
            raise RdppError(f"--hf-model {encoder_folder}: its vision encoder is not the one this model was trained "
                            f"with (its config differs from {self.config.source or 'the checkpoint'}'s); pass that folder")
        self._save_into(hf)
        gen = hf.generation_config
        if kind == "ved":
            gen.decoder_start_token_id = self.config.decoder_start_token_id
        gen.eos_token_id = self.config.eos_token_id
        # rdpp's captions hold at most seq_length tokens: generate ends one cut there with the end token
        gen.max_new_tokens = self.config.seq_length + 1
        gen.forced_eos_token_id = self.config.eos_token_id
        hf.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        tf = require_transformers()
        try:
            tf.AutoImageProcessor.from_pretrained(encoder_folder).save_pretrained(out)
        except (OSError, ValueError):
            pass  # a folder without an image processor: the model still loads
        read_back(out, hf, self.tokenizer)

    # -- the CaptionModel interface --------------------------------------------------------------
    def encode(self, att: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
               drop: DropoutMasks | None = None) -> Encoded:
        """The B images' encoder states as the decoder reads them (once per image)."""
        states = self.enc_to_dec_proj(att) if self.enc_to_dec_proj is not None else att
        mask = None if att_mask is None else att_mask.long()
        return Encoded(states, mask, states, mask)

    @staticmethod
    def expand(enc: Encoded, n: int) -> Encoded:
        """Each image serving n rows (row b*n + j is image b)."""
        if n == 1:
            return enc
        return enc._replace(states=enc.states.repeat_interleave(n, 0), per_image=enc.per_image * n,
                            mask=None if enc.mask is None else enc.mask.repeat_interleave(n, 0))

    def init_state(self, rows: int) -> tuple[Tensor, ...]:
        """No cache yet: only the step counter, a (rows, t) tensor of t tokens fed so far."""
        return (self.hf_of.new_zeros(rows, 0),)

    def step(self, it: Tensor, enc: Encoded, state: tuple[Tensor, ...], drop: dict[str, Tensor] | None = None
             ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Log-probs (N, V+1) of the next token after feeding rdpp ids ``it`` (N,) (the start token
        at the first step), and the cache extended by it."""
        t0, N = state[0].shape[1], it.shape[0]
        counter = state[0].new_zeros(N, t0 + 1)
        with self._dropout(drop):
            if t0 == 0 and enc.per_image > 1 and not (self.decoder.training and drop is None):
                # the start token on every row: once per image, then repeated to its rows
                once = Encoded(enc.images, enc.image_mask, enc.images, enc.image_mask)
                ids = it.new_full((enc.images.shape[0], 1), self.config.decoder_start_token_id)
                logits, cache = self._run(ids, once, self._cache(()), 0)
                rows = tuple(t.repeat_interleave(enc.per_image, 0) for t in self._tensors(cache))
                return self._logprobs(logits[:, -1]).repeat_interleave(enc.per_image, 0), (counter, *rows)
            ids = (torch.full_like(it, self.config.decoder_start_token_id) if t0 == 0 else self.hf_of[it]).unsqueeze(1)
            logits, cache = self._run(ids, enc, self._cache(state[1:]), t0)
        return self._logprobs(logits[:, -1]), (counter, *self._tensors(cache))

    def forward(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                drop: DropoutMasks | None = None, fc: Tensor | None = None) -> Tensor:
        """Log-probs (N, L+1, V+1) under teacher forcing of rdpp ids ``seqs`` (B, n, L) or (N, L)."""
        return self._logprobs(self._teacher_forced(att, seqs, att_mask, drop))

    def token_logprobs(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None,
                       drop: DropoutMasks | None = None, fc: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``sequence_logprobs(self(att, seqs), seqs)``: (token_logp, mask), both (N, L+1), without
        reordering the whole output: minus the cross-entropy at the target's Hugging Face id (one
        fused log-softmax and gather, forward and backward)."""
        seqs = seqs.reshape(-1, seqs.shape[-1])
        target, mask = targets(seqs)
        logits = self._teacher_forced(att, seqs, att_mask, drop).float()
        logp = -F.cross_entropy(logits.flatten(0, 1), self.hf_of[target].flatten(), reduction="none").view(target.shape)
        mask = mask.to(logp.dtype)
        return logp * mask, mask

    def draw_dropout(self, batch: int, rows: int, steps: int, regions: int,
                     generator: torch.Generator | None = None) -> DropoutMasks:
        """No masks: a pass given them runs without dropout (the on-policy rule, module docstring)."""
        return DropoutMasks()

    # -- the library's forward -------------------------------------------------------------------
    def _teacher_forced(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None, drop: DropoutMasks | None) -> Tensor:
        """Logits (N, L+1, V1) at the start token and each of ``seqs`` (rdpp ids), in one call."""
        B = att.shape[0]
        seqs = seqs.reshape(-1, seqs.shape[-1])
        start = seqs.new_full((seqs.shape[0], 1), self.config.decoder_start_token_id)
        ids = torch.cat([start, self.hf_of[seqs]], 1)
        enc = self.expand(self.encode(att, att_mask), seqs.shape[0] // B)
        with self._dropout(drop):
            return self._run(ids, enc, None, 0)[0]

    def _run(self, ids: Tensor, enc: Encoded, cache, t0: int) -> tuple[Tensor, Any]:
        """The decoder's logits (N, T, V1) at Hugging Face ids (N, T) at text positions t0 … t0+T-1
        after ``cache`` (None: no cache kept), and the cache extended by them."""
        kw: dict[str, Any] = {"input_ids": ids, "cache": cache, "use_cache": cache is not None}
        if self.cross:
            kw.update(encoder_hidden_states=enc.states, encoder_attention_mask=enc.mask)
        else:  # GIT: the image's tokens first (at the first call), text positions counted from 0
            T = ids.shape[1]
            kw["position_ids"] = torch.arange(t0, t0 + T, device=ids.device).expand(ids.shape[0], T)
            if t0 == 0:
                kw["pixel_values"] = enc.states[:, None]
        out = self.decoder(**kw)
        return out.logits[:, -ids.shape[1]:], out.cache

    def _cache(self, tensors: tuple[Tensor, ...]):
        """The library's cache holding ``tensors`` (``_tensors``' layout); empty for none."""
        from transformers import EncoderDecoderCache

        pairs = list(zip(tensors[0::2], tensors[1::2]))
        if not self.cross:
            return _dynamic_cache(pairs)
        half = len(pairs) // 2
        return EncoderDecoderCache(_dynamic_cache(pairs[:half]), _dynamic_cache(pairs[half:]))

    def _tensors(self, cache) -> tuple[Tensor, ...]:
        """The cache as a flat tuple: each layer's self-attention keys, values (N, h, t, d_k), then
        (cross-attention) each layer's keys and values of the image."""
        caches = [cache.self_attention_cache, cache.cross_attention_cache] if self.cross else [cache]
        return tuple(t for c in caches for layer in c.layers for t in (layer.keys, layer.values))

    @contextmanager
    def _dropout(self, drop: Any) -> Iterator[None]:
        """The decoder without dropout while a pass given masks runs (the on-policy rule)."""
        if drop is None or not self.decoder.training:
            yield
            return
        self.decoder.eval()
        try:
            yield
        finally:
            self.decoder.train()

    def _logprobs(self, logits: Tensor) -> Tensor:
        return F.log_softmax(logits.float(), dim=-1).index_select(-1, self.hf_of)
