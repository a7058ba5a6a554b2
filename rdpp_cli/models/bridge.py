"""Between a model's token ids and a data artifact's words: ``bridge_for(model, words, seq_length)``.

The stages decode, train and replay on the model's own ids; what reads words asks the bridge:

- ``model_labels(labels)``: the data's word labels (B, k, L) as the model's ids (XE, xe-cider);
- ``data_ids(tokens)``: the model's ids as the data's word ids (..., L) (the training reward and
  validation: CIDEr-D on words, under the data's document frequencies);
- ``texts(tokens)``: captions as space-joined words (``rdpp sample``, ``rdpp caption``);
- ``max_len``: the most tokens a caption is decoded to; ``unk_id``: the id decoding suppresses.

rdpp's own models speak the data's words (``WordBridge``: the identity). A model with a vocabulary of
its own (``models.hf``) has a ``bridge(words, seq_length)`` method that returns its translation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from rdpp_cli.data.vocab import decode_ids, unk_id


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
