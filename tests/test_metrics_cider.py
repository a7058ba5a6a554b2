"""CIDEr-D (rdpp_cli.metrics.cider) against pycocoevalcap and against the formula by hand."""

from __future__ import annotations

import json
import math
import random
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer

from rdpp_cli.metrics.cider import CiderD, DocFreq

from cider_reference import FixedDfScorer

pytestmark = pytest.mark.unit


DATA = Path(__file__).parent / "data" / "coco-val2014-1k"


def _norm(c: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", c.lower()).split())


@pytest.fixture(scope="module")
def coco():
    ann = json.loads((DATA / "captions_val2014_1k.json").read_text())
    refs = defaultdict(list)
    for a in ann["annotations"]:
        refs[a["image_id"]].append(_norm(a["caption"]))
    res = {r["image_id"]: _norm(r["caption"]) for r in json.loads((DATA / "fakecap_results.json").read_text())}
    ids = sorted(refs)
    return ids, dict(refs), res


def _edge_hyps(ids, refs, res, n=400, seed=0):
    """Real captions plus the edge cases: empty, < 4 tokens, repeated n-grams, equal to a ref."""
    rng = random.Random(seed)
    hyps = [res[i] for i in ids[:n]]
    hyps[0] = ""
    hyps[1] = "a"
    hyps[2] = "a man"
    hyps[3] = "a man riding"
    hyps[4] = "a a a a a a man man man a man a man"
    hyps[5] = refs[ids[5]][0]  # identical to a reference
    hyps[6] = " ".join([refs[ids[6]][1]] * 2)  # a reference said twice
    hyps[7] = "zzzunknown words only"
    for j in range(8, 40):  # truncated references
        w = refs[ids[j]][rng.randrange(len(refs[ids[j]]))].split()
        hyps[j] = " ".join(w[: rng.randint(1, len(w))])
    return hyps


def test_corpus_mode_equals_pycocoevalcap(coco):
    ids, refs, res = coco
    ids = ids[:400]
    hyps = _edge_hyps(ids, refs, res)
    gts = {i: refs[i] for i in ids}
    theirs_mean, theirs = Cider().compute_score(gts, {i: [h] for i, h in zip(ids, hyps)})
    ours = CiderD().score(hyps, [refs[i] for i in ids])
    assert ours.dtype == np.float64 and ours.shape == (400,)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    assert abs(ours.mean() - theirs_mean) < 1e-9
    assert ours[0] == 0.0  # empty hypothesis
    assert ours[5] > 1.0  # identical to one of its references


def test_token_ids_give_the_same_scores_as_strings(coco):
    ids, refs, res = coco
    ids = ids[:120]
    hyps = _edge_hyps(ids, refs, res, n=120)
    vocab = {w: k + 1 for k, w in enumerate(sorted({w for i in ids for c in refs[i] + [res[i]] for w in c.split()}
                                                    | {w for h in hyps for w in h.split()}))}
    enc = lambda c: [vocab[w] for w in c.split()]  # noqa: E731
    T = max(len(h.split()) for h in hyps)
    H = np.zeros((len(hyps), T + 3), np.int64)
    for r, h in enumerate(hyps):
        H[r, : len(h.split())] = enc(h)
    H[1, 3:] = 7  # ids after the first 0 are ignored (a caption ends at its first 0)
    ref_ids = [[enc(c) for c in refs[i]] for i in ids]
    s_str = CiderD().score(hyps, [refs[i] for i in ids])
    s_ids = CiderD().score(H, ref_ids)
    s_lists = CiderD().score([enc(h) for h in hyps], ref_ids)
    np.testing.assert_allclose(s_ids, s_str, rtol=0, atol=1e-12)
    np.testing.assert_allclose(s_lists, s_str, rtol=0, atol=1e-12)


def test_ref_index_equals_repeated_single_caption_runs(coco):
    ids, refs, res = coco
    ids = ids[:60]
    rng = random.Random(1)
    n = 3
    caps = [[refs[rng.choice(ids)][0] if j else res[i] for j in range(n)] for i in ids]
    gts = {i: refs[i] for i in ids}
    ours = CiderD().score([c for cs in caps for c in cs], [refs[i] for i in ids],
                          ref_index=np.repeat(np.arange(len(ids)), n)).reshape(len(ids), n)
    for j in range(n):
        _, theirs = Cider().compute_score(gts, {i: [caps[k][j]] for k, i in enumerate(ids)})
        np.testing.assert_allclose(ours[:, j], theirs, rtol=0, atol=1e-9)
    # an arbitrary order of ref_index gives the same numbers
    perm = np.random.default_rng(0).permutation(len(ids) * n)
    flat = [c for cs in caps for c in cs]
    shuffled = CiderD().score([flat[p] for p in perm], [refs[i] for i in ids],
                              ref_index=np.repeat(np.arange(len(ids)), n)[perm])
    np.testing.assert_allclose(shuffled, ours.reshape(-1)[perm], rtol=0, atol=1e-12)


def _direct_cider_d(hyp, refs, df, num_docs, sigma=6.0):
    """The definition of docs/metrics.md#cider-d written out directly, one n-gram at a time."""
    def counts(c, n):
        w = c.split()
        out = defaultdict(int)
        for i in range(len(w) - n + 1):
            out[tuple(w[i:i + n])] += 1
        return out

    def vec(c, n):
        return {g: tf * (math.log(num_docs) - math.log(max(1.0, df.get(g, 0.0)))) for g, tf in counts(c, n).items()}

    total = 0.0
    for r in refs:
        lh, lr = max(len(hyp.split()) - 1, 0), max(len(r.split()) - 1, 0)
        pen = math.exp(-((lh - lr) ** 2) / (2 * sigma ** 2))
        vals = []
        for n in range(1, 5):
            vh, vr = vec(hyp, n), vec(r, n)
            s = sum(min(v, vr.get(g, 0.0)) * vr.get(g, 0.0) for g, v in vh.items())
            nh, nr = math.sqrt(sum(v * v for v in vh.values())), math.sqrt(sum(v * v for v in vr.values()))
            vals.append((s / (nh * nr) if nh and nr else s) * pen)
        total += 10 * sum(vals) / 4
    return total / len(refs)


def test_fixed_df_hand_computed_example():
    # 4 documents; df(a) = 2, df(b) = 1, df(c) = 0 (absent), df(a b) = 1.
    df = DocFreq(ngrams=[[1, 0, 0, 0], [2, 0, 0, 0], [1, 2, 0, 0]], df=[2.0, 1.0, 1.0], num_docs=4,
                 words=["a", "b", "c"])
    cd = CiderD(df)
    # "a b" vs "a c": idf(a) = log 2, idf(b) = idf(c) = log 4; val_1 = (ln2)^2 / ((ln2)^2 + (2 ln2)^2) = 1/5,
    # no shared bigram, equal lengths: 10 * (1/5) / 4 = 0.5
    # "a a" vs "a": val_1 = min(2w, w) w / (2w w) = 1/2, one bigram vs none: 10 * (1/2) e^{-1/72} / 4
    # "a b" vs "a b": every order with n-grams matches fully, but orders 3 and 4 are empty: 10 * 2 / 4 = 5
    got = cd.score(["a b", "a a", "a b"], [["a c"], ["a"], ["a b"]])
    np.testing.assert_allclose(got, [0.5, 1.25 * math.exp(-1 / 72), 5.0], rtol=0, atol=1e-12)
    # the same through token ids, and against the formula written out directly
    np.testing.assert_allclose(cd.score(np.array([[1, 2], [1, 1], [1, 2]]), [[[1, 3]], [[1]], [[1, 2]]]), got,
                               rtol=0, atol=1e-12)
    dfd = {("a",): 2.0, ("b",): 1.0, ("a", "b"): 1.0}
    hyps = ["a b", "a a", "a b", "b a c a b", "c c c", ""]
    refsets = [["a c"], ["a"], ["a b"], ["a b c", "c a", "b"], ["c", "a b c"], ["a"]]
    direct = [_direct_cider_d(h, r, dfd, 4) for h, r in zip(hyps, refsets)]
    np.testing.assert_allclose(cd.score(hyps, refsets), direct, rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def fixed(coco):
    """Training df from 700 images; token ids; pycocoevalcap's scorer with that df swapped in."""
    ids, refs, res = coco
    train, test = ids[:700], ids[700:750]
    words = sorted({w for i in ids for c in refs[i] for w in c.split()})
    wid = {w: k + 1 for k, w in enumerate(words)}
    sc = CiderScorer()
    for i in train:
        sc.cook_append(None, refs[i])
    sc.compute_doc_freq()
    df_ids = DocFreq.from_references([[[wid[w] for w in c.split()] for c in refs[i]] for i in train])
    df_str = DocFreq.from_references([refs[i] for i in train])
    rng = random.Random(0)
    hyps = []
    for _ in test:
        for _ in range(5):
            w = rng.choice(refs[rng.choice(ids)]).split()
            hyps.append(" ".join(w[: rng.randint(0, len(w))] if rng.random() < 0.3 else w))
    return dict(refs=refs, train=train, test=test, wid=wid, pyco_df=dict(sc.document_frequency),
                df_ids=df_ids, df_str=df_str, hyps=hyps)


def _ids(captions, wid, T=20):
    out = np.zeros((len(captions), T), np.int64)
    for r, c in enumerate(captions):
        w = [wid[x] for x in c.split()][:T]
        out[r, : len(w)] = w
    return out


def test_from_references_counts_each_ngram_once_per_image(fixed):
    df, pyco = fixed["df_str"], fixed["pyco_df"]
    assert df.num_docs == 700 and len(df.df) == len(pyco)
    words = df.words
    got = {tuple(words[t - 1] for t in row if t): v for row, v in zip(df.ngrams, df.df)}
    assert got == pyco
    # the id-built table holds the same counts
    inv = {v: k for k, v in fixed["wid"].items()}
    got_ids = {tuple(inv[t] for t in row if t): v for row, v in zip(fixed["df_ids"].ngrams, fixed["df_ids"].df)}
    assert got_ids == pyco


def test_fixed_df_equals_pycocoevalcap_scorer_with_df_swapped_in(fixed):
    refs, test, hyps, wid = fixed["refs"], fixed["test"], fixed["hyps"], fixed["wid"]
    sc = FixedDfScorer(fixed["pyco_df"], np.log(700.0))
    for h, i in zip(hyps, np.repeat(test, 5)):
        sc.cook_append(h, refs[i])
    theirs = np.array(sc.compute_cider())
    ref_index = np.repeat(np.arange(len(test)), 5)
    ours_ids = CiderD(fixed["df_ids"]).score(_ids(hyps, wid), [[[wid[w] for w in c.split()] for c in refs[i]]
                                                                for i in test], ref_index)
    ours_str = CiderD(fixed["df_str"]).score(hyps, [refs[i] for i in test], ref_index)
    np.testing.assert_allclose(ours_ids, theirs, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours_str, theirs, rtol=0, atol=1e-9)


def test_pairwise_equals_pycocoevalcap_upper_triangle_mirrored(fixed):
    hyps, wid = fixed["hyps"], fixed["wid"]
    B, M = len(fixed["test"]), 5
    sc = FixedDfScorer(fixed["pyco_df"], np.log(700.0))
    for b in range(B):
        for i in range(M):
            for j in range(i, M):
                sc.cook_append(hyps[b * M + i], [hyps[b * M + j]])
    theirs = np.array(sc.compute_cider())
    K = CiderD(fixed["df_ids"]).pairwise(_ids(hyps, wid).reshape(B, M, -1))
    assert K.shape == (B, M, M)
    iu = np.triu_indices(M)
    np.testing.assert_allclose(K[:, iu[0], iu[1]].reshape(-1), theirs, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(K, K.transpose(0, 2, 1))  # mirrored
    K_str = CiderD(fixed["df_str"]).pairwise([hyps[b * M:(b + 1) * M] for b in range(B)])
    np.testing.assert_allclose(K_str, K, rtol=0, atol=1e-12)


def test_plain_cider_kind_is_the_tfidf_cosine(fixed):
    hyps, df = fixed["hyps"][:20], fixed["df_str"]
    pyco, N = fixed["pyco_df"], 700

    def vec(c, n):
        w = c.split()
        out = defaultdict(float)
        for i in range(len(w) - n + 1):
            out[tuple(w[i:i + n])] += 1.0
        return {g: tf * (math.log(N) - math.log(max(1.0, pyco.get(g, 0.0)))) for g, tf in out.items()}

    def plain(a, b):
        vals = []
        for n in range(1, 5):
            va, vb = vec(a, n), vec(b, n)
            s = sum(v * vb.get(g, 0.0) for g, v in va.items())
            na, nb = math.sqrt(sum(v * v for v in va.values())), math.sqrt(sum(v * v for v in vb.values()))
            vals.append(s / (na * nb) if na and nb else s)
        return 10 * sum(vals) / 4

    K = CiderD(df).pairwise([hyps[:5], hyps[5:10], hyps[10:15], hyps[15:20]], kind="cider")
    for b in range(4):
        for i in range(5):
            for j in range(5):
                assert abs(K[b, i, j] - plain(hyps[5 * b + i], hyps[5 * b + j])) < 1e-12


def test_score_and_pairwise_is_both_calls_in_one(fixed):
    hyps, wid, refs, test = fixed["hyps"], fixed["wid"], fixed["refs"], fixed["test"]
    cd = CiderD(fixed["df_ids"])
    H = _ids(hyps, wid, T=16).reshape(len(test), 5, 16)
    R = [[[wid[w] for w in c.split()][:16] for c in refs[i]] for i in test]
    q, K = cd.score_and_pairwise(H, R)
    np.testing.assert_allclose(q.reshape(-1), cd.score(H.reshape(-1, 16), R, np.repeat(np.arange(len(test)), 5)),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(K, cd.pairwise(H), rtol=0, atol=1e-12)


def test_exact_for_any_vocabulary_size(fixed):
    """Ids far beyond 55,107 (where base-B keys of 4-grams would overflow int64) give the same
    scores: the chunk is relabelled, and the df table switches to two-word keys."""
    hyps, wid, refs, test, train = fixed["hyps"], fixed["wid"], fixed["refs"], fixed["test"], fixed["train"]
    rng = np.random.default_rng(0)
    vals = np.unique(rng.integers(60_000, 2**31 - 1, size=2 * len(wid) + 2))[: len(wid) + 1]
    rng.shuffle(vals)
    big = np.concatenate([[0], vals])  # an injective map of every id to a huge one
    H = _ids(hyps, wid)
    R = [[[wid[w] for w in c.split()] for c in refs[i]] for i in test]
    Rbig = [[[int(big[t]) for t in c] for c in rs] for rs in R]
    ref_index = np.repeat(np.arange(len(test)), 5)
    np.testing.assert_allclose(CiderD().score(big[H], Rbig, ref_index), CiderD().score(H, R, ref_index),
                               rtol=0, atol=1e-12)
    tr = [[[wid[w] for w in c.split()] for c in refs[i]] for i in train]
    df_big = DocFreq.from_references([[[int(big[t]) for t in c] for c in rs] for rs in tr])
    assert df_big.base > 55108
    np.testing.assert_allclose(CiderD(df_big).score(big[H], Rbig, ref_index),
                               CiderD(fixed["df_ids"]).score(H, R, ref_index), rtol=0, atol=1e-12)
    np.testing.assert_allclose(CiderD(df_big).pairwise(big[H].reshape(len(test), 5, -1)),
                               CiderD(fixed["df_ids"]).pairwise(H.reshape(len(test), 5, -1)), rtol=0, atol=1e-12)


def test_docfreq_h5_roundtrip_and_vocab_beside_it(tmp_path, fixed):
    df = fixed["df_ids"]
    df.save_h5(tmp_path / "cider_df.h5")
    import h5py

    with h5py.File(tmp_path / "cider_df.h5") as f:
        assert f["ngrams"].dtype == np.int32 and f["ngrams"].shape == (len(df.df), 4)
        assert f["df"].dtype == np.float64 and int(f.attrs["num_docs"]) == 700
    back = DocFreq.from_h5(tmp_path / "cider_df.h5")
    np.testing.assert_array_equal(back.ngrams, df.ngrams)
    np.testing.assert_array_equal(back.df, df.df)
    assert back.num_docs == 700 and back.words is None
    words = [w for w, _ in sorted(fixed["wid"].items(), key=lambda kv: kv[1])]
    (tmp_path / "vocab.json").write_text(json.dumps({"words": words}))
    with_words = DocFreq.from_h5(tmp_path / "cider_df.h5")
    assert with_words.words == words
    # strings map through the vocabulary; a word outside it has df 0 -> max(1, df) = 1
    hyps = fixed["hyps"][:10]
    refsets = [fixed["refs"][i] for i in fixed["test"][:2]]
    ri = np.repeat([0, 1], 5)
    np.testing.assert_allclose(CiderD(with_words).score(hyps, refsets, ri), CiderD(df).score(
        _ids(hyps, fixed["wid"]), [[[fixed["wid"][w] for w in c.split()] for c in r] for r in refsets], ri),
        rtol=0, atol=1e-12)
    s = CiderD(with_words).score(["qqq zzz", "a qqq"], [["qqq zzz"], ["a qqq"]])
    assert np.isclose(s[0], 5.0)  # both unknown words and their bigram: idf = log N, orders 1-2 match
    assert df.lookup(np.array([[999999, 0, 0, 0]]))[0] == 0.0


def test_lookup_is_exact():
    rng = np.random.default_rng(0)
    grams = np.unique(rng.integers(1, 40, size=(5000, 4)), axis=0)
    order = rng.integers(1, 5, size=len(grams))
    grams = np.where(np.arange(4)[None, :] < order[:, None], grams, 0)
    grams = np.unique(grams, axis=0)
    vals = rng.integers(1, 100, size=len(grams)).astype(float)
    df = DocFreq(grams, vals, num_docs=100)
    np.testing.assert_array_equal(df.lookup(grams), vals)
    absent = np.array([[41, 0, 0, 0], [1, 41, 0, 0], [39, 39, 39, 41]])
    np.testing.assert_array_equal(df.lookup(absent), 0.0)


def test_bad_inputs_raise():
    cd = CiderD()
    with pytest.raises(ValueError):
        cd.score(["a b"], [["a"], ["b"]])  # 1 hypothesis, 2 sets, no ref_index
    with pytest.raises(ValueError):
        cd.score(["a b"], [[]])  # empty reference set
    with pytest.raises(ValueError):
        cd.score(np.array([[1, -2]]), [np.array([[1, 2]])])
    with pytest.raises(ValueError):
        cd.score(["a"], [["a"]], ref_index=[3])
    with pytest.raises(TypeError):
        CiderD(DocFreq([[1, 0, 0, 0]], [1.0], 2)).score(["a"], [["a"]])  # no word list for strings


def test_tiny_and_empty_inputs():
    cd = CiderD()
    # rows shorter than 4 positions hold no 3- or 4-grams; "a" vs "a": only unigrams, 10 * 1 / 4
    np.testing.assert_allclose(cd.score(["a"], [["a"]]), [0.0])  # corpus df: "a" in every document, idf 0
    df = DocFreq([[1, 0, 0, 0]], [1.0], num_docs=2, words=["a", "b"])
    np.testing.assert_allclose(CiderD(df).score(["a", "", "b"], [["a"], ["a"], [""]]), [2.5, 0.0, 0.0])
    np.testing.assert_allclose(CiderD(df).pairwise([["a", "b"]]), [[[2.5, 0.0], [0.0, 2.5]]])
    np.testing.assert_allclose(CiderD(df).pairwise(np.zeros((2, 3, 4), np.int64)), np.zeros((2, 3, 3)))
    assert cd.score([], []).shape == (0,)
