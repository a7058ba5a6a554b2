"""n-gram keys: one exact int64 per n-gram, so that n-grams can be sorted, compared and hashed as
plain integers.

An n-gram's key is its word ids written in base ``B = max id + 1``: ``t1*B^(n-1) + ... + tn``.
Ids are >= 1 (0 ends a caption), so two different n-grams -- of the same order or not -- never
share a key, as long as ``B^4 < 2^63`` (``B <= MAX_BASE``: vocabularies of up to 55,107 words).
Beyond that, the captions compared together are relabelled to the ids they actually use
(:func:`relabel_ids`), and document-frequency keys become exact pairs of int64 (:func:`pair_keys`).
So every key in this package is exact, for any vocabulary size.

Three spellings of one n-gram meet here: *tuples* ``(t1..tn, 0..)`` (``cider_df.h5``), *digits*
``(tn..t1, 0..)`` (least significant first, what a key decodes to) and *keys*.
"""

from __future__ import annotations

import numpy as np

N_ORDER = 4  # CIDEr's n = 1..4
MAX_BASE = 55108  # largest B with B**4 < 2**63
SENT = np.iinfo(np.int64).max  # "no n-gram here": sorts after every key


def keys_to_digits(keys: np.ndarray, base: int) -> np.ndarray:
    """(Q,) base-``base`` keys -> (Q, 4) digits, least significant first (0 beyond the order)."""
    d = np.empty((len(keys), N_ORDER), np.int64)
    k = keys.copy()
    for i in range(N_ORDER):
        d[:, i] = k % base
        k //= base
    return d


def _reverse_prefix(a: np.ndarray) -> np.ndarray:
    """Reverse the non-zero prefix of each row: (t1..tn, 0..) <-> (tn..t1, 0..)."""
    a = np.asarray(a, np.int64)
    order = (a != 0).sum(1, keepdims=True)
    idx = order - 1 - np.arange(N_ORDER)[None, :]
    return np.where(idx >= 0, np.take_along_axis(a, np.maximum(idx, 0), 1), 0)


def tuples_to_digits(ngrams: np.ndarray) -> np.ndarray:
    """(K, 4) n-grams (t1..tn, right-padded with 0) -> digits least significant first."""
    return _reverse_prefix(ngrams)


def digits_to_tuples(d: np.ndarray) -> np.ndarray:
    """(K, 4) digits tn..t1 -> tuples t1..tn, right-padded with 0."""
    return _reverse_prefix(d)


def keys_to_tuples(keys: np.ndarray, base: int) -> np.ndarray:
    """(Q,) base-``base`` keys -> (Q, 4) tuples t1..tn right-padded with 0: scaling a key by
    ``base^(4-n)`` left-aligns its digits, which are then read most significant first."""
    order = 1 + (keys >= base) + (keys >= base ** 2) + (keys >= base ** 3)
    scaled = keys * np.array([0, base ** 3, base ** 2, base, 1], np.int64)[order]
    t = np.empty((len(keys), N_ORDER), np.int64)
    for i in range(N_ORDER):
        t[:, i] = scaled // base ** (N_ORDER - 1 - i) % base
    return t


def digits_to_keys(d: np.ndarray, base: int) -> np.ndarray:
    """(Q, 4) digits, least significant first -> base-``base`` keys."""
    k = np.zeros(len(d), np.int64)
    for i in range(N_ORDER - 1, -1, -1):
        k = k * base + d[:, i]
    return k


def tuples_to_keys(ngrams: np.ndarray, base: int) -> np.ndarray:
    """(K, 4) tuples t1..tn right-padded with 0 -> base-``base`` keys (Horner, skipping the 0s)."""
    keys = np.zeros(len(ngrams), np.int64)
    for i in range(N_ORDER):
        t = ngrams[:, i]
        keys = np.where(t != 0, keys * base + t, keys)
    return keys


def pair_keys(d: np.ndarray) -> np.ndarray:
    """(Q, 4) digits of ids < 2^31 -> (Q, 2) exact two-word keys ``(t4<<31|t3, t2<<31|t1)``: the
    keys of any vocabulary size (used when ``base > MAX_BASE``)."""
    return np.stack([(d[:, 0] << 31) | d[:, 1], (d[:, 2] << 31) | d[:, 3]], 1)


def relabel_ids(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Map the ids used in ``flat`` to 1..U (0 stays 0); returns new ids, the map back, base."""
    uniq, inv = np.unique(flat, return_inverse=True)
    if uniq[0] != 0:
        uniq = np.concatenate([[0], uniq])
        inv = inv + 1
    return inv.reshape(flat.shape).astype(np.int64), uniq, len(uniq)


def exact_ids(flat: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray | None, int]:
    """``(flat, None, base)`` when base-``base`` keys of these ids are exact; otherwise the ids
    relabelled to 1..U, the map back and the new base. ValueError when even that does not fit."""
    if base <= MAX_BASE:
        return flat, None, base
    flat, relabel, base = relabel_ids(flat)
    if base > MAX_BASE:
        raise ValueError("more than 55,107 distinct words in one group of captions")
    return flat, relabel, base
