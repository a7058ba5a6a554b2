"""docs/api.md's account of the R-DPP weights, on real captions and rdpp's training CIDEr-D: the bound
|w_i| <= (q_i/m) sum_j q_j S_ij, zero for a sample sharing nothing with the references, m identical
samples at q^2 S (2 - m)/m (0 for a pair, negative from three), S_ii = 10 for a caption of four
tokens, and a repeated caption pushed below the distinct ones of its set (the documented numbers)."""

from __future__ import annotations

import pytest
import torch

from rdpp_cli.metrics.train_cider import NumpyScoring
from rdpp_cli.objective import Objective

pytestmark = pytest.mark.unit

REFS = {"r": ["A red circle.", "A circle that is red.", "One red circle.", "a red round shape on a table"],
        "b": ["A blue square.", "A square that is blue.", "One blue square."], "g": ["A green triangle.", "a triangle"],
        "d": ["A dog on a beach.", "a dog runs"]}


def _weights(captions: list[str]):
    obj = Objective.from_references(REFS, reward="dpp", m=len(captions))
    w = obj.weights(["r"], captions)
    S = NumpyScoring(obj.cider).pairwise(torch.from_numpy(obj.encode(captions))[None])[0]
    return w.weights[0].double(), w.scores[0], S


def test_the_documented_range_of_the_weights():
    distinct = ["a red circle", "a circle that is red", "one red circle", "a red round shape on a table"]
    for captions in (distinct + ["a blue square"], distinct + ["a red circle"]):
        w, q, S = _weights(captions)
        bound = q * (S * q[None, :]).sum(1) / len(q)
        assert (w.abs() <= bound + 1e-9).all() and (w > 1.0).any()
    assert (w < -1.0).any()  # with a repeated caption: negative weights
    w, q, _ = _weights(["a red circle", "a dog runs", "red circle"])
    assert q[1] == 0 and w[1] == 0 and w[0] != 0  # nothing shared with the references: weight 0


@pytest.mark.parametrize("m", [2, 3, 4])
def test_identical_samples(m):
    w, q, S = _weights(["a red circle"] * m)
    assert abs(float(S[0, 0]) - 10.0) < 1e-9  # three words and the end token: all four n-gram orders
    want = float(q[0]) ** 2 * 10.0 * (2 - m) / m
    assert torch.allclose(w, torch.full_like(w, want), atol=1e-6, rtol=1e-6)
    assert (want == 0) == (m == 2)


def test_a_repeated_caption_is_pushed_down():
    w, _, _ = _weights(["a red circle", "a circle that is red", "one red circle", "a red round shape on a table",
                        "a red circle"])
    assert [round(float(x), 1) for x in w] == [-32.5, 4.7, -8.5, 13.1, -32.5]  # docs/api.md quotes these
