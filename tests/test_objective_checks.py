"""rdpp_cli.objective's argument checks (docs/api.md): each wrong argument is one RdppError line, or,
where the input has one meaning, the right numbers: shapes that only look right, -inf log-probs
under the mask, vocabularies that make the references UNK, limits that are no limits, letters
outside ASCII, ids as 0-d tensors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from rdpp_cli.errors import RdppError
from rdpp_cli.objective import Objective, tokenize

pytestmark = pytest.mark.unit

REFS = {1: ["a man riding a horse", "a man on a horse", "a person rides a horse"],
        2: ["a cat on a table", "a cat sitting on a table", "the cat is on the table"]}
CAPS = [["a man on a horse", "a cat"], ["a cat on a table", "a horse"]]  # B = 2 images, m = 2


def _raises(call, words: str) -> str:
    with pytest.raises(RdppError) as e:
        call()
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
    return str(e.value)


def _per_token(B: int = 2, m: int = 2, T: int = 4):
    """Per-token log-probs (B, m, T) with a graph, and their mask (the first k tokens of caption k+1)."""
    logp = -torch.arange(1.0, 1.0 + B * m * T, dtype=torch.float64).view(B, m, T).div(10).requires_grad_()
    mask = (torch.arange(T).view(1, T) <= torch.arange(B * m).remainder(T).view(-1, 1)).view(B, m, T).double()
    return logp, mask


@pytest.mark.parametrize("reward", ["dpp", "scst-mean"])
def test_logprobs_m_by_b_for_b_by_m_is_refused(reward):
    """(m, B, T) has as many numbers as (B, m, T); read as such it weights the wrong captions."""
    obj = Objective.from_references(REFS, reward=reward, m=3)
    w = obj.weights([1, 2], [CAPS[0] + ["a horse"], CAPS[1] + ["a man"]]).weights  # (2, 3)
    logp, mask = _per_token(2, 3)
    assert obj.loss(w, logp, mask).isfinite()
    _raises(lambda: obj.loss(w, logp.transpose(0, 1), mask.transpose(0, 1)), "expected (B, m, T) = (2, 3, T)")
    _raises(lambda: obj.loss(w, logp.reshape(3, 8), mask.reshape(3, 8)), "(B*m, T) = (6, T)")
    _raises(lambda: obj.loss(w, logp.sum(-1).T, lengths=[1] * 6), "expected one sum per caption, (2, 3) or (6,)")


def test_minus_inf_under_the_mask_counts_for_nothing():
    obj = Objective.from_references(REFS, reward="dpp", m=2)
    w = obj.weights([1, 2], CAPS).weights
    logp, mask = _per_token()
    want = obj.loss(w, logp, mask)
    padded = torch.where(mask > 0, logp, torch.tensor(float("-inf"), dtype=logp.dtype))
    got = obj.loss(w, padded, mask)
    assert torch.isfinite(got) and got.item() == pytest.approx(want.item(), rel=1e-15)
    (grad,) = torch.autograd.grad(got, logp)
    assert torch.isfinite(grad).all() and (grad[mask == 0] == 0).all()


def test_a_vocabulary_that_makes_the_references_unk():
    _raises(lambda: Objective.from_references(REFS, words=["zebra", "giraffe"]), "every word of the references is UNK")
    _raises(lambda: Objective.from_references(REFS, word_count_threshold=100), "under word_count_threshold=100")
    with pytest.warns(UserWarning, match=r"28\.1% of the reference words are UNK under word_count_threshold=2"):
        Objective.from_references(REFS, word_count_threshold=2)  # 9 of 32 words seen twice or less: man, the (2), riding, person, rides, sitting, is
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Objective.from_references(REFS)  # every word known: no warning


@pytest.mark.parametrize("limit", [0, -1, 2.5, True])
def test_a_length_limit_is_one_word_or_more(limit):
    for name in ("max_len", "ref_len"):
        _raises(lambda: Objective.from_references(REFS, **{name: limit}), f"{name}={limit!r} is not a length limit")


def test_baseline_mean_belongs_to_dpp_only():
    for reward in ("scst", "scst-mean"):
        _raises(lambda: Objective.from_references(REFS, reward=reward, m=2, baseline="mean"),
                "baseline='mean' applies to reward dpp only")
    assert Objective.from_references(REFS, reward="dpp", m=2, baseline="mean").baseline == "mean"


def test_lengths_are_one_token_or_more_and_one_per_caption():
    obj = Objective.from_references(REFS, reward="scst-mean", m=2)
    w = obj.weights([1, 2], CAPS).weights
    sums = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    assert obj.loss(w, sums, lengths=[1, 2, 3, 4]).isfinite()
    _raises(lambda: obj.loss(w, sums, lengths=[1, 0, 3, 4]), "lengths holds 0")
    _raises(lambda: obj.loss(w, sums, lengths=[1, -2, 3, 4]), "lengths holds -2")
    _raises(lambda: obj.loss(w, sums, lengths=[1, 2, 3]), "lengths holds 3 counts for 4 captions")


def test_loss_arguments_of_the_wrong_kind():
    obj = Objective.from_references(REFS, reward="dpp", m=2)
    out = obj.weights([1, 2], CAPS)
    logp, mask = _per_token()
    _raises(lambda: obj.loss(out, logp, mask), "got a Weights object (Objective.loss); pass its .weights")
    _raises(lambda: obj.loss(out.weights, logp.detach().numpy(), mask), "logprobs is a ndarray, not a torch tensor")
    _raises(lambda: obj.loss(out.weights.numpy(), logp, mask), "weights is a ndarray, not a torch tensor")
    # a numpy mask holds no graph: it is taken as it is
    assert obj.loss(out.weights, logp, mask.numpy()).item() == obj.loss(out.weights, logp, mask).item()


def test_ids_as_0d_tensors_are_the_ids():
    """Iterating over a tensor row gives 0-d tensors: a list of them is one caption's ids."""
    obj = Objective.from_references(REFS, reward="dpp", m=2)
    words = ["a", "man", "on", "horse", "cat", "table"]
    ids = [[[0, 1, 2, 0, 3], [0, 4]], [[0, 4, 2, 0, 5], [0, 3]]]
    decode = lambda row: " ".join(words[i] for i in row)  # noqa: E731
    as_ints = obj.weights([1, 2], ids, decode=decode)
    as_0d = obj.weights([1, 2], [[list(torch.tensor(c)) for c in caps] for caps in ids], decode=decode)
    assert as_0d.captions == as_ints.captions == ["a man on a horse", "a cat", "a cat on a table", "a horse"]
    assert torch.equal(as_0d.weights, as_ints.weights)


def test_letters_outside_ascii_are_letters():
    assert tokenize("Ein Mädchen spielt.") == ["ein", "mädchen", "spielt"]
    assert tokenize("Ma\u0308dchen") == ["mädchen"]  # decomposed: normalised, the mark kept with its letter
    assert tokenize("नमस्ते दुनिया") == ["नमस्ते", "दुनिया"]
    obj = Objective.from_references({1: ["Ein Mädchen spielt", "ein Mädchen rennt"], 2: ["ein Hund"]}, m=2)
    assert "mädchen" in obj.words and "m" not in obj.words
    w = obj.weights([1, 2], [["ein Mädchen", "ein Hund"], ["ein Hund", "Mädchen"]])
    assert w.scores[0, 0] > w.scores[0, 1] and w.scores[1, 0] > w.scores[1, 1]


def test_a_script_without_ascii_letters():
    """Chinese segmented into words (as caption sets ship it) is scored on those words."""
    obj = Objective.from_references({1: ["一只 狗 在 草地 上 跑", "一只 狗 在 跑"], 2: ["一只 猫 在 桌子 上"]}, m=2)
    assert {"狗", "猫", "草地"} <= set(obj.words)
    w = obj.weights([1, 2], [["一只 狗 在 跑", "一只 猫"], ["一只 猫 在 桌子 上", "狗"]])
    assert w.scores[0, 0] > w.scores[0, 1] and w.scores[1, 0] > w.scores[1, 1]
