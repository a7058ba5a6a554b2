"""rdpp_cli.objective: the two mistakes a loop makes most are named in one line (the full
log-softmax over the vocabulary for the sampled tokens' log-probs; a decode that returns a list),
and the weights come from rdpp finetune's own reward function (training.finetune.reward_weights on
its NumpyScoring backend), the one scoring path."""

from __future__ import annotations

import pytest
import torch

import rdpp_cli.objective as api
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.train_cider import NumpyScoring
from rdpp_cli.objective import Objective

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]

REFS = {"a": ["A dog runs on the beach.", "A brown dog running."], "b": ["Two cats on a sofa.", "Cats sleeping."]}
WORDS = ["<pad>", "a", "dog", "runs", "on", "the", "beach", "two", "cats", "sofa", "<eos>"]


def _decode(ids: list[int]) -> str:
    return " ".join(WORDS[i] for i in ids if 0 < i < len(WORDS) - 1)


def _samples(B: int = 2, m: int = 3, T: int = 5) -> torch.Tensor:
    return torch.randint(1, len(WORDS), (B, m, T), generator=torch.Generator().manual_seed(0))


def _one_line(call, *words: str) -> str:
    with pytest.raises(RdppError) as e:
        call()
    msg = str(e.value)
    assert all(w in msg for w in words) and "\n" not in msg, msg
    return msg


def test_the_full_log_softmax_is_named():
    obj = Objective.from_references(REFS, reward="dpp", m=3)
    ids = _samples()
    w = obj.weights(["a", "b"], ids, decode=_decode).weights
    logits = torch.randn(2, 3, 5, len(WORDS), requires_grad=True)
    full = logits.log_softmax(-1)
    mask = torch.ones(2, 3, 5)
    for logprobs, m in [(full, mask), (full.view(6, 5, -1), mask.view(6, 5)), (full, None)]:
        _one_line(lambda: obj.loss(w, logprobs, m, lengths=None if m is not None else [5] * 6),
                  "full log-softmax over the vocabulary", "gather(-1, ids")
    token = full.gather(-1, ids[..., None])[..., 0]  # what to pass: the sampled tokens' log-probs
    assert torch.isfinite(obj.loss(w, token, mask)) and torch.isfinite(obj.loss(w, token.view(6, 5), mask.view(6, 5)))


def test_a_decode_returning_a_list_is_named():
    obj = Objective.from_references(REFS, reward="dpp", m=3)
    as_list = lambda ids: [WORDS[i] for i in ids]  # noqa: E731  e.g. convert_ids_to_tokens
    _one_line(lambda: obj.weights(["a", "b"], _samples(), decode=as_list), "decode returned a list",
              "tokenizer.decode(ids, skip_special_tokens=True)")
    _one_line(lambda: obj.weights(["a", "b"], _samples(), decode=lambda ids: len(ids)), "decode returned a int")
    assert obj.weights(["a", "b"], _samples(), decode=_decode).captions[0] == _decode(_samples()[0, 0].tolist())


@pytest.mark.parametrize("reward", ["dpp", "scst", "scst-mean"])
def test_the_weights_are_finetunes_reward_weights(monkeypatch, reward):
    seen = []
    real = api.reward_weights

    def spy(scorer, *args):
        out = real(scorer, *args)
        seen.append((type(scorer), out[0]))
        return out

    monkeypatch.setattr(api, "reward_weights", spy)
    obj = Objective.from_references(REFS, reward=reward, m=3)
    greedy = ["a dog on the beach", "two cats"] if obj.spec.greedy else None
    got = obj.weights(["a", "b"], _samples(), decode=_decode, greedy=greedy)
    assert len(seen) == 1 and issubclass(seen[0][0], NumpyScoring) and torch.equal(seen[0][1], got.weights)
    assert got.scores.shape == (2, 3) and got.scores.dtype == torch.float64 and float(got.scores.max()) > 0
    assert abs(got.logs["sample_cider"] - float(got.scores.mean())) < 1e-12
