"""Vocabulary and caption encoding.

- ``build_vocab``: words seen more than ``threshold`` times in the training captions, most frequent
  first (ties alphabetical), then ``"UNK"``; the id of ``words[i]`` is ``i + 1``, id 0 is pad/BOS/EOS.
- ``encode``: tokens -> ids, unknown words -> UNK, clipped to ``max_length``.
- ``auto_threshold``: the default word-count threshold, scaled to the training set (docs/data.md).
- ``unk_id``: the id decoders suppress (evaluation decoding never emits UNK unless asked).
- ``decode_ids``: ids -> words, up to the first 0.

The training n-gram document frequencies (``cider_df.h5``) come from ``rdpp_cli.metrics.cider.DocFreq``
over these encoded references (see ``prepro.write_data_artifact``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

UNK = "UNK"
COCO_TRAIN_IMAGES = 113_287  # Karpathy train + restval: where the reference's "count > 5" was chosen
REFERENCE_THRESHOLD = 5
HIGH_UNK = 0.10  # a training-token UNK share above this (one word in ten) gets a warning


def auto_threshold(train_images: int) -> int:
    """``--word-count-threshold auto``: the reference's count > 5 on a COCO-sized training set,
    scaled down in proportion to the number of training images (a word must be about as frequent
    relative to the corpus), but never below 1, so words seen once are UNK and the model still
    learns what UNK is. COCO (113,287 images): 5; 34k-57k images: 2; under 34k images: 1."""
    scaled = round(REFERENCE_THRESHOLD * train_images / COCO_TRAIN_IMAGES)
    return int(min(REFERENCE_THRESHOLD, max(1, scaled)))


def unk_id(words: Sequence[str]) -> int | None:
    """The word id of ``UNK`` in a vocabulary (``words[i]`` has id i + 1), None when it has none."""
    try:
        return list(words).index(UNK) + 1
    except ValueError:
        return None


def build_vocab(train_captions: Iterable[Sequence[str]], threshold: int = 5) -> list[str]:
    """Words with count > ``threshold`` in ``train_captions``, by count (desc) then word, then UNK."""
    counts = Counter(t for cap in train_captions for t in cap)
    words = sorted((w for w, c in counts.items() if c > threshold and w != UNK), key=lambda w: (-counts[w], w))
    return words + [UNK]


def decode_ids(words: Sequence[str], ids) -> str:
    """Word ids (stopping at the first 0) -> the space-joined words (``words[i - 1]`` for id i)."""
    out = []
    for i in (ids.tolist() if hasattr(ids, "tolist") else ids):
        if i == 0:
            break
        out.append(words[i - 1])
    return " ".join(out)


def word_to_id(words: Sequence[str]) -> dict[str, int]:
    return {w: i + 1 for i, w in enumerate(words)}


def encode(tokens: Sequence[str], w2i: dict[str, int], max_length: int) -> list[int]:
    """Word ids of ``tokens`` (UNK for unknown words), clipped to ``max_length``."""
    unk = w2i[UNK]
    return [w2i.get(t, unk) for t in tokens[:max_length]]


def encode_all(captions: Sequence[Sequence[str]], w2i: dict[str, int], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` (M, max_length) int32 0-padded and ``lengths`` (M,) int32."""
    labels = np.zeros((len(captions), max_length), dtype=np.int32)
    lengths = np.zeros(len(captions), dtype=np.int32)
    for i, cap in enumerate(captions):
        ids = encode(cap, w2i, max_length)
        labels[i, :len(ids)] = ids
        lengths[i] = len(ids)
    return labels, lengths


def unk_rate(labels: np.ndarray, lengths: np.ndarray, unk_id: int) -> float:
    total = int(lengths.sum())
    return float((labels == unk_id).sum()) / total if total else 0.0
