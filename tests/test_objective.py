"""rdpp_cli.objective (docs/api.md): the objective of `rdpp finetune` for captions of any model.

The oracle is ``RewardStep`` (training/finetune.py) on a data artifact made by the real ``prepro
coco`` from text references (mixed case, punctuation, references longer than the length limit, words
seen once mapped to UNK): its sampled captions, fed to the API as the model's ids plus a decode
function, as strings, and as per-caption log-prob sums, give RewardStep's weights and loss to 1e-6.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.train_cider import TrainCider
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.objective import REWARD_NAMES, Objective, tokenize
from rdpp_cli.training.finetune import RewardStep

from helpers import prepro_captions

pytestmark = pytest.mark.usefixtures("one_thread")
MAX_LEN = 6

CAPTIONS = {  # as people write them; several are longer than MAX_LEN (clipped in captions.h5, not in the df)
    1: ["A man riding a horse on a beach.", "a man on a horse", "A person rides a horse!",
        "Man riding a horse on the sand, near the ocean.", "a horse and its rider"],
    2: ["A cat on a table.", "a cat sitting on a wooden table", "The cat's on the table",
        "A small cat lies on a kitchen table in the sun.", "cat on a table"],
    3: ["Two dogs playing in the grass.", "dogs play on a lawn", "a dog and another dog in a field",
        "Two brown dogs running on green grass near a fence", "dogs in the grass"],
    4: ["A plate of food on a table.", "food on a plate", "a plate with rice and meat",
        "A dinner plate of food sits on the wooden table.", "a meal on a plate"],
    5: ["A man on a horse near a fence.", "a rider on a brown horse", "a horse in a field", "a man rides his horse",
        "horse and man"],
}
TRAIN = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> DataArtifact:
    """The real `prepro coco` on the text references (its own tokenization), max length 6."""
    return prepro_captions(tmp_path_factory.mktemp("objective"), CAPTIONS,
                           {i: "train" if i in TRAIN else "val" for i in CAPTIONS}, tokens=False,
                           max_length=MAX_LEN, batch_size=4)


def objective(reward: str, m: int, baseline: str = "none") -> Objective:
    return Objective.from_references({i: CAPTIONS[i] for i in TRAIN}, reward=reward, m=m, baseline=baseline,
                                     max_len=MAX_LEN, ref_len=MAX_LEN, word_count_threshold=1)


def _drawn(data: DataArtifact, reward: str, m: int, baseline: str = "none"):
    """RewardStep's step on one batch of the 4 training images: its captions, weights, loss."""
    torch.manual_seed(0)
    model = Att2in(Att2inConfig(vocab_size=data.vocab_size, input_encoding_size=16, rnn_size=16, att_hid_size=16,
                                att_feat_size=8, drop_prob_lm=0.3, seq_length=MAX_LEN)).train()
    batch = next(iter(CaptionBatches(data, "train", batch_size=4, seq_per_img=1, seed=0).epoch(0))).to("cpu")
    step = RewardStep(data=data, cider=TrainCider.for_data(data), reward=reward, m=m, baseline=baseline,
                      max_len=MAX_LEN)
    d = step.draw(model, batch)
    w, logs = step.weights(d.samples.numpy(), d.greedy, data.references_ids(batch.index))
    loss, _ = step.loss(model, batch, d, w)
    token_logp, mask = step.policy_logprobs(model, batch, d)
    return batch, d, w, logs, loss, token_logp, mask


@pytest.mark.unit
def test_the_vocabulary_is_the_one_prepro_builds(data):
    assert {"dpp", "scst", "scst-mean"} <= set(REWARD_NAMES) and "xe-cider" not in REWARD_NAMES  # no XE term
    obj = objective("dpp", 4)
    assert obj.words == data.words and "UNK" in obj.words
    assert tokenize("The cat's on the table.") == ["the", "cat", "s", "on", "the", "table"]
    # references clipped to the label width, as captions.h5 holds them
    ids = data.split_indices("train")
    for i, refs in zip(ids, data.references_ids(ids)):
        mine = obj.references[int(data.image_ids[i])]
        assert np.array_equal(mine[:, :MAX_LEN], refs) and mine.shape[1] <= MAX_LEN


@pytest.mark.unit
@pytest.mark.parametrize("reward,m,baseline", [("dpp", 4, "none"), ("dpp", 3, "mean"), ("scst", 3, "none"),
                                                ("scst-mean", 4, "none")])
def test_weights_and_loss_equal_rdpp_finetune(data, reward, m, baseline):
    batch, d, w, logs, loss, token_logp, mask = _drawn(data, reward, m, baseline)
    obj = objective(reward, m, baseline)
    image_ids = data.image_ids[batch.index].tolist()
    assert (d.lengths == MAX_LEN).any() and (d.lengths < MAX_LEN).any()  # cut captions and ones that ended
    assert (d.samples == data.words.index("UNK") + 1).any() or reward != "dpp"  # UNK in the samples
    # 1. the model's token ids (B, m, T) and its decode function
    out = obj.step(image_ids, d.samples, token_logp, mask, decode=data.decode, greedy=d.greedy)
    assert torch.allclose(out.weights, w, atol=1e-6, rtol=0) and w.abs().max() > 0.05
    assert abs(out.loss.item() - loss.item()) < 1e-6 and out.loss.requires_grad
    assert out.logs.keys() == logs.keys() and all(abs(out.logs[k] - logs[k]) < 1e-9 for k in logs)
    # 2. the same captions as text (nested per image), and the log-probs as per-caption sums
    texts = [[data.decode(c) for c in caps] for caps in d.samples]
    greedy = None if d.greedy is None else [data.decode(g) for g in d.greedy]
    sums, lengths = (token_logp * mask).sum(1), mask.sum(1)
    out2 = obj.step(image_ids, texts, sums.view(len(image_ids), m), lengths=lengths, greedy=greedy)
    assert torch.equal(out2.weights, out.weights)
    assert abs(out2.loss.item() - loss.item()) < 1e-6
    # the gradient flows into the log-probs: d loss / d sum_n = -w_n / (tokens of n's group)
    grad = torch.autograd.grad(out2.loss, sums)[0]
    assert torch.allclose(grad.view(-1, m)[0], _expected_grad(obj, out.weights, lengths, m)[0], atol=1e-7)


def _expected_grad(obj: Objective, w: torch.Tensor, lengths: torch.Tensor, m: int) -> torch.Tensor:
    n = lengths.view(-1, m)
    if obj.spec.per_slot:  # R-DPP: per slot i, divided by slot i's tokens, the m slots averaged
        return -w / (n.sum(0) * m)
    return -w / n.sum()


@pytest.mark.unit
def test_cider_is_computed_on_words_whatever_the_tokenizer(data):
    """A byte-pair model's pieces are detokenized by its decode and scored as the words they spell."""
    obj = objective("dpp", 2)
    words = [["a", "man", "riding", "a", "horse"], ["a", "hors", "e", "on", "the", "beach"],
             ["the", "cat", "on", "a", "table"], ["two", "dogs", "xylophone"]]
    pieces = sorted({"Ġ" + w for caption in words for w in caption} | {"e", "<pad>", "<eos>"})
    pid = {p: i for i, p in enumerate(pieces)}
    bpe = [[pid["Ġ" + w] if k == 0 or w != "e" else pid["e"] for k, w in enumerate(c)] + [pid["<eos>"]]
           for c in words]
    T = max(map(len, bpe))
    ids = torch.tensor([c + [pid["<pad>"]] * (T - len(c)) for c in bpe])

    def decode(row: list[int]) -> str:  # like tokenizer.decode(..., skip_special_tokens=True)
        text = "".join(pieces[i] for i in row if not pieces[i].startswith("<"))
        return text.replace("Ġ", " ").strip().capitalize() + "."

    via_bpe = obj.weights([1, 3], ids.view(2, 2, T), decode=decode)
    assert via_bpe.captions[1] == "A horse on the beach."
    plain = obj.weights([1, 3], [["a man riding a horse", "a horse on the beach"],
                                 ["the cat on a table", "two dogs UNK"]])
    assert torch.equal(via_bpe.scores, plain.scores) and torch.equal(via_bpe.weights, plain.weights)
    assert plain.scores[0].min() > 0.5 and float(plain.scores[1, 0]) < float(plain.scores[0, 0])


@pytest.mark.unit
def test_bad_input_is_one_line(data):
    obj = objective("scst", 2)
    cases = [
        (lambda: obj.weights([1, 99], [["a"] * 2] * 2, greedy=["a", "a"]), "image id 99 has no references"),
        (lambda: obj.weights([1], ["a", "b", "c"], greedy=["a"]), "got 3 captions, expected 2"),
        (lambda: obj.weights([1], torch.ones(1, 2, 3, dtype=torch.long), greedy=["a"]), "no decode function"),
        (lambda: obj.weights([1], ["a", "b"]), "pass greedy="),
        (lambda: obj.loss(torch.ones(1, 2), torch.zeros(2, requires_grad=True)), "need lengths="),
        (lambda: obj.loss(torch.ones(1, 2), torch.zeros(3, 5), torch.ones(3, 5)), "expected (B, m, T) = (1, 2, T)"),
        (lambda: objective("xe-cider", 2), "xe-cider needs the model's XE loss"),
        (lambda: objective("dpp", 1), "use m=2 or more"),
        (lambda: Objective.from_references({1: "a dog"}), "not a list of caption strings"),
        (lambda: Objective.from_references({1: ["a dog", "..."]}), "reference without a word"),
        (lambda: Objective.from_references({1: ["a dog"], 2: []}), "image 2 has no references"),
    ]
    for call, words in cases:
        with pytest.raises(RdppError) as e:
            call()
        assert words in str(e.value) and "\n" not in str(e.value)
    # the accepted forms of two captions of one image give the same numbers
    forms = [["a man on a horse", "a cat"], [["a man on a horse", "a cat"]], ("a man on a horse", "a cat"),
             np.array([["a man on a horse", "a cat"]]), np.array([["a man on a horse", "a cat"]], dtype=object)]
    got = [obj.weights([1], f, greedy=["a horse"]) for f in forms]
    assert all(torch.equal(g.weights, got[0].weights) for g in got) and got[0].scores[0, 0] > got[0].scores[0, 1]


@pytest.mark.integration
def test_without_torch_the_import_says_what_to_install(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoTorch())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", "import rdpp_cli.objective"], capture_output=True, text=True, env=env)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == ("ImportError: rdpp_cli.objective needs torch (the trainer extra); "
                                                 "install it with pip install 'rdpp[train]'")
