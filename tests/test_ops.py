"""rdpp_cli.models.ops: the two hand-written kernels compute what their one-line expressions compute,
values and gradients (gradcheck in float64), in one block and split over several."""

from __future__ import annotations

import pytest
import torch

from rdpp_cli.models import ops
from rdpp_cli.models.ops import AttScores, TokenLogProb, attention_scores, f32, token_logprob

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def plain_scores(k, q, w):
    """The formula: e[b, j, r] = w · tanh(k[b, r] + q[b, j])."""
    return torch.tanh(k.unsqueeze(1) + q.unsqueeze(2)) @ w


def _inputs(B=5, R=4, n=3, A=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, R, A, generator=g, dtype=torch.float64)
    q = torch.randn(B, n, A, generator=g, dtype=torch.float64)
    w = torch.randn(A, generator=g, dtype=torch.float64)
    return k, q, w


@pytest.mark.parametrize("images_per_block", [1, 2, 5])
def test_attention_scores_and_their_gradients_equal_the_formula(monkeypatch, images_per_block):
    k, q, w = _inputs()
    n, R, A = q.shape[1], k.shape[1], k.shape[2]
    monkeypatch.setattr(ops, "_CHUNK", images_per_block * n * R * A)  # 5 images: blocks of 1, 2 (+ 1) or all 5
    want = plain_scores(k, q, w)
    with torch.no_grad():
        assert torch.allclose(attention_scores(2 * k, q, w), want, atol=1e-12, rtol=0)  # keys passed doubled
    leaves = [t.clone().requires_grad_() for t in (k, q, w)]
    got = attention_scores(2 * leaves[0], leaves[1], leaves[2])
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    g = torch.randn(got.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mine = torch.autograd.grad(got, leaves, g)
    plain = [t.clone().requires_grad_() for t in (k, q, w)]
    ref = torch.autograd.grad(plain_scores(*plain), plain, g)
    for a, b, name in zip(mine, ref, "kqw"):
        assert torch.allclose(a, b, atol=1e-12, rtol=0), name


def test_attention_scores_pass_gradcheck():
    k2 = torch.randn(2, 4, 3, dtype=torch.double, requires_grad=True)
    q = torch.randn(2, 3, 3, dtype=torch.double, requires_grad=True)
    w = torch.randn(3, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(AttScores.apply, (k2, q, w))


def test_the_fused_token_log_prob_equals_log_softmax_and_keeps_small_gradients_exact():
    """The target tokens' log-probs without the full log-softmax. In float64 it is log_softmax +
    gather, values and gradients (gradcheck); from bf16 logits of a peaked distribution (p ≈ 0.999)
    the target's gradient g·(1 − p) is taken in float32 before rounding: a bf16 subtraction 1 − p
    would be off by up to 40 %."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70, 33, generator=g, dtype=torch.float64, requires_grad=True)  # 2 blocks of 64 rows
    t = torch.randint(0, 33, (70,), generator=g)
    want = torch.log_softmax(x, -1).gather(1, t[:, None]).squeeze(1)
    assert torch.allclose(token_logprob(x, t), want, atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(lambda z: TokenLogProb.apply(z, t), (x,))

    peaked = torch.randn(70, 33, generator=g)
    peaked[torch.arange(70), t] = 9.0  # the target's probability ≈ 0.998
    xb = peaked.bfloat16().requires_grad_()
    got = token_logprob(xb, t)
    assert got.dtype == torch.float32
    got.sum().backward()
    x64 = xb.detach().double().requires_grad_()
    torch.log_softmax(x64, -1).gather(1, t[:, None]).sum().backward()
    tg, tw = xb.grad.double()[torch.arange(70), t], x64.grad[torch.arange(70), t]  # g · (1 − p_t), small
    assert ((tg - tw).abs() / tw.abs()).max() < 1e-2  # bf16 rounding of the result only
    assert torch.allclose(xb.grad.double(), x64.grad, atol=1e-4, rtol=1e-2)


def test_f32_lifts_only_the_low_precisions():
    x = torch.tensor([1.0, 2.5])
    assert f32(x.bfloat16()).dtype == torch.float32 and f32(x.half()).dtype == torch.float32
    assert f32(x.double()).dtype == torch.float64 and f32(x) is x
    assert f32(x.bfloat16()).tolist() == [1.0, 2.5]
