"""CIDEr-D speed against pycocoevalcap's own code, run in the same process on the same captions.

Three shapes (issue 3):
  (a) corpus mode: 2,000 hypotheses x 5 references as strings, as a user calls ``Cider().compute_score``;
  (b) the training-reward call: fixed df from a training set, 250 hypotheses (50 images x 5 samples)
      against their 5 references plus the 50 sample-vs-sample 5x5 matrices, on token ids, against
      pycocoevalcap's ``CiderScorer`` with the same df and ref_len swapped in;
  (c) self-CIDEr of 5,000 images x 20 captions (all pairs per image, fixed df), with peak memory;
      the pair-by-pair reference is timed on 50 images and scaled to 5,000.
Captions come from the 1,000-image COCO fixture (tests/data/coco-val2014-1k). Prints a table, or
one JSON line with --json (keys corpus_ratio, reward_call_ms, reward_ratio, max_abs_diff,
self_cider_s, peak_rss_mb).

    python benchmarks/metrics.py [--json] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer

from rdpp_cli.metrics.cider import CiderD, DocFreq
from rdpp_cli.metrics.self_cider import self_cider_from_kernel

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "coco-val2014-1k" / "captions_val2014_1k.json"


class FixedDfScorer(CiderScorer):
    """pycocoevalcap's CiderScorer with a fixed df and ref_len swapped in (its compute_cider
    would otherwise set ref_len = log(#entries))."""

    ref_len = property(lambda self: self._fixed_ref_len, lambda self, value: None)

    def __init__(self, document_frequency, ref_len: float) -> None:
        self._fixed_ref_len = ref_len
        super().__init__()
        self.document_frequency = document_frequency


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """(best, median) seconds over ``repeat`` runs, and the last result. The best run is the
    figure compared (for both implementations): on a shared machine the median mostly measures
    the other processes."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times), out


def interleaved(ref_fn, our_fn, rounds: int, ours_per_round: int):
    """Alternate one pycocoevalcap run with ``ours_per_round`` rdpp runs, ``rounds`` times, so that
    both implementations sample the same stretches of a shared machine's load. Returns
    ``(ref best, ref result, our best, our median, our result)`` in seconds."""
    ref_times, our_times, ref_out, our_out = [], [], None, None
    for _ in range(rounds):
        t = time.perf_counter()
        ref_out = ref_fn()
        ref_times.append(time.perf_counter() - t)
        for _ in range(ours_per_round):
            t = time.perf_counter()
            our_out = our_fn()
            our_times.append(time.perf_counter() - t)
    return min(ref_times), ref_out, min(our_times), statistics.median(our_times), our_out


def load_refs() -> list[list[str]]:
    ann = json.loads(FIXTURE.read_text())
    refs = defaultdict(list)
    for a in ann["annotations"]:
        refs[a["image_id"]].append(" ".join(re.sub(r"[^a-z0-9 ]", " ", a["caption"].lower()).split()))
    return [refs[i] for i in sorted(refs)]


def perturb(rng: random.Random, caption: str, vocab: list[str]) -> str:
    """A sample-like variant: drop, swap or replace a few words, maybe truncate."""
    w = caption.split()
    for _ in range(rng.randint(0, 3)):
        if not w:
            break
        op, i = rng.random(), rng.randrange(len(w))
        if op < 0.3:
            del w[i]
        elif op < 0.6:
            w[i] = rng.choice(vocab)
        else:
            j = rng.randrange(len(w))
            w[i], w[j] = w[j], w[i]
    return " ".join(w[: rng.randint(max(1, len(w) - 3), len(w))] if w else w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    ap.add_argument("--repeat", type=int, default=21, help="runs of each rdpp call (x5 for the reward call)")
    ap.add_argument("--ref-repeat", type=int, default=3,
                    help="runs of each pycocoevalcap call, interleaved with rdpp's")
    args = ap.parse_args()
    rng = random.Random(0)
    refs = load_refs()
    vocab = sorted({w for rs in refs for c in rs for w in c.split()})
    wid = {w: i + 1 for i, w in enumerate(vocab)}
    rows, diffs = [], []

    # (a) corpus mode, strings --------------------------------------------------------------
    R = [refs[k % len(refs)][:5] for k in range(2000)]
    Hs = [perturb(rng, rng.choice(refs[k % len(refs)]), vocab) if k % 3 else rng.choice(rng.choice(refs))
          for k in range(2000)]
    gts, res = {k: R[k] for k in range(2000)}, {k: [Hs[k]] for k in range(2000)}
    ref_t, (_, theirs), our_t, our_med, ours = interleaved(
        lambda: Cider().compute_score(gts, res), lambda: CiderD().score(Hs, R), args.ref_repeat,
        max(1, args.repeat // args.ref_repeat))
    diffs.append(float(np.abs(ours - theirs).max()))
    corpus_ratio = ref_t / our_t
    rows.append(("(a) corpus mode, 2,000 x 5 refs, strings", ref_t * 1e3, our_t * 1e3, our_med * 1e3, corpus_ratio))

    # (b) the training-reward call ------------------------------------------------------------
    train = refs[:800]  # the "training set" giving the fixed df
    df = DocFreq.from_references([[[wid[w] for w in c.split()] for c in rs] for rs in train])
    pyco_df = defaultdict(float)
    for row, v in zip(df.ngrams, df.df):
        pyco_df[tuple(str(t) for t in row if t)] = v
    imgs = list(range(800, 850))
    T = 16

    def ids(c: str) -> list[int]:
        return [wid[w] for w in c.split()][:T]

    samples = np.zeros((50, 5, T), np.int64)
    ref_ids = np.zeros((50, 5, T), np.int64)
    for b, i in enumerate(imgs):
        for j in range(5):
            s = ids(perturb(rng, rng.choice(refs[i]), vocab))
            samples[b, j, : len(s)] = s
            r = ids(refs[i][j])
            ref_ids[b, j, : len(r)] = r
    cd = CiderD(df)

    def as_str(a: np.ndarray) -> str:
        return " ".join(str(t) for t in a[a > 0])

    def pyco_reward():
        hs = [[as_str(s) for s in samples[b]] for b in range(50)]
        rs = [[as_str(r) for r in ref_ids[b]] for b in range(50)]
        sc = FixedDfScorer(pyco_df, df.ref_len)
        for b in range(50):
            for j in range(5):
                sc.cook_append(hs[b][j], rs[b])
            for i in range(5):
                for j in range(i, 5):
                    sc.cook_append(hs[b][i], [hs[b][j]])
        return np.array(sc.compute_cider())

    cd.score_and_pairwise(samples, ref_ids)  # builds the df hash table once, as a training run does
    ref_t, theirs, our_t, our_med, (q, K) = interleaved(
        pyco_reward, lambda: cd.score_and_pairwise(samples, ref_ids), args.ref_repeat,
        max(1, args.repeat * 5 // args.ref_repeat))
    iu = np.triu_indices(5)
    ours = np.concatenate([np.concatenate([q[b], K[b][iu]]) for b in range(50)])
    diffs.append(float(np.abs(ours - theirs).max()))
    sep_t, sep_med, _ = timed(lambda: (cd.score(samples.reshape(250, T), ref_ids, np.repeat(np.arange(50), 5)),
                                 cd.pairwise(samples)), args.repeat * 5)
    reward_ms, reward_ratio = our_t * 1e3, ref_t / our_t
    rows.append(("(b) reward call: 250 vs 5 refs + 50 5x5, ids (score_and_pairwise)",
                 ref_t * 1e3, reward_ms, our_med * 1e3, reward_ratio))
    rows.append(("    same as score() + pairwise()", ref_t * 1e3, sep_t * 1e3, sep_med * 1e3, ref_t / sep_t))

    # (c) self-CIDEr 5,000 x 20 -------------------------------------------------------------
    B, M = 5000, 20
    caps = np.zeros((B, M, T), np.int64)
    for b in range(B):
        base = refs[rng.randrange(len(refs))]
        for j in range(M):
            s = ids(perturb(rng, base[j % len(base)], vocab))
            caps[b, j, : len(s)] = s
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    sc = self_cider_from_kernel(cd.pairwise(caps))
    sc_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # pycocoevalcap pair by pair on the first 50 images, scaled to 5,000
    def pyco_pairs(nb: int):
        sc_ = FixedDfScorer(pyco_df, df.ref_len)
        strs = [[as_str(c) for c in caps[b]] for b in range(nb)]
        for b in range(nb):
            for i in range(M):
                for j in range(i, M):
                    sc_.cook_append(strs[b][i], [strs[b][j]])
        return np.array(sc_.compute_cider())

    ref50, _, theirs = timed(lambda: pyco_pairs(50), 1)
    K50 = cd.pairwise(caps[:50])
    iu = np.triu_indices(M)
    diffs.append(float(np.abs(K50[:, iu[0], iu[1]].reshape(-1) - theirs).max()))
    rows.append((f"(c) self-CIDEr {B:,} x {M} (pycocoevalcap: 50 images x {B // 50})", ref50 * B / 50 * 1e3,
                 sc_s * 1e3, float("nan"), ref50 * B / 50 / sc_s))
    assert np.isfinite(sc).all()

    # (b) again, last so that peak_rss_mb is the self-CIDEr step's: the same call with a COCO-sized
    # df table (the 800-image df plus random filler n-grams); the hash reads one cache line per
    # n-gram, so a table far larger than the caches costs little
    frng = np.random.default_rng(1)
    extra = 3_600_000
    order = frng.integers(2, 5, size=extra)
    filler = frng.integers(1, len(vocab) + 1, size=(extra, 4))
    filler[np.arange(4)[None, :] >= order[:, None]] = 0
    grams, first = np.unique(np.concatenate([df.ngrams, filler]), axis=0, return_index=True)
    big = DocFreq(grams, np.concatenate([df.df, np.ones(extra)])[first], df.num_docs)
    cbig = CiderD(big)
    cbig.score_and_pairwise(samples, ref_ids)
    big_t, big_med, _ = timed(lambda: cbig.score_and_pairwise(samples, ref_ids), args.repeat * 5)
    rows.insert(3, (f"    same call, df table of {len(big.df) / 1e6:.1f}M n-grams (COCO-sized)", float("nan"),
                    big_t * 1e3, big_med * 1e3, float("nan")))

    out = {"corpus_ratio": round(corpus_ratio, 2), "reward_call_ms": round(reward_ms, 3),
           "reward_ratio": round(reward_ratio, 1), "max_abs_diff": max(diffs), "self_cider_s": round(sc_s, 3),
           "peak_rss_mb": round(peak, 1), "reward_call_ms_median": round(our_med * 1e3, 3),
           "reward_call_ms_coco_sized_df": round(big_t * 1e3, 3),
           "load_avg_1min": round(os.getloadavg()[0], 2)}
    if args.json:
        print(json.dumps(out))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="CIDEr-D: rdpp vs pycocoevalcap (same process, same captions)", title_justify="left")
    for col in ("shape", "pycocoevalcap ms (best)", "rdpp ms (best)", "rdpp ms (median)", "speed-up (best)"):
        table.add_column(col, justify="left" if col == "shape" else "right")
    for name, ref_ms, our_ms, our_min_ms, ratio in rows:
        def fmt(x: float, spec: str) -> str:
            return "-" if x != x else format(x, spec)

        table.add_row(name, fmt(ref_ms, ",.1f"), fmt(our_ms, ",.2f"), fmt(our_min_ms, ",.2f"),
                      "-" if ratio != ratio else f"{ratio:,.1f}x")
    Console().print(table)
    print(f"max |rdpp - pycocoevalcap| = {max(diffs):.2e}; peak RSS {peak:,.0f} MB (before self-CIDEr {rss0:,.0f} MB)",
          file=sys.stdout)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
