"""Two hand-written autograd kernels of Att2in (rdpp_cli/models/att2in.py), and their block sizes.

Each computes exactly what a one-line torch expression computes (the same arithmetic up to float
rounding); it exists only to be faster and to hold less memory than autograd would for that line
(docs/model.md, "Speed", says how; benchmarks/README.md has the measurements).

- :func:`attention_scores` -- ``e[b, j, r] = w · tanh(k[b, r] + q[b, j])`` for keys k (B, R, A),
  queries q (B, n, A) and w (A,): Att2in's hottest spot (B·n·R·A = 25 M tanh per step at COCO
  shapes). ``tanh(u) = 2σ(2u) − 1``, so ``e = 2 (σ(2k + 2q) @ w) − Σw``, and torch's CPU sigmoid is
  cheaper than its tanh (the two differ by ~1e-7). It runs a few images at a time so that the
  (b, n, R, A) block stays in cache (on a GPU all images form one block: a launch per image would
  cost more than the arithmetic), and its backward recomputes the block instead of keeping a 100 MB
  tensor alive for every time step. It takes the keys doubled, ``k2 = 2k`` (the model stores them so).
- :func:`token_logprob` -- ``log_softmax(logits)[i, target[i]]`` for logits (N, K), in float32 (or
  float64) whatever the logits' dtype, without the (N, K) log-softmax: each row's logsumexp is taken
  in float32 a few rows at a time (all rows on a GPU) and the target's logit subtracted; backward
  writes ``g · (onehot − softmax)`` block by block, the subtraction in float32, into a gradient of the
  logits' dtype. Under bf16 autocast it replaces the float32 copy of the logits, the log-softmax, the
  gather and their three backward passes.

Beside them, :func:`f32`: the rule that keeps attention keys and scores, the cell state and the
log-softmax in float32 under bf16/fp16 autocast.

Under ``torch.compile`` (the training fast path, rdpp_cli/training/fast.py) both functions return
the one-line expression instead: the compiler fuses it into its own kernels, which is what these
two do by hand for eager execution.

Tests: tests/test_ops.py checks both against the plain expressions (values, and gradients by
``torch.autograd.gradcheck`` in float64); tests/test_model.py checks the whole model against a
literal step-by-step Att2in; tests/test_cuda.py repeats the checks on a GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

_CHUNK = 1 << 19  # elements of a (b, n, R, A) attention block on a CPU: ~2 MB, stays in cache
_ROWS = 64  # rows of logits per block of token_logprob on a CPU: 64 × 9,488 float32 ≈ 2.4 MB


def f32(x: Tensor) -> Tensor:
    """x in float32 if autocast made it bfloat16/float16; float32 and float64 are kept."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _images_per_block(per_image: int, x: Tensor) -> int:
    """Cache-sized blocks on a CPU; on a GPU one block (a kernel per image would make the launches,
    not the arithmetic, the cost)."""
    if x.device.type != "cpu":
        return x.shape[0]
    return max(1, _CHUNK // per_image)


def _scores(k2: Tensor, q: Tensor, w: Tensor) -> Tensor:
    """``w · tanh(k + q)`` as ``2 (σ(k2 + 2q) @ w) − Σw``, block by block."""
    B, R, A = k2.shape
    n = q.shape[1]
    out = q.new_empty(B, n, R)
    c = _images_per_block(n * R * A, k2)
    q2 = q * 2.0
    buf = k2.new_empty(min(c, B), n, R, A)  # one block, reused: a fresh 2 MB tensor per block costs page faults
    for i in range(0, B, c):
        sig = buf[:min(c, B - i)]
        torch.add(k2[i:i + c].unsqueeze(1), q2[i:i + c].unsqueeze(2), out=sig).sigmoid_()  # (c, n, R, A)
        torch.matmul(sig, w, out=out[i:i + c])
    return out.mul_(2.0).sub_(w.sum())


class AttScores(torch.autograd.Function):
    """:func:`_scores` with its gradient (inputs k2 = 2k (B, R, A), q (B, n, A), w (A,))."""

    @staticmethod
    def forward(ctx, k2: Tensor, q: Tensor, w: Tensor) -> Tensor:
        ctx.save_for_backward(k2, q, w)
        return _scores(k2, q, w)

    @staticmethod
    def backward(ctx, g: Tensor):
        k2, q, w = ctx.saved_tensors
        B, R, A = k2.shape
        n = q.shape[1]
        gk, gq, gw = torch.empty_like(k2), torch.empty_like(q), torch.zeros_like(w)
        w4 = 4.0 * w
        c = _images_per_block(n * R * A, k2)
        q2 = q * 2.0
        bufs = k2.new_empty(2, min(c, B), n, R, A)  # σ and its gradient, reused block after block
        for i in range(0, B, c):
            m = min(c, B - i)
            sig, d = bufs[0, :m], bufs[1, :m]
            torch.add(k2[i:i + c].unsqueeze(1), q2[i:i + c].unsqueeze(2), out=sig).sigmoid_()
            gc = g[i:i + c]
            gw += gc.reshape(1, -1).mm(sig.reshape(-1, A)).view(A)  # Σ g σ (then ×2 − Σg below)
            # d e / d u = w (1 − tanh²u) = 4 w σ (1 − σ)
            torch.mul(gc.unsqueeze(-1), w4, out=d)
            torch.ops.aten.sigmoid_backward.grad_input(d, sig, grad_input=d)
            torch.sum(d, 1, out=gk[i:i + c])  # gradient w.r.t. k2 is half of this: see below
            torch.sum(d, 2, out=gq[i:i + c])
        gw.mul_(2.0).sub_(g.sum())
        return gk.mul_(0.5), gq, gw


def attention_scores(k2: Tensor, q: Tensor, w: Tensor) -> Tensor:
    """Scores (B, n, R) ``w · tanh(k + q)`` for doubled keys k2 = 2k (B, R, A), queries q (B, n, A)
    and w (A,); through :class:`AttScores` when a gradient is needed. Under ``torch.compile`` the
    plain expression, which the compiler fuses into one reduction (and its backward) by itself."""
    if torch.compiler.is_compiling():
        return (torch.tanh(0.5 * k2.unsqueeze(1) + q.unsqueeze(2)) * w).sum(-1)
    if torch.is_grad_enabled() and (q.requires_grad or k2.requires_grad or w.requires_grad):
        return AttScores.apply(k2, q, w)
    return _scores(k2, q, w)


class TokenLogProb(torch.autograd.Function):
    """``log_softmax(logits)[i, target[i]]`` for logits (N, K) and target (N,), in float32 (or
    float64), without materialising the (N, K) log-softmax; see the module docstring."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor) -> Tensor:
        acc = torch.promote_types(logits.dtype, torch.float32)
        N = logits.shape[0]
        rows = _ROWS if logits.device.type == "cpu" else max(N, 1)
        lse = torch.empty(N, dtype=acc, device=logits.device)
        for i in range(0, N, rows):
            torch.logsumexp(logits[i:i + rows].to(acc), -1, out=lse[i:i + rows])
        ctx.save_for_backward(logits, target, lse)
        return logits.gather(1, target.unsqueeze(1)).squeeze(1).to(acc) - lse

    @staticmethod
    def backward(ctx, g: Tensor):
        logits, target, lse = ctx.saved_tensors
        N = logits.shape[0]
        rows = _ROWS if logits.device.type == "cpu" else max(N, 1)
        grad = torch.empty_like(logits)
        for i in range(0, N, rows):
            p = torch.sub(logits[i:i + rows].to(lse.dtype), lse[i:i + rows, None]).exp_()  # softmax (a new tensor)
            p.scatter_add_(1, target[i:i + rows, None], p.new_full((p.shape[0], 1), -1.0))  # − onehot
            grad[i:i + rows] = p.mul_(-g[i:i + rows, None].to(p.dtype))
        return grad, None


def token_logprob(logits: Tensor, target: Tensor) -> Tensor:
    """Log-probability (N,) of each row's target token under ``log_softmax(logits)``. Under
    ``torch.compile`` the plain expression (in float32 or float64), which the compiler fuses."""
    if torch.compiler.is_compiling():
        acc = torch.promote_types(logits.dtype, torch.float32)
        return torch.log_softmax(logits.to(acc), -1).gather(1, target.unsqueeze(1)).squeeze(1)
    return TokenLogProb.apply(logits, target)
