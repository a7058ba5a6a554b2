"""Inference-time set selection (rdpp_cli/decoding/select.py): the greedy MAP step against hand
computations and brute force, the qualities and kernel against explicit CIDEr-D scoring."""

import itertools
import math

import numpy as np
import pytest
import torch

from rdpp_cli.decoding.select import (
    SelectConfig,
    _cider_terms,
    first_occurrence,
    greedy_map,
    logprob_quality,
    rank_distinct,
    select,
)
from rdpp_cli.metrics.cider import DocFreq
from rdpp_cli.metrics.train_cider import TrainCider

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def log_det(L: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``log det L_Y`` (B,) of the subsets ``idx`` (B, k) of kernels L (B, C, C), by
    ``torch.linalg.slogdet`` (-inf where the determinant is not positive)."""
    sub = L.to(torch.float64).gather(1, idx.unsqueeze(-1).expand(-1, -1, L.shape[-1]))
    sub = sub.gather(2, idx.unsqueeze(1).expand(-1, idx.shape[1], -1))
    sign, ld = torch.linalg.slogdet(sub)
    return torch.where(sign > 0, ld, torch.full_like(ld, float("-inf")))


def _brute(L: torch.Tensor, k: int) -> float:
    C = L.shape[-1]
    subs = torch.tensor(list(itertools.combinations(range(C), k)))
    return float(log_det(L.expand(len(subs), C, C), subs).max())


def _tfidf_kernel(C: int, g: torch.Generator, D: int = 20) -> torch.Tensor:
    """A kernel of the form the selection uses: cosine similarities of sparse non-negative (tf-idf
    like) vectors, times q qᵀ."""
    V = torch.empty(C, D, dtype=torch.float64).exponential_(generator=g)
    V = V * (torch.rand(C, D, generator=g, dtype=torch.float64) < 0.3)
    V[:, 0] += 1e-3
    V = V / V.norm(dim=1, keepdim=True)
    q = torch.rand(C, generator=g, dtype=torch.float64) + 0.5
    return (V @ V.T) * q[:, None] * q[None]


# -- hand-computed cases ---------------------------------------------------------------------------

def test_3x3_by_hand_a_less_correlated_item_beats_a_higher_quality_one():
    # step 1: item 0 (L_00 = 5 is the largest); step 2 gains: item 1: 4 - 2.2²/5 = 3.032,
    # item 2: 3.1 - 0 = 3.1 -> item 2, though L_11 = 4 > L_22. det{0,2} = 15.5 > det{0,1} = 15.16.
    L = _t([[5, 2.2, 0], [2.2, 4, 0], [0, 0, 3.1]])[None]
    assert greedy_map(L, 2).tolist() == [[0, 2]]
    assert greedy_map(L, 3).tolist() == [[0, 2, 1]]
    assert rank_distinct(torch.diagonal(L, dim1=1, dim2=2), 2).tolist() == [[0, 1]]
    assert float(log_det(L, torch.tensor([[0, 2]]))) == pytest.approx(math.log(15.5), abs=1e-12)
    assert float(log_det(L, torch.tensor([[0, 1]]))) == pytest.approx(math.log(15.16), abs=1e-12)


def test_4x4_by_hand_duplicate_and_rank_deficient_kernel():
    # L = V Vᵀ with rows 0 and 1 equal (an exact duplicate) and rank 2:
    # step 1: item 0 or 1 (L = 4): the first, 0; step 2 gains: item 2: 1, item 3: 2.44 - 2²/4 = 1.44 -> 3;
    # step 3: every gain is 0 (rank 2), so the rest go by quality, distinct items first: 2, then 1.
    V = _t([[2, 0], [2, 0], [0, 1], [1, 1.2]])
    L = (V @ V.T)[None]
    torch.testing.assert_close(L[0], _t([[4, 4, 0, 2], [4, 4, 0, 2], [0, 0, 1, 1.2], [2, 2, 1.2, 2.44]]))
    valid = torch.tensor([[True, False, True, True]])
    assert greedy_map(L, 4, valid=valid).tolist() == [[0, 3, 2, 1]]
    assert float(log_det(L, torch.tensor([[0, 3]]))) == pytest.approx(math.log(4 * 2.44 - 4), abs=1e-12)
    # without the duplicate mask the quality fallback would take the duplicate (L_11 = 4 > L_22 = 1)
    assert greedy_map(L, 3).tolist() == [[0, 3, 1]]


def test_first_occurrence_and_rank_distinct_by_hand():
    toks = torch.tensor([[[3, 4, 0], [5, 0, 0], [3, 4, 0], [3, 4, 1], [5, 0, 0]]])
    valid = first_occurrence(toks)
    assert valid.tolist() == [[True, True, False, True, False]]
    score = _t([[0.9, 0.5, 0.9, 0.1, 0.5]])
    # distinct ones by score (0, 1, 3), then the duplicates by score (2, then 4)
    assert rank_distinct(score, 5, valid).tolist() == [[0, 1, 3, 2, 4]]
    assert rank_distinct(score, 2, valid).tolist() == [[0, 1]]
    many = torch.randint(0, 3, (4, 30, 2), generator=torch.Generator().manual_seed(0))  # many duplicates
    want = [[r.tolist() not in img[:i].tolist() for i, r in enumerate(img)] for img in many]
    assert first_occurrence(many).tolist() == want


def test_logprob_quality_is_the_geometric_mean_token_probability():
    # 2 words + EOS with probabilities 0.5, 0.25, 0.5: log p = log(1/16), 3 tokens -> (1/16)^(1/3)
    q = logprob_quality(torch.tensor([[math.log(1 / 16)]], dtype=torch.float64), torch.tensor([[2]]))
    assert float(q) == pytest.approx((1 / 16) ** (1 / 3), rel=1e-12)


# -- against brute force -----------------------------------------------------------------------------

def test_greedy_equals_brute_force_on_random_selection_kernels():
    """C ≤ 10, k = 2..5, on kernels of the selection's form: the greedy set is the MAP set in ≥ 95 %
    of cases (greedy MAP is a heuristic: it cannot be 100 %)."""
    g = torch.Generator().manual_seed(0)
    hits = total = 0
    for C in range(3, 11):
        for k in range(2, min(C, 6)):
            for _ in range(25):
                L = _tfidf_kernel(C, g)[None]
                got = float(log_det(L, greedy_map(L, k)))
                hits += got >= _brute(L, k) - 1e-9
                total += 1
    assert hits / total >= 0.95, f"{hits}/{total}"


def test_every_greedy_step_adds_the_best_single_item():
    """What greedy MAP guarantees on any PSD kernel (here dense Gaussian-Wishart ones, where it
    finds the global MAP set less often): each step maximises log det of the extended set."""
    g = torch.Generator().manual_seed(1)
    for C, k in ((6, 4), (10, 5), (9, 9)):
        for _ in range(20):
            A = torch.randn(C, C, generator=g, dtype=torch.float64)
            L = (A @ A.T)[None]
            idx = greedy_map(L, k)[0]
            for t in range(k):
                prefix = idx[:t].tolist()
                rest = [i for i in range(C) if i not in prefix]
                ext = torch.tensor([prefix + [i] for i in rest])
                best = log_det(L.expand(len(rest), C, C), ext).max()
                assert float(log_det(L, idx[None, :t + 1])) == pytest.approx(float(best), abs=1e-9)


def test_greedy_versus_the_greedy_by_quality_set():
    """Never worse for k ≤ 2 (both sets hold the top item, and greedy's second item is the best
    partner); for k ≥ 3 it can be worse (the counterexample below), but rarely."""
    # counterexample, L = V Vᵀ: greedy takes a, then x (gain 0.5 > 0.49), then b (gain 0.245):
    # det = 1 · 0.5 · 0.245 = 0.1225; the three highest L_ii, {a, b, c}, give 1 · 0.49 · 0.49 = 0.2401
    V = _t([[1, 0, 0], [0.6, 0.7, 0], [0.6, 0, 0.7], [0, 0.5, 0.5]])  # a, b, c, x
    L = (V @ V.T)[None]
    greedy, by_quality = greedy_map(L, 3), rank_distinct(torch.diagonal(L, dim1=1, dim2=2), 3)
    assert greedy.tolist() == [[0, 3, 1]] and sorted(by_quality[0].tolist()) == [0, 1, 2]
    assert float(log_det(L, greedy)) == pytest.approx(math.log(0.1225), abs=1e-9)
    assert float(log_det(L, by_quality)) == pytest.approx(math.log(0.2401), abs=1e-9)

    g = torch.Generator().manual_seed(2)
    worse = total = 0
    for C in (5, 8, 10, 20):
        A = torch.randn(200, C, C, generator=g, dtype=torch.float64)
        L = A @ A.transpose(1, 2)
        diag = torch.diagonal(L, dim1=1, dim2=2)
        for k in (1, 2, 3, 5):
            gap = log_det(L, greedy_map(L, k)) - log_det(L, rank_distinct(diag, k))
            if k <= 2:
                assert (gap >= -1e-9).all()
            worse += int((gap < -1e-9).sum())
            total += len(gap)
    assert worse / total <= 0.05, f"{worse}/{total}"


def test_batched_equals_one_image_at_a_time_and_survives_a_kernel_that_is_not_psd():
    g = torch.Generator().manual_seed(3)
    L = torch.stack([_tfidf_kernel(12, g) for _ in range(6)])
    L[5] = torch.rand(12, 12, generator=g, dtype=torch.float64) * 2 - 1  # symmetric, indefinite
    L[5] = (L[5] + L[5].T) / 2 + torch.eye(12, dtype=torch.float64)
    batched = greedy_map(L, 7)
    for b in range(6):
        assert batched[b].tolist() == greedy_map(L[b:b + 1], 7)[0].tolist()
    assert all(len(set(r)) == 7 for r in batched.tolist())


# -- qualities and kernel from CIDEr-D ----------------------------------------------------------------

@pytest.fixture(scope="module")
def scorer():
    """The reward's scorer over words 1..11, EOS id 12, captions of at most 6 words."""
    rng = np.random.default_rng(0)
    refs = [np.concatenate([rng.integers(1, 12, size=(5, 5)), np.full((5, 1), 12)], 1) for _ in range(30)]
    return TrainCider(DocFreq.from_references(refs), eos=12, max_len=6, ref_len=6)


def _candidates(rng, B=3, C=7, T=6, V=11):
    toks = rng.integers(1, V, size=(B, C, T))
    lens = rng.integers(2, T + 1, size=(B, C))
    toks = toks * (np.arange(T) < lens[..., None])
    toks[:, 3] = toks[:, 1]  # an exact duplicate in every image
    lens[:, 3] = lens[:, 1]
    return toks, lens


def test_consensus_is_the_mean_cider_d_against_the_other_candidates(scorer):
    """Each candidate scored (EOS counted where it ended) against the other C - 1 as references; the
    kernel is the reward's, in its direction."""
    toks, lens = _candidates(np.random.default_rng(1))
    consensus, S = _cider_terms(toks, scorer)
    B, C, _ = toks.shape
    for b in range(B):
        for i in range(C):
            others = np.delete(toks[b], i, axis=0)
            want = scorer.score(toks[b, i][None], [others])[0]
            assert consensus[b, i] == pytest.approx(want, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(S, scorer.pairwise(toks), rtol=0, atol=1e-12)
    assert _cider_terms(toks, scorer, consensus=False)[0] is None
    np.testing.assert_allclose(_cider_terms(toks, scorer, consensus=False)[1], S, rtol=0, atol=1e-12)


def test_select_methods_on_candidates(scorer):
    toks, lens = _candidates(np.random.default_rng(2))
    T = torch.from_numpy(toks)
    lp = torch.from_numpy(-np.random.default_rng(3).uniform(1, 9, size=lens.shape))
    ln = torch.from_numpy(lens)
    consensus, S = _cider_terms(toks, scorer)
    valid = first_occurrence(T)
    k = 4
    mbr = select(T, lp, ln, k, SelectConfig("mbr").check(k), scorer)
    assert mbr.tolist() == rank_distinct(torch.from_numpy(consensus), k, valid).tolist()
    by_lp = select(T, lp, ln, k, SelectConfig("logprob").check(k), None)
    assert by_lp.tolist() == rank_distinct(logprob_quality(lp, ln), k, valid).tolist()
    for quality in ("consensus", "logprob"):
        q = torch.from_numpy(consensus) if quality == "consensus" else logprob_quality(lp, ln)
        L = torch.from_numpy(S) * q[:, :, None] * q[:, None, :]
        dpp = select(T, lp, ln, k, SelectConfig("dpp", quality=quality).check(k), scorer)
        assert dpp.tolist() == greedy_map(L, k, valid=valid, fallback=q).tolist()
    for rows in (mbr, by_lp, dpp):  # the duplicate (candidate 3 = candidate 1) is never taken twice
        assert not any(1 in r and 3 in r for r in rows.tolist())


@pytest.mark.parametrize("kw, n, match", [
    (dict(method="best"), 5, "unknown --select 'best'"),
    (dict(method="dpp", quality="bleu"), 5, "unknown --quality 'bleu'"),
    (dict(method="mbr", quality="logprob"), 5, "--select mbr ranks by consensus"),
    (dict(method="dpp", candidates=4), 5, "--candidates 4 must be at least --n 5"),
])
def test_bad_selection_settings_are_one_line(kw, n, match):
    with pytest.raises(ValueError, match=match):
        SelectConfig(**kw).check(n)
    assert SelectConfig("logprob").check(3).quality == "logprob"
    assert SelectConfig("dpp").check(3).quality == "consensus"
