"""Postings: the n-grams of captions that are compared with each other, found by one sort.

Why: CIDEr-D compares a hypothesis with its references (or an image's samples with each other)
n-gram by n-gram. Instead of a dictionary per caption, the captions compared together share one
*row* per (group, n) -- a group is an image's references and the hypotheses scored against them,
or its M samples -- and each row is sorted with the caption's slot packed into the low bits of the
n-gram key. Runs of equal values are then *postings* (one caption's count of one n-gram), and the
postings of one n-gram sit together, references (low slots) first: the sort is the join.

What it guarantees: every n-gram occurrence of every caption (n = 1..4, none across the 0 that
ends a caption) is counted once, in its own caption's slot; keys are exact (``keys.py``). Work is
cut into chunks of at most ``CHUNK_ELEMS`` cells, so memory stays bounded for any number of images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rdpp_cli.metrics.cider.captions import Caps, WordTable, has_strings, sets_from
from rdpp_cli.metrics.cider.keys import N_ORDER, SENT, exact_ids, keys_to_digits

CHUNK_ELEMS = 1 << 20  # groups x orders x slots x row width per chunk: keeps the work in cache


# ----------------------------------------------------------------------------------------------
# layout: captions that are compared share one row per (group, n)


# ----------------------------------------------------------------------------------------------


def layout(caps: Caps, slot_index: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Rows of captions: ``slot_index`` (G, S) holds caption indices (-1: empty slot).

    Returns ``flat`` (G, L) ids with at least one 0 between captions, ``slot`` (1 or G, L) the slot
    of each position, and S.
    """
    G, S = slot_index.shape
    if caps.mat is not None:
        T = caps.mat.shape[1]
        rows = np.zeros((G, S, T + 1), np.int64)  # a 0 column ends every caption
        rows[:, :, :T] = caps.mat[np.maximum(slot_index, 0)]
        rows[slot_index < 0] = 0
        slot = (np.arange(S * (T + 1)) // (T + 1))[None, :]
        return rows.reshape(G, S * (T + 1)), slot, S
    lens = np.append(caps.lens, 0)[slot_index]  # (G, S)
    width = lens + 1
    start = np.cumsum(width, axis=1) - width
    L = max(int(width.sum(1).max()) if G else 1, 1)
    flat = np.zeros((G, L), np.int64)
    slot = np.zeros((G, L), np.int64)
    occ = slot_index >= 0
    g_occ, s_occ = np.nonzero(occ)
    c_occ = slot_index[occ]
    n_occ = caps.lens[c_occ]
    cstart = np.cumsum(caps.lens) - caps.lens
    rep = np.repeat(np.arange(len(c_occ)), n_occ)
    within = np.arange(int(n_occ.sum())) - np.repeat(np.cumsum(n_occ) - n_occ, n_occ)
    pos = start[g_occ, s_occ][rep] + within
    flat[g_occ[rep], pos] = caps.ids[cstart[c_occ][rep] + within]
    slot[g_occ[rep], pos] = s_occ[rep]
    return flat, slot, S


def row_grams(flat: np.ndarray, base: int) -> tuple[np.ndarray, int]:
    """Distinct n-grams of each row (for document frequencies): keys in ``base``, or digit tuples
    of the original ids when the ids had to be relabelled."""
    flat, relabel, base = exact_ids(flat, base)
    G, L = flat.shape
    rows = np.full((G, N_ORDER, L), SENT, np.int64)
    nz = flat != 0
    key, valid = flat, nz
    for n in range(min(N_ORDER, L)):
        if n:
            key = key[:, :-1] * base + flat[:, n:]
            valid = valid[:, :-1] & nz[:, n:]
        rows[:, n, :L - n] = np.where(valid, key, SENT)
    rows.sort(axis=-1)
    new = rows != SENT
    new[..., 1:] &= rows[..., 1:] != rows[..., :-1]
    keys = rows[new]
    if relabel is not None:
        return relabel[keys_to_digits(keys, base)], base
    return keys, base


def set_chunks(counts: np.ndarray):
    """Groups = reference sets (slots = their captions), in chunks of bounded size."""
    n = len(counts)
    k = int(counts.max()) if n else 1
    per = max(1, CHUNK_ELEMS // max(1, k * 64))
    starts = np.cumsum(counts) - counts
    for lo in range(0, n, per):
        hi = min(n, lo + per)
        idx = starts[lo:hi, None] + np.arange(k)[None, :]
        idx = np.where(np.arange(k)[None, :] < counts[lo:hi, None], idx, -1)
        yield lo, hi, idx


def group_chunks(caps: Caps, slot_index: np.ndarray):
    """Chunks of groups (rows of ``slot_index``) of similar width, each of bounded size."""
    G, S = slot_index.shape
    if caps.mat is not None:
        widths = np.full(G, S * (caps.mat.shape[1] + 1), np.int64)
        order = np.arange(G)
    else:
        widths = (np.append(caps.lens, 0)[slot_index] + 1).sum(1)
        order = np.argsort(widths, kind="stable")
    cost = N_ORDER * S
    i = 0
    while i < G:
        n = max(1, CHUNK_ELEMS // (cost * int(widths[order[i]])))
        end = min(G, i + n)
        n = max(1, CHUNK_ELEMS // (cost * int(widths[order[end - 1]])))
        end = min(G, i + n)
        yield order[i:end]
        i = end


# ----------------------------------------------------------------------------------------------
# postings: one sort per row


# ----------------------------------------------------------------------------------------------


def _sorted_rows(flat: np.ndarray, slot: np.ndarray, base: int, sb: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every valid n-gram occurrence as (key, slot), sorted by (row = group * 4 + n, key, slot).

    Returns the flattened keys and slots (invalid windows dropped) and the end of each row in them;
    when keys and slots fit one int64 together, the first array holds ``key << sb | slot`` and the
    second is None.
    """
    G, L = flat.shape
    pack = base ** N_ORDER < (1 << (63 - sb))
    nz = flat != 0
    rows = np.full((G, N_ORDER, L), SENT, np.int64)
    slots = None if pack else np.zeros((G, N_ORDER, L), np.int64)
    key, valid = flat, nz
    for n in range(min(N_ORDER, L)):  # a row shorter than n holds no n-gram
        if n:
            key = key[:, :-1] * base + flat[:, n:]
            valid = valid[:, :-1] & nz[:, n:]
        s_n = slot[:, :L - n]
        if pack:
            np.copyto(rows[:, n, :L - n], (key << sb) | s_n, where=valid)
        else:
            rows[:, n, :L - n] = np.where(valid, key, SENT)
            slots[:, n, :L - n] = s_n
    if pack:  # keys and slots packed in one int64: the runs of equal values are the postings
        rows.sort(axis=-1)
        ok = rows != SENT
        return rows[ok], None, np.cumsum(ok.sum(-1).ravel())
    order = np.argsort(rows, axis=-1, kind="stable")
    rows = np.take_along_axis(rows, order, -1)
    ok = rows != SENT
    return rows[ok], np.take_along_axis(slots, order, -1)[ok], np.cumsum(ok.sum(-1).ravel())


@dataclass
class Postings:
    """The n-grams of rows of captions (a row = an image's captions in slots), as postings: one
    caption's count of one n-gram. Postings are ordered by (row, n-gram, slot), where a row is
    ``image * 4 + (n - 1)``; the postings of one n-gram in one row form a contiguous "gram" group.
    """

    row: np.ndarray  # (P,) image * 4 + (n - 1)
    slot: np.ndarray  # (P,) caption slot within the image
    count: np.ndarray  # (P,) float64 occurrences of the n-gram in that caption
    gram: np.ndarray  # (P,) index of the posting's gram group
    gram_start: np.ndarray  # (Q,) first posting of each gram group
    gram_key: np.ndarray  # (Q,) the n-gram's key (base ``base`` digits of ids, maybe relabelled)
    base: int
    relabel: np.ndarray | None  # relabelled id -> original id, when ids had to be relabelled


def build_postings(flat: np.ndarray, slot: np.ndarray, S: int, base: int) -> Postings:
    flat, relabel, base = exact_ids(flat, base)
    sb = max(1, (S - 1).bit_length())
    keys, slots, row_end = _sorted_rows(flat, slot, base, sb)
    nocc = keys.size
    if nocc == 0:
        e = np.zeros(0, np.int64)
        return Postings(e, e, np.zeros(0), e, e, e, base, relabel)
    # a posting starts where (key, slot) changes or a new row (image, n) begins
    bound = np.empty(nocc, bool)
    bound[0] = True
    if slots is None:
        np.not_equal(keys[1:], keys[:-1], out=bound[1:])
    else:
        np.logical_or(keys[1:] != keys[:-1], slots[1:] != slots[:-1], out=bound[1:])
    bound[row_end[:-1][row_end[:-1] < nocc]] = True
    pstart = np.flatnonzero(bound)
    pcount = np.diff(np.append(pstart, nocc)).astype(np.float64)
    if slots is None:
        pv = keys[pstart]
        pkey, pslot = pv >> sb, pv & ((1 << sb) - 1)
    else:
        pkey, pslot = keys[pstart], slots[pstart]
    occ_per_row = np.diff(np.concatenate([[0], row_end]))
    prow = np.repeat(np.arange(len(row_end)), occ_per_row)[pstart]  # row (image, n) of each posting
    gnew = np.empty(len(pkey), bool)
    gnew[0] = True
    np.logical_or(pkey[1:] != pkey[:-1], prow[1:] != prow[:-1], out=gnew[1:])
    gstart = np.flatnonzero(gnew)
    return Postings(prow, pslot, pcount, np.cumsum(gnew) - 1, gstart, pkey[gstart], base, relabel)


def ngram_postings(captions: Any) -> tuple[Postings, int, int]:
    """Postings of B images with M captions each ((B, M, T) ids, or B lists of M strings or id
    lists); returns ``(postings, B, M)``. For statistics over an image's captions (Div-n, mBLEU)."""
    table = WordTable() if has_strings(captions) else None
    caps, counts = sets_from(captions, table, "captions")
    B = len(counts)
    M = int(counts.max()) if B else 0
    if B and (counts != M).any():
        raise ValueError("every image needs the same number of captions")
    base = max(caps.max_id() + 1, table.next if table is not None else 0, 2)
    slot_index = np.arange(B * M, dtype=np.int64).reshape(B, M)
    flat, slot, _ = layout(caps, slot_index)
    return build_postings(flat, slot, max(M, 1), base), B, M
