"""Reward functions (rdpp_cli.training.rewards) against small hand-computed cases."""

import numpy as np
import pytest
import torch

from rdpp_cli.training.rewards import (
    dpp_ensemble,
    dpp_weights,
    mean_baseline_advantage,
    pg_loss,
    scst_advantage,
    subtract_mean,
)

pytestmark = pytest.mark.unit

f64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=f64)


# --------------------------------------------------------------------------------------------
# dpp_weights: hand-computed cases
# --------------------------------------------------------------------------------------------

def test_dpp_weights_2x2_by_hand():
    # q = (2, 1), S = [[10, 3], [3, 8]]
    # L = S ⊙ q qᵀ = [[2·2·10, 2·1·3], [1·2·3, 1·1·8]] = [[40, 6], [6, 8]]
    # det L = 40·8 − 6·6 = 284 > 0, so L⁻¹ = (1/284)[[8, −6], [−6, 40]]: signs [[+, −], [−, +]]
    # w_1 = (1/2)(+40 − 6) = 17 = (q_1²S_11 − q_1q_2S_12)/M = (4·10 − 2·3)/2
    # w_2 = (1/2)(−6 + 8) = 1  = (q_2²S_22 − q_2q_1S_21)/M = (8 − 6)/2
    q = t([[2.0, 1.0]])
    S = t([[[10.0, 3.0], [3.0, 8.0]]])
    assert torch.allclose(dpp_ensemble(q, S), t([[[40.0, 6.0], [6.0, 8.0]]]))
    w = dpp_weights(q, S)
    assert w.dtype == f64 and w.shape == (1, 2)
    assert torch.allclose(w, t([[17.0, 1.0]]), rtol=0, atol=1e-9)


def test_dpp_weights_m2_reduces_to_closed_form_on_a_batch():
    # For M = 2 with det L > 0 and S_12 > 0 the inverse's off-diagonal is −L_12/det < 0, so
    # w_i = (q_i²S_ii − q_iq_jS_ij)/2 for every image of the batch.
    g = torch.Generator().manual_seed(0)
    B = 64
    q = torch.rand(B, 2, generator=g, dtype=f64) * 3 + 0.1
    s12 = torch.rand(B, generator=g, dtype=f64) * 9  # < S_ii = 10: L is positive definite
    S = torch.full((B, 2, 2), 10.0, dtype=f64)
    S[:, 0, 1] = S[:, 1, 0] = s12
    w = dpp_weights(q, S)
    expect = torch.stack([(q[:, 0] ** 2 * 10 - q[:, 0] * q[:, 1] * s12) / 2,
                          (q[:, 1] ** 2 * 10 - q[:, 1] * q[:, 0] * s12) / 2], dim=1)
    assert torch.allclose(w, expect, rtol=1e-12, atol=1e-9)


def test_dpp_weights_3x3_by_hand_with_a_positive_off_diagonal_sign():
    # q = (1, 2, 1), S = [[10, 1, 0.1], [1, 10, 2], [0.1, 2, 10]]
    # L = [[10, 2, 0.1], [2, 40, 4], [0.1, 4, 10]]
    # det L = 10(40·10 − 4·4) − 2(2·10 − 4·0.1) + 0.1(2·4 − 40·0.1) = 3840 − 39.2 + 0.4 = 3801.2 > 0
    # cofactors: C12 = −(2·10 − 4·0.1) = −19.6 < 0;  C13 = 2·4 − 40·0.1 = +4 > 0;
    #            C23 = −(10·4 − 2·0.1) = −39.8 < 0;  diagonal cofactors > 0 (L positive definite)
    # sign(L⁻¹) = [[+, −, +], [−, +, −], [+, −, +]]: samples 1 and 3 are both close to sample 2,
    # so raising their own similarity would *raise* det L (L⁻¹_13 > 0).
    # w_1 = (10 − 2 + 0.1)/3 = 2.7;  w_2 = (−2 + 40 − 4)/3 = 34/3;  w_3 = (0.1 − 4 + 10)/3 = 6.1/3
    q = t([[1.0, 2.0, 1.0]])
    S = t([[[10.0, 1.0, 0.1], [1.0, 10.0, 2.0], [0.1, 2.0, 10.0]]])
    L = dpp_ensemble(q, S)[0]
    assert torch.allclose(L, t([[10.0, 2.0, 0.1], [2.0, 40.0, 4.0], [0.1, 4.0, 10.0]]))
    assert torch.linalg.det(L).item() == pytest.approx(3801.2, rel=1e-12)
    assert torch.equal(torch.sign(torch.linalg.inv(L)), t([[1, -1, 1], [-1, 1, -1], [1, -1, 1]]))
    w = dpp_weights(q, S)
    assert torch.allclose(w, t([[2.7, 34.0 / 3, 6.1 / 3]]), rtol=0, atol=1e-9)


def test_dpp_weights_follow_the_inverse_sign_literally_when_L_is_not_psd():
    # CIDEr-D similarities need not form a PSD matrix. q = (1, 1), S = [[10, 12], [12, 10]]:
    # det L = 100 − 144 < 0, L⁻¹ = (1/−44)[[10, −12], [−12, 10]]: signs [[−, +], [+, −]]
    # w_1 = w_2 = (−10 + 12)/2 = 1 — what the authors' np.linalg.inv + sign cut gives too.
    w = dpp_weights(t([[1.0, 1.0]]), t([[[10.0, 12.0], [12.0, 10.0]]]))
    assert torch.allclose(w, t([[1.0, 1.0]]), atol=1e-9)


def _authors_reference(q, S, eps=1e-10):
    """The published code's computation (misc/rewards.py, quality_diversity_reward, is_cut=True)."""
    b, n = q.shape
    L = S * np.matmul(q[:, :, None], q[:, None, :])
    Linv = np.linalg.inv(L + eps * np.tile(np.eye(n)[None], [b, 1, 1]))
    Linv[Linv > 0] = 1.0
    Linv[Linv < 0] = -1.0
    return (Linv * L).sum(-1) / n


def test_dpp_weights_match_the_published_numpy_computation():
    rng = np.random.default_rng(1)
    B, M = 40, 5
    q = rng.uniform(0, 4, (B, M))
    A = rng.uniform(0, 10, (B, M, M))
    S = (A + A.transpose(0, 2, 1)) / 2
    S[:, np.arange(M), np.arange(M)] = 10.0
    w = dpp_weights(torch.from_numpy(q), torch.from_numpy(S))
    np.testing.assert_allclose(w.numpy(), _authors_reference(q, S), rtol=1e-10, atol=1e-9)


def test_dpp_weights_float32_input_uses_float64_algebra():
    # Entries ~100 in float32 would swamp ε = 1e-10; the result must equal the float64 result
    # of the same (float32-representable) inputs.
    rng = np.random.default_rng(2)
    q = rng.uniform(0.5, 3, (8, 4)).astype(np.float32)
    S = np.full((8, 4, 4), 10.0, dtype=np.float32)
    S[:, 0, 1] = S[:, 1, 0] = 10.0  # samples 0 and 1 identical: L is singular up to ε
    w32 = dpp_weights(torch.from_numpy(q), torch.from_numpy(S))
    w64 = dpp_weights(torch.from_numpy(q.astype(np.float64)), torch.from_numpy(S.astype(np.float64)))
    assert w32.dtype == torch.float32
    assert torch.allclose(w32.double(), w64, rtol=1e-6, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Why the sign cut matters
# --------------------------------------------------------------------------------------------

def test_without_the_cut_every_weight_is_one_over_m():
    # Σ_j Linv_ij L_ij = (Linv L)_ii = (I − ε Linv)_ii ≈ 1 for a well-conditioned L: the uncut
    # weight is 1/M whatever the qualities and similarities — a gradient that only pushes up the
    # probability of every sample equally (like maximum likelihood on the model's own samples).
    g = torch.Generator().manual_seed(3)
    B, M = 32, 5
    q = torch.rand(B, M, generator=g, dtype=f64) * 3 + 0.2
    X = torch.randn(B, M, 8, generator=g, dtype=f64)
    S = X @ X.transpose(1, 2) + 2.0 * torch.eye(M, dtype=f64)  # positive definite
    w = dpp_weights(q, S, cut=False)
    assert torch.allclose(w, torch.full((B, M), 1.0 / M, dtype=f64), rtol=0, atol=1e-9)
    cut = dpp_weights(q, S)
    assert cut.std() > 0.1  # with the cut the weights carry quality and similarity


def test_the_cut_rewards_the_distinct_sample_over_a_near_duplicate_pair():
    # Three samples of equal quality; 0 and 1 almost the same caption (S_01 = 9), 2 different.
    q = t([[1.0, 1.0, 1.0]])
    S = t([[[10.0, 9.0, 1.0], [9.0, 10.0, 1.0], [1.0, 1.0, 10.0]]])
    w = dpp_weights(q, S)[0]
    # L = S; L⁻¹ has negative (0,1), (0,2), (1,2) cofactors: C01 = −(9·10 − 1·1) = −89,
    # C02 = 9·1 − 10·1 = −1, C12 = −(10·1 − 9·1) = −1 → w_0 = w_1 = (10 − 9 − 1)/3 = 0,
    # w_2 = (10 − 1 − 1)/3 = 8/3.
    assert torch.allclose(w, t([0.0, 0.0, 8.0 / 3]), atol=1e-9)
    assert torch.allclose(dpp_weights(q, S, cut=False)[0], t([1 / 3, 1 / 3, 1 / 3]), atol=1e-9)


# --------------------------------------------------------------------------------------------
# Degenerate sets stay finite
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M", [2, 3, 5, 7])
def test_identical_samples_give_finite_weights(M):
    # L = c·11ᵀ (rank 1, c = q²S); (L + εI)⁻¹ = (1/ε)(I − 11ᵀ/M) + 11ᵀ/(M(Mc + ε)):
    # diagonal > 0, off-diagonal < 0, so w_i = (c − (M − 1)c)/M = c(2 − M)/M.
    q = torch.full((3, M), 2.0, dtype=f64)
    S = torch.full((3, M, M), 10.0, dtype=f64)
    w = dpp_weights(q, S)
    assert torch.isfinite(w).all()
    assert torch.allclose(w, torch.full((3, M), 40.0 * (2 - M) / M, dtype=f64), atol=1e-6)


def test_zero_quality_sample_gets_zero_and_leaves_the_others_alone():
    # q_k = 0 zeroes row and column k of L: L is block diagonal, (L + εI)⁻¹ has 1/ε at (k, k)
    # and the inverse of the other block elsewhere. So w_k = 0 and every other weight is the
    # weight of the set without k, rescaled from 1/(M − 1) to 1/M.
    rng = np.random.default_rng(4)
    M = 5
    q = rng.uniform(0.5, 3, (6, M))
    A = rng.uniform(0, 6, (6, M, M))
    S = (A + A.transpose(0, 2, 1)) / 2
    S[:, np.arange(M), np.arange(M)] = 10.0
    q[:, 2] = 0.0
    w = dpp_weights(torch.from_numpy(q), torch.from_numpy(S)).numpy()
    keep = [0, 1, 3, 4]
    w_sub = dpp_weights(torch.from_numpy(q[:, keep]), torch.from_numpy(S[:, keep][:, :, keep])).numpy()
    assert np.isfinite(w).all()
    np.testing.assert_array_equal(w[:, 2], 0.0)
    np.testing.assert_allclose(w[:, keep], w_sub * (M - 1) / M, rtol=1e-9, atol=1e-9)


def test_all_zero_quality_gives_zero_weights():
    w = dpp_weights(torch.zeros(2, 4, dtype=f64), torch.full((2, 4, 4), 10.0, dtype=f64))
    assert torch.equal(w, torch.zeros(2, 4, dtype=f64))


def test_empty_captions_give_finite_weights():
    # An empty caption scores 0 against the references (q = 0) and 0 against everything,
    # itself included (CIDEr-D is 0 when a norm is 0): its row and column of S are all zero.
    # Two empty samples out of four; the other two: q = (2, 1), S = [[10, 3], [3, 8]] → the 2×2
    # case above, rescaled to M = 4: w = (40 − 6)/4, (8 − 6)/4.
    q = t([[2.0, 0.0, 1.0, 0.0]])
    S = torch.zeros(1, 4, 4, dtype=f64)
    S[0, 0, 0], S[0, 2, 2], S[0, 0, 2], S[0, 2, 0] = 10.0, 8.0, 3.0, 3.0
    w = dpp_weights(q, S)
    assert torch.isfinite(w).all()
    assert torch.allclose(w, t([[34.0 / 4, 0.0, 2.0 / 4, 0.0]]), atol=1e-9)


def test_exactly_singular_matrix_falls_back_to_the_pseudo_inverse():
    # With ε = 0 and a zero-quality sample L is exactly singular: the LU inverse fails and the
    # pseudo-inverse [[0, 0], [0, 1/8]] is used: w = (0, 8/2).
    q = t([[0.0, 1.0], [2.0, 1.0]])
    S = t([[[10.0, 3.0], [3.0, 8.0]], [[10.0, 3.0], [3.0, 8.0]]])
    w = dpp_weights(q, S, eps=0.0)
    assert torch.isfinite(w).all()
    assert torch.allclose(w, t([[0.0, 4.0], [17.0, 1.0]]), atol=1e-9)  # second image unaffected


def test_dpp_weights_reject_bad_shapes():
    with pytest.raises(ValueError, match=r"q must be \(B, M\)"):
        dpp_weights(torch.ones(3), torch.ones(3, 3))


# --------------------------------------------------------------------------------------------
# SCST and mean baselines
# --------------------------------------------------------------------------------------------

def test_scst_advantage_by_hand_and_zero_when_samples_equal_the_greedy_caption():
    adv = scst_advantage(t([[1.0, 2.5, 0.0], [3.0, 3.0, 3.0]]), t([1.5, 3.0]))
    assert torch.equal(adv, t([[-0.5, 1.0, -1.5], [0.0, 0.0, 0.0]]))


def test_mean_baseline_is_leave_one_out():
    # scores (1, 2, 3): the others' means are (2.5, 2, 1.5) → (−1.5, 0, 1.5)
    adv = mean_baseline_advantage(t([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]]))
    assert torch.allclose(adv, t([[-1.5, 0.0, 1.5], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="at least 2"):
        mean_baseline_advantage(t([[1.0]]))


def test_subtract_mean_centres_the_weights_per_image():
    assert torch.allclose(subtract_mean(t([[17.0, 1.0], [2.0, 2.0]])), t([[8.0, -8.0], [0.0, 0.0]]))


# --------------------------------------------------------------------------------------------
# Policy-gradient loss
# --------------------------------------------------------------------------------------------

def test_pg_loss_by_hand_and_its_gradient():
    # tokens: caption 0 = 2 tokens (logp −1, −2), caption 1 = 1 token (EOS, logp −0.5)
    # loss = −(2·(−1) + 2·(−2) + (−1)·(−0.5)) / 3 = 5.5 / 3
    logp = t([[-1.0, -2.0, -7.0], [-0.5, -9.0, -9.0]]).requires_grad_()
    mask = t([[1, 1, 0], [1, 0, 0]])
    w = t([2.0, -1.0]).requires_grad_()
    loss = pg_loss(logp, mask, w)
    assert loss.item() == pytest.approx(5.5 / 3, rel=1e-12)
    loss.backward()
    # d loss / d logp_nt = −w_n · mask_nt / 3; weights are constants (no gradient)
    assert torch.allclose(logp.grad, t([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    assert w.grad is None


def test_pg_loss_grouped_normalises_per_sample_slot():
    # B = 2 images × M = 2 samples, image-major rows (b0s0, b0s1, b1s0, b1s1).
    # slot 0: rows 0, 2: tokens 2 + 1, sum −w·logp = −(1·(−1) + 1·(−1)) − 3·(−2) = 2 + 6 = 8 → 8/3
    # slot 1: rows 1, 3: tokens 1 + 3, sum = −(2·(−1)) − (1·(−1)·3) = 2 + 3 = 5 → 5/4
    # loss = (8/3 + 5/4)/2
    logp = t([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0], [-2.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = t([[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 1, 1]])
    w = t([1.0, 2.0, 3.0, 1.0])
    assert pg_loss(logp, mask, w, groups=2).item() == pytest.approx((8 / 3 + 5 / 4) / 2, rel=1e-12)
    # ungrouped: (2 + 2 + 6 + 3) / 7
    assert pg_loss(logp, mask, w).item() == pytest.approx(13 / 7, rel=1e-12)


def test_pg_loss_divides_by_the_given_token_counts():
    """Under DDP the loss divides by the whole step's counts shared out over processes (``tokens``):
    by hand, rows (w = 1, 2) with log-probs (-1, -2 | -3, 0): terms 1 + 2 and 6."""
    logp = torch.tensor([[-1.0, -2.0], [-3.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    w = torch.tensor([1.0, 2.0])
    assert float(pg_loss(logp, mask, w)) == pytest.approx(9.0 / 3)
    assert float(pg_loss(logp, mask, w, tokens=torch.tensor(4.5))) == pytest.approx(9.0 / 4.5)
    # two slots: slot 0 (3 over 2 tokens), slot 1 (6 over 1 token); given counts (3, 2) instead
    assert float(pg_loss(logp, mask, w, groups=2)) == pytest.approx((3 / 2 + 6 / 1) / 2)
    assert float(pg_loss(logp, mask, w, groups=2, tokens=torch.tensor([3.0, 2.0]))) == pytest.approx((3 / 3 + 6 / 2) / 2)


def test_pg_loss_ignores_minus_inf_under_the_mask():
    """Filtered sampling (top-k, generate's scores) gives -inf log-probs at padding positions; under
    mask 0 they count for nothing: the loss and its gradient are those of the by-hand case above."""
    inf = float("inf")
    logp = t([[-1.0, -2.0, -inf], [-0.5, -inf, -inf]]).requires_grad_()
    mask = t([[1, 1, 0], [1, 0, 0]])
    for groups in (1, 2):
        loss = pg_loss(logp, mask, t([2.0, -1.0]), groups=groups)
        want = 5.5 / 3 if groups == 1 else (6.0 / 2 + (-0.5) / 1) / 2
        assert loss.item() == pytest.approx(want, rel=1e-12)
        (grad,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()
