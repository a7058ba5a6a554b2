"""Self-CIDEr, Div-n, mBLEU-4 and the other diversity statistics, against hand computations and
pycocoevalcap."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu_scorer import BleuScorer

from rdpp_cli.metrics import diversity as D
from rdpp_cli.metrics.cider import CiderD, DocFreq
from rdpp_cli.metrics.self_cider import self_cider, self_cider_from_kernel, self_cider_ragged

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data" / "coco-val2014-1k"


@pytest.fixture(scope="module")
def refs():
    ann = json.loads((DATA / "captions_val2014_1k.json").read_text())
    out = defaultdict(list)
    for a in ann["annotations"]:
        out[a["image_id"]].append(" ".join(a["caption"].lower().replace(".", " ").replace(",", " ").split()))
    return [out[i] for i in sorted(out)]


@pytest.fixture(scope="module")
def train_df(refs):
    return DocFreq.from_references(refs[:800])


@pytest.mark.parametrize("variant", ["cider-d", "cider"])
def test_self_cider_is_0_for_identical_and_1_for_disjoint(variant, train_df):
    same = [["a man riding a horse on a beach"] * 5, ["two dogs play with a red ball"] * 3]
    assert np.allclose(self_cider_ragged(same, train_df, variant), 0.0, atol=1e-12)
    # no two captions share a word, all long enough for every order: both kernels are 10 * I (a
    # caption against itself scores 10 x its cosine, 1, in every order; plain CIDEr's self-CIDEr
    # divides the kernel by 10, which does not change the spectrum's ratios)
    disjoint = [["a man riding a horse", "two dogs play with balls", "the red bus stops here",
                 "cats sleeping on sofas today", "tall green trees near lakes"]]
    K = CiderD(train_df).pairwise(disjoint, kind=variant)
    np.testing.assert_allclose(K[0], 10.0 * np.eye(5), atol=1e-12)
    assert abs(self_cider(disjoint, train_df, variant)[0] - 1.0) < 1e-12


def test_self_cider_formula_on_a_kernel_by_hand():
    # eigen/singular values 3 and 1 (K = [[2, 1], [1, 2]]): -log(sqrt(3) / (sqrt(3) + 1)) / log 2
    K = np.array([[2.0, 1.0], [1.0, 2.0]])
    want = -math.log(math.sqrt(3) / (math.sqrt(3) + 1)) / math.log(2)
    assert abs(self_cider_from_kernel(K, "cider-d") - want) < 1e-12
    assert abs(self_cider_from_kernel(K * 10, "cider") - want) < 1e-12  # K/10, eigvalsh
    batch = self_cider_from_kernel(np.stack([K, np.eye(2), np.ones((2, 2))]))
    np.testing.assert_allclose(batch, [want, 1.0, 0.0], atol=1e-12)
    assert self_cider_from_kernel(np.zeros((1, 3, 3)))[0] == 0.0  # all-empty captions
    assert self_cider_from_kernel(np.ones((4, 1, 1)))[0] == 0.0  # one caption
    with pytest.raises(ValueError):
        self_cider_from_kernel(K, "bleu")


def test_self_cider_orders_sets_by_diversity(refs, train_df):
    # humans' five references are diverse, five near-copies are not, one repeated caption is 0
    base = refs[0][0].split()
    near = [" ".join(base[:len(base) - k]) for k in range(5)]
    sc = self_cider([refs[0][:5], near, [refs[0][0]] * 5], train_df)
    assert sc[0] > sc[1] > sc[2] == 0.0
    assert 0.0 < sc[1] < 1.0 and 0.5 < sc[0] <= 1.0


def test_div_n_by_hand():
    caps = [["a man on a horse", "a man"], ["", "x"], ["b b b"]]
    # image 0: 7 words; unigrams {a, man, on, horse} = 4; bigrams {a man, man on, on a, a horse} = 4
    # image 1: 1 word, 1 unigram, 0 bigrams; image 2: 3 words, 1 unigram, 1 bigram
    np.testing.assert_allclose(D.div_n(caps, 1), [4 / 7, 1.0, 1 / 3])
    np.testing.assert_allclose(D.div_n(caps, 2), [4 / 7, 0.0, 1 / 3])
    assert D.div_n([["", ""]], 1)[0] == 0.0


def test_sentence_bleu_vs_others_equals_pycocoevalcap(refs):
    caps = [r[:5] for r in refs[:200]] + [refs[300]]  # 6-7 captions for the last image
    caps[0] = ["a a a a", "a a", "a a a a", "", "b"]  # repeats, empty, single word
    caps[1] = ["same caption here"] * 5
    caps.append(["only one caption"])
    bs = BleuScorer(n=4)
    for c in caps:
        if len(c) > 1:
            for i in range(len(c)):
                bs += (c[i], c[:i] + c[i + 1:])
    _, per = bs.compute_score(option="closest", verbose=0)
    ours = D.sentence_bleu_vs_others(caps)
    np.testing.assert_allclose(np.concatenate([b for b in ours if len(b) > 1]), per[3], rtol=0, atol=1e-12)
    assert np.isnan(ours[-1]).all()
    mb = D.mbleu4(caps)
    assert abs(mb[5] - np.mean(ours[5])) < 1e-15 and np.isnan(mb[-1])


def test_counts_vocabulary_novel_and_oracle():
    caps = [["a dog", "a dog", "a cat"], ["a bird flies"]]
    np.testing.assert_array_equal(D.distinct_captions(caps), [2, 1])
    assert D.vocabulary_size(caps) == 5
    assert D.novel_fraction(caps, ["a  dog", "a bird"]) == pytest.approx(2 / 4)
    best, mean = D.oracle([np.array([0.1, 0.7, 0.4]), np.array([2.0])])
    np.testing.assert_allclose(best, [0.7, 2.0])
    np.testing.assert_allclose(mean, [0.4, 2.0])


def test_oracle_of_n_copies_is_that_captions_score(refs):
    hyps = ["a man is riding a horse", "a plate of food on a table", "a cat"]
    sets = refs[:3]
    one = CiderD().score(hyps, sets)
    n = 4
    copies = CiderD().score([h for h in hyps for _ in range(n)], sets, ref_index=np.repeat(np.arange(3), n))
    best, mean = D.oracle(np.split(copies, 3))
    np.testing.assert_allclose(best, one, rtol=0, atol=1e-12)
    np.testing.assert_allclose(mean, one, rtol=0, atol=1e-12)


def test_symmetric_kernels_use_the_same_singular_values_as_svd(refs, train_df):
    K = CiderD(train_df).pairwise([r[:5] for r in refs[:100]])
    lam = np.linalg.svd(K, compute_uv=False)
    want = -np.log(np.sqrt(lam[:, 0]) / np.sqrt(lam).sum(1)) / np.log(5)
    np.testing.assert_allclose(self_cider_from_kernel(K), want, rtol=0, atol=1e-12)
    asym = K.copy()
    asym[:, 0, 1] += 0.5  # not symmetric: np.linalg.svd itself
    lam = np.linalg.svd(asym, compute_uv=False)
    np.testing.assert_allclose(self_cider_from_kernel(asym), -np.log(np.sqrt(lam[:, 0]) / np.sqrt(lam).sum(1)) / np.log(5),
                               rtol=0, atol=1e-12)
