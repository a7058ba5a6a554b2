"""Rewards for RL fine-tuning: pure, batched tensor functions (no model, no data, no I/O).

Shapes: B images, M sampled captions per image, N = B*M caption rows (image-major: row
``b*M + i`` is sample ``i`` of image ``b``), T tokens.

- :func:`dpp_weights` — the R-DPP weight of each sample (docs/rewards.md#r-dpp, as the authors' code computes it)
- :func:`scst_advantage` — sample reward minus the greedy caption's reward (SCST)
- :func:`mean_baseline_advantage` — reward minus the mean reward of the *other* samples of the image
- :func:`subtract_mean` — weights minus their mean over the M samples (R-DPP ``--baseline mean``)
- :func:`pg_loss` — the policy-gradient loss ``-Σ w·log p`` over the sampled tokens, per token
- :func:`sampled_mask` — the tokens a policy drew: without the EOS forced at the length limit

and the weight functions of ``rdpp finetune --reward`` (its table: ``rdpp_cli.training.reward_table``),
each ``(q, g, K, baseline) -> (weights (B, m), {name: number to log})`` from the sample scores ``q``
(B, m), the greedy captions' scores ``g`` (B,) and the pairwise kernel ``K`` (B, m, m):
:func:`dpp_reward`, :func:`scst_reward`, :func:`mean_baseline_reward`.

See docs/rewards.md for the formulas and the decisions taken where the paper is silent.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["dpp_ensemble", "dpp_weights", "scst_advantage", "mean_baseline_advantage", "subtract_mean", "pg_loss",
           "sampled_mask", "dpp_reward", "scst_reward", "mean_baseline_reward"]


def dpp_ensemble(q: Tensor, S: Tensor) -> Tensor:
    """The DPP L-ensemble ``L = S ⊙ q qᵀ`` (B, M, M) in float64: ``L_ij = q_i q_j S_ij``."""
    q = q.to(torch.float64)
    return S.to(torch.float64) * (q.unsqueeze(-1) * q.unsqueeze(-2))


def _inverse(A: Tensor, sync_free: bool | None = None) -> Tensor:
    """Batched inverse of symmetric (B, M, M) float64 matrices, finite for every matrix.

    ``L + εI`` with ε = 1e-10 is invertible whenever L is positive semi-definite (rank-deficient L
    from identical or zero-quality samples just gives entries of order 1/ε). A matrix that is still
    singular (an eigenvalue of L at exactly −ε: S from CIDEr-D need not be PSD) or whose inverse
    overflows falls back to the Moore–Penrose pseudo-inverse, so the result is always finite.

    ``sync_free`` (None: off a CPU or under ``torch.compile``, where looking at ``bad`` on the
    host would wait for the device or break the graph): the fallback decided without the host --
    every matrix's pseudo-inverse by Jacobi rotations (``metrics.eigh.pinv_hermitian``), chosen per
    matrix by ``torch.where``. The inverses of the matrices that need no fallback are the same bits
    either way.
    """
    inv, info = torch.linalg.inv_ex(A)
    bad = (info != 0) | ~torch.isfinite(inv).all(dim=-1).all(dim=-1)
    if sync_free is None:
        sync_free = A.device.type != "cpu" or torch.compiler.is_compiling()
    if sync_free:
        from rdpp_cli.metrics.eigh import pinv_hermitian

        return torch.where(bad.view(-1, 1, 1), pinv_hermitian(A), inv)
    if bool(bad.any()):
        inv = inv.clone()
        inv[bad] = torch.linalg.pinv(A[bad], hermitian=True)
    return inv


def dpp_weights(q: Tensor, S: Tensor, eps: float = 1e-10, cut: bool = True, sync_free: bool | None = None) -> Tensor:
    """R-DPP weights (B, M) of M sampled captions per image.

    ``q`` (B, M): quality of each sample (CIDEr-D against the image's references).
    ``S`` (B, M, M): similarity among the samples (pairwise CIDEr-D, symmetric, S_ii ≈ 10).

    ``L = S ⊙ q qᵀ``; ``Linv = (L + εI)⁻¹``; ``w_i = (1/M) Σ_j sign(Linv_ij) · L_ij``.

    ``Linv_ij = ∂ log det L / ∂ L_ij`` says whether raising the pair term ``L_ij`` would raise the
    determinant; the weight keeps only its sign (the "cut"). With ``cut=False`` the sum is
    ``(1/M) Σ_j Linv_ij L_ij = (1/M) (Linv L)_ii = (1/M)(1 − ε Linv_ii)``, which is 1/M for every
    sample of a well-conditioned L: the gradient then carries no information about quality or
    similarity. The M×M algebra runs in float64 (ε = 1e-10 is below float32's resolution next to
    entries of order 10–100). Returned in ``q``'s floating dtype (float32 for integer input).

    Degenerate sets stay finite: a zero-quality or empty sample has a zero row in L and gets weight
    0 without touching the others' weights; M identical samples give ``q²S(2 − M)/M`` each.
    ``sync_free``: never wait for the device (``_inverse``; by default off a CPU and under
    ``torch.compile``: the training fast path).
    """
    if q.dim() != 2 or S.dim() != 3 or S.shape != (*q.shape, q.shape[-1]):
        raise ValueError(f"dpp_weights: q must be (B, M) and S (B, M, M); got {tuple(q.shape)} and {tuple(S.shape)}")
    M = q.shape[-1]
    L = dpp_ensemble(q, S)
    eye = torch.eye(M, dtype=torch.float64, device=L.device)
    Linv = _inverse(L + eps * eye, sync_free)
    factor = torch.sign(Linv) if cut else Linv
    w = (factor * L).sum(dim=-1) / M
    return w.to(q.dtype if q.is_floating_point() else torch.float32)


def scst_advantage(sample_scores: Tensor, greedy_scores: Tensor) -> Tensor:
    """SCST (Rennie et al. 2017): each sample's reward minus its image's greedy-caption reward.

    ``sample_scores`` (B, M), ``greedy_scores`` (B,) → (B, M).
    """
    if sample_scores.dim() != 2 or greedy_scores.shape != sample_scores.shape[:1]:
        raise ValueError(f"scst_advantage: expected (B, M) and (B,); got {tuple(sample_scores.shape)} "
                         f"and {tuple(greedy_scores.shape)}")
    return sample_scores - greedy_scores.unsqueeze(-1)


def mean_baseline_advantage(scores: Tensor) -> Tensor:
    """Reward minus the mean reward of the image's *other* M−1 samples (leave-one-out), (B, M).

    The leave-one-out baseline does not depend on the sample it is subtracted from, so the
    gradient stays unbiased (Kool et al. 2019; Luo 2020, "a better variant of SCST"). It equals
    ``M/(M−1) · (r_i − mean_j r_j)``. Needs M ≥ 2.
    """
    if scores.dim() != 2:
        raise ValueError(f"mean_baseline_advantage: expected (B, M); got {tuple(scores.shape)}")
    M = scores.shape[-1]
    if M < 2:
        raise ValueError("mean_baseline_advantage needs at least 2 samples per image")
    others = (scores.sum(dim=-1, keepdim=True) - scores) / (M - 1)
    return scores - others


def subtract_mean(weights: Tensor) -> Tensor:
    """``w_i − mean_j w_j`` over the M samples of each image, (B, M) (R-DPP ``--baseline mean``)."""
    return weights - weights.mean(dim=-1, keepdim=True)


def pg_loss(token_logp: Tensor, mask: Tensor, weights: Tensor, groups: int = 1,
            tokens: Tensor | None = None) -> Tensor:
    """Policy-gradient loss ``-Σ w_n · log p(c_n,t)`` over the sampled tokens, per token.

    ``token_logp`` (N, T): log-probability of each sampled token (EOS included once);
    ``mask`` (N, T): 1 where a token (or the EOS) was sampled (a log-prob under a 0 is ignored, -inf
    included); ``weights`` (N,): the reward,
    advantage or R-DPP weight of each caption (no gradient flows into it).

    ``groups=1``: one sum over all tokens divided by their number (self-critical.pytorch's SCST).
    ``groups=M``: rows are image-major (``b*M + i``); the sum is divided per sample slot ``i`` by
    that slot's token count and the M slot losses are averaged — what the published R-DPP code does.
    ``tokens``: the token count(s) to divide by instead of ``mask``'s (a scalar for ``groups=1``,
    ``(groups,)`` otherwise), e.g. the whole step's counts shared out over DDP processes.
    """
    if token_logp.shape != mask.shape or weights.shape != token_logp.shape[:1]:
        raise ValueError(f"pg_loss: expected token_logp/mask (N, T) and weights (N,); got "
                         f"{tuple(token_logp.shape)}, {tuple(mask.shape)}, {tuple(weights.shape)}")
    # a padding position's log-prob is never counted, whatever it holds: filtered sampling's scores
    # give -inf there, and -inf * 0 would be NaN
    token_logp = token_logp.masked_fill(mask == 0, 0.0)
    mask = mask.to(token_logp.dtype)
    terms = -(weights.detach().to(token_logp.dtype).unsqueeze(-1) * token_logp * mask)
    if groups == 1:
        count = mask.sum() if tokens is None else tokens.to(mask.dtype)
        return terms.sum() / count.clamp_min(1.0)
    N, T = terms.shape
    if N % groups:
        raise ValueError(f"pg_loss: {N} rows do not split into groups of {groups}")
    per_slot = terms.view(N // groups, groups, T).sum(dim=(0, 2))
    count = mask.view(N // groups, groups, T).sum(dim=(0, 2)) if tokens is None else tokens.to(mask.dtype)
    return (per_slot / count.clamp_min(1.0)).mean()


def sampled_mask(mask: Tensor, lengths: Tensor, max_len: int) -> Tensor:
    """The tokens the policy drew: ``mask`` (N, T+1) (every word and the EOS) without the EOS that
    decoding forces after a caption of ``max_len`` words.

    That EOS was never sampled, so it carries no policy gradient; the published R-DPP code and
    self-critical.pytorch agree (their mask covers the ``seq_length`` sampled positions, up to and
    including the first EOS, and a caption that fills them has no EOS position). ``lengths`` (N,):
    the words of each caption. Position ``max_len`` exists only when ``T == max_len``.
    """
    if mask.dim() != 2 or lengths.shape != mask.shape[:1]:
        raise ValueError(f"sampled_mask: expected mask (N, T+1) and lengths (N,); got {tuple(mask.shape)} "
                         f"and {tuple(lengths.shape)}")
    if mask.shape[1] <= max_len:
        return mask
    forced = (lengths.to(mask.device) >= max_len).to(mask.dtype)
    out = mask.clone()
    out[:, max_len] = out[:, max_len] * (1 - forced)
    return out


def dpp_reward(q: Tensor, g: Tensor | None, K: Tensor | None, baseline: str = "none"
               ) -> tuple[Tensor, dict[str, Tensor]]:
    """``--reward dpp``: the R-DPP weights of the samples (``baseline`` "mean": minus their mean);
    logs the mean weight before the baseline as "reward"."""
    w = dpp_weights(q, K)
    return (subtract_mean(w) if baseline == "mean" else w), {"reward": w.mean()}


def scst_reward(q: Tensor, g: Tensor | None, K: Tensor | None, baseline: str = "none"
                ) -> tuple[Tensor, dict[str, Tensor]]:
    """``--reward scst`` (and xe-cider's SCST term): each sample's score minus its greedy caption's."""
    return scst_advantage(q, g), {"reward": q.mean(), "greedy_cider": g.mean()}


def mean_baseline_reward(q: Tensor, g: Tensor | None, K: Tensor | None, baseline: str = "none"
                         ) -> tuple[Tensor, dict[str, Tensor]]:
    """``--reward scst-mean``: each sample's score minus the mean of its image's other samples."""
    return mean_baseline_advantage(q), {"reward": q.mean()}
