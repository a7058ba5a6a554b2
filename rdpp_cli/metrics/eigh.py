"""Eigen-decomposition of small symmetric matrices by Jacobi rotations: pure tensor arithmetic with
a fixed amount of work, so that it never waits for the device and compiles into a graph.

Why: ``torch.linalg.eigh``, ``eigvalsh`` and ``pinv`` check their solver's status on the host (a
device synchronisation on a GPU every call). The training reward needs the eigenvalues of the M×M
sample kernels (self-CIDEr, logged) and, rarely, a pseudo-inverse (the R-DPP weights' fallback)
every step; M is small (5 by default), so a fixed number of cyclic Jacobi sweeps -- each sweep M-1
rounds of M/2 disjoint rotations (round-robin pairing) -- reaches float64 rounding:
the off-diagonal part shrinks quadratically once it is small, and ``SWEEPS`` is several times what
a 5×5 or 20×20 kernel needs (``tests/test_metrics_cider_torch.py`` checks against LAPACK to 1e-12
relative to the largest eigenvalue).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["eigh", "pinv_hermitian", "SWEEPS"]


def SWEEPS(M: int) -> int:  # noqa: N802 -- a rule, read like a constant
    """Cyclic sweeps for an M×M matrix: 6 up to M = 8, and 2 more per doubling past it (measured:
    5 reach float64 rounding for M ≤ 8, 8 for M = 20)."""
    return 6 + 2 * max(0, math.ceil(math.log2(max(M, 1))) - 3)


def _rounds(M: int) -> list[tuple[list[int], list[int]]]:
    """The round-robin schedule: M-1 (M even) or M (odd) rounds of disjoint pairs (p < q)
    covering every pair once."""
    n = M + M % 2
    players = list(range(n))
    rounds = []
    for _ in range(n - 1):
        pairs = [(players[i], players[n - 1 - i]) for i in range(n // 2)]
        pairs = [(min(a, b), max(a, b)) for a, b in pairs if max(a, b) < M]  # the dummy M sits out
        rounds.append(([a for a, _ in pairs], [b for _, b in pairs]))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _schedule(M: int, dtype: torch.dtype, device) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per round of ``_rounds(M)``: the flat positions (3, P) of a_pp, a_qq, a_pq in an M×M matrix,
    and the patterns (P, M·M) that place each pair's c − 1 (at pp and qq) and s (at pq, −s at qp)."""
    out = []
    for p, q in _rounds(M):
        if not p:
            continue
        p_, q_ = torch.tensor(p), torch.tensor(q)
        at = torch.stack([p_ * M + p_, q_ * M + q_, p_ * M + q_])
        diag = torch.zeros(len(p), M * M, dtype=dtype)
        anti = torch.zeros(len(p), M * M, dtype=dtype)
        rows = torch.arange(len(p))
        diag[rows, at[0]] = 1.0
        diag[rows, at[1]] = 1.0
        anti[rows, at[2]] = 1.0
        anti[rows, q_ * M + p_] = -1.0
        out.append((at.to(device), diag.to(device), anti.to(device)))
    return out


def _rotation(A: Tensor, at: Tensor, diag: Tensor, anti: Tensor, eye: Tensor) -> Tensor:
    """The rotation J (B, M, M) that zeroes a_pq for the round's disjoint pairs (p, q) at once,
    JᵀAJ (Golub & Van Loan, Algorithm 8.4.1: the symmetric Schur decomposition)."""
    B, M, _ = A.shape
    app, aqq, apq = A.reshape(B, M * M)[:, at.reshape(-1)].view(B, 3, -1).unbind(1)
    zero = apq == 0
    theta = (aqq - app) / (2 * torch.where(zero, 1.0, apq))
    t = torch.where(zero, 0.0, torch.where(theta >= 0, 1.0, -1.0) / (theta.abs() + torch.sqrt(1 + theta * theta)))
    c = torch.rsqrt(1 + t * t)
    return eye + ((c - 1) @ diag + (t * c) @ anti).view(B, M, M)


def eigh(A: Tensor, sweeps: int | None = None) -> tuple[Tensor, Tensor]:
    """Eigenvalues (B, M), ascending, and eigenvectors (B, M, M) (columns) of symmetric A (B, M, M),
    as ``torch.linalg.eigh`` (the lower triangle is not trusted: A is symmetrised first).

    One operator to the compiler (``rdpp::jacobi_eigh``): tracing the unrolled rotations costs a
    minute of compile time per call on a 2-core CPU; as an opaque operator a compiled function
    sees one node that never waits for the device (its rotations run as ordinary kernels)."""
    return torch.ops.rdpp.jacobi_eigh(A, SWEEPS(A.shape[-1]) if sweeps is None else sweeps)


@torch.library.custom_op("rdpp::jacobi_eigh", mutates_args=())
def _jacobi_eigh(A: Tensor, sweeps: int) -> tuple[Tensor, Tensor]:
    return _jacobi(A.contiguous(), sweeps)


@_jacobi_eigh.register_fake
def _(A: Tensor, sweeps: int) -> tuple[Tensor, Tensor]:
    return A.new_empty(A.shape[:-1]), A.new_empty(A.shape)


def _jacobi(A: Tensor, sweeps: int) -> tuple[Tensor, Tensor]:
    A = (A + A.transpose(-1, -2)) / 2
    B, M, _ = A.shape
    eye = torch.eye(M, dtype=A.dtype, device=A.device)
    V = eye.expand(B, M, M)
    schedule = _schedule(M, A.dtype, A.device)
    for _ in range(sweeps):
        for at, diag, anti in schedule:
            J = _rotation(A, at, diag, anti, eye)
            A = J.transpose(-1, -2) @ A @ J
            V = V @ J
    lam, order = torch.diagonal(A, dim1=-2, dim2=-1).sort(-1)
    return lam.contiguous(), V.gather(-1, order.unsqueeze(-2).expand_as(V)).contiguous()


def pinv_hermitian(A: Tensor) -> Tensor:
    """The Moore–Penrose pseudo-inverse of symmetric A (B, M, M), as
    ``torch.linalg.pinv(A, hermitian=True)`` (eigenvalues below M·eps of the largest dropped)."""
    lam, V = eigh(A)
    M = A.shape[-1]
    cut = lam.abs().amax(-1, keepdim=True) * M * torch.finfo(A.dtype).eps
    inv = torch.where(lam.abs() > cut, 1 / torch.where(lam == 0, 1.0, lam), 0.0)
    return (V * inv.unsqueeze(-2)) @ V.transpose(-1, -2)
