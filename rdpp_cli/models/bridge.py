"""Between a model's token ids and a data artifact's words: ``bridge_for(model, words, seq_length)``.

The stages decode, train and replay on the model's own ids; what reads words asks the bridge:

- ``model_labels(labels)``: the data's word labels (B, k, L) as the model's ids (XE, xe-cider);
- ``data_ids(tokens)``: the model's ids as the data's word ids (..., L) (the training reward and
  validation: CIDEr-D on words, under the data's document frequencies);
- ``texts(tokens)``: captions as space-joined words (``rdpp sample``, ``rdpp caption``);
- ``max_len``: the most tokens a caption is decoded to; ``unk_id``: the id decoding suppresses.

rdpp's own models speak the data's words (``WordBridge``: the identity). A model with a vocabulary of
its own (``models.hf``: a tokenizer's) has a ``bridge(words, seq_length)`` method that returns a
``TokenBridge``. Both follow the ``Bridge`` protocol; nothing else in rdpp translates ids.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

from rdpp_cli.data.vocab import UNK, decode_ids, unk_id


@runtime_checkable
class Bridge(Protocol):
    """The translation between a model's token ids and a data artifact's words (module docstring)."""

    max_len: int
    unk_id: int | None

    def model_labels(self, labels: Tensor) -> Tensor: ...

    def data_ids(self, tokens: Any) -> np.ndarray: ...

    def texts(self, tokens: Any) -> list[str]: ...


class WordBridge:
    """The identity bridge of a model whose ids are the data's words."""

    def __init__(self, words: list[str], seq_length: int):
        self.words, self.max_len, self.unk_id = list(words), seq_length, unk_id(words)

    def model_labels(self, labels: Tensor) -> Tensor:
        return labels

    def data_ids(self, tokens: Any) -> np.ndarray:
        return tokens.cpu().numpy() if isinstance(tokens, Tensor) else np.asarray(tokens)

    def texts(self, tokens: Any) -> list[str]:
        arr = self.data_ids(tokens)
        return [decode_ids(self.words, row) for row in arr.reshape(-1, arr.shape[-1])]


def bridge_for(model: Any, words: list[str], seq_length: int):
    """The bridge between ``model``'s ids and the data's ``words`` (captions of ``seq_length`` words)."""
    model = getattr(model, "module", model)  # DDP
    make = getattr(model, "bridge", None)
    return make(words, seq_length) if make is not None else WordBridge(words, seq_length)


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
