"""Vocabulary, caption encoding and the training n-gram document frequencies.

- ``build_vocab``: words seen more than ``threshold`` times in the training captions, most frequent
  first (ties alphabetical), then ``"UNK"``; the id of ``words[i]`` is ``i + 1``, id 0 is pad/BOS/EOS.
- ``encode``: tokens -> ids, unknown words -> UNK, clipped to ``max_length``.
- ``document_frequencies``: n-grams (n = 1..4) of each training image's encoded references, each
  counted once per image: exactly what the CIDEr-D reward compares during training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import h5py
import numpy as np

UNK = "UNK"
MAX_N = 4


def build_vocab(train_captions: Iterable[Sequence[str]], threshold: int = 5) -> list[str]:
    """Words with count > ``threshold`` in ``train_captions``, by count (desc) then word, then UNK."""
    counts = Counter(t for cap in train_captions for t in cap)
    words = sorted((w for w, c in counts.items() if c > threshold and w != UNK), key=lambda w: (-counts[w], w))
    return words + [UNK]


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


def ngrams(ids: Sequence[int], n_max: int = MAX_N) -> set[tuple[int, ...]]:
    """Every distinct n-gram (n = 1..n_max) of one id sequence."""
    ids = tuple(ids)
    return {ids[i:i + n] for n in range(1, n_max + 1) for i in range(len(ids) - n + 1)}


def document_frequencies(refs_per_image: Iterable[Iterable[Sequence[int]]]) -> tuple[dict[tuple[int, ...], int], int]:
    """(df, num_docs): for each n-gram, the number of images whose references contain it."""
    df: Counter = Counter()
    num_docs = 0
    for refs in refs_per_image:
        seen: set[tuple[int, ...]] = set()
        for r in refs:
            seen |= ngrams(r)
        df.update(seen)
        num_docs += 1
    return dict(df), num_docs


def df_arrays(df: dict[tuple[int, ...], int]) -> tuple[np.ndarray, np.ndarray]:
    """``ngrams`` (K, 4) int32 right-padded with 0 and ``df`` (K,) float64, rows sorted by order n
    then by ids."""
    keys = sorted(df, key=lambda g: (len(g), g))
    grams = np.zeros((len(keys), MAX_N), dtype=np.int32)
    for i, g in enumerate(keys):
        grams[i, :len(g)] = g
    return grams, np.array([df[g] for g in keys], dtype=np.float64)


def write_cider_df(path: Path, df: dict[tuple[int, ...], int], num_docs: int) -> None:
    """``cider_df.h5``: datasets ``ngrams`` and ``df`` (see ``df_arrays``), attr ``num_docs``."""
    grams, values = df_arrays(df)
    with h5py.File(path, "w") as f:
        f.create_dataset("ngrams", data=grams, track_times=False)
        f.create_dataset("df", data=values, track_times=False)
        f.attrs["num_docs"] = int(num_docs)


def read_cider_df(path: Path) -> tuple[dict[tuple[int, ...], float], int]:
    """The inverse of ``write_cider_df``."""
    with h5py.File(path, "r") as f:
        grams, df, num_docs = f["ngrams"][:], f["df"][:], int(f.attrs["num_docs"])
    return {tuple(int(x) for x in g if x != 0): float(d) for g, d in zip(grams, df)}, num_docs
