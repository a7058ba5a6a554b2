"""The RL objective is the published one (docs/rewards.md): the end token in the training CIDEr-D and its
document frequencies, the published kernel direction, on-policy samples, no loss on a forced EOS,
outdated data refused, and the paper preset.

The reference here is an independent plain-Python rendering of what the published R-DPP code and
self-critical.pytorch compute: captions turned into strings with ``array_to_str`` (ids up to and
including the first 0, the EOS), pyciderevalcap's CIDEr-D with document frequencies counted as
``prepro_ngrams.py`` counts them (``tokens + ['<eos>']``, UNK-mapped, not clipped, once per
image), ``get_similarity_matrix`` (reference caption i, hypothesis caption j for j >= i, mirrored)
and ``quality_diversity_reward(..., is_cut=True)``.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches
from rdpp_cli.metrics.cider import DocFreq
from rdpp_cli.metrics.train_cider import TrainCider, with_eos
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.training.finetune import RewardStep, finetune
from rdpp_cli.training.validation import greedy_cider
from rdpp_cli.models.registry import model_spec
from rdpp_cli.training.rewards import dpp_weights, sampled_mask
from rdpp_cli.training.xe import train_xe

from helpers import att2in_for, prepro_captions, write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")
MAX_LEN = 6

CAPTIONS = {  # Karpathy tokens; several are longer than MAX_LEN (clipped in captions.h5, not in the df)
    1: ["a man riding a horse on a beach", "a man on a horse", "a person rides a horse",
        "man riding a horse on the sand near the ocean", "a horse and its rider"],
    2: ["a cat on a table", "a cat sitting on a wooden table", "the cat is on the table",
        "a small cat lies on a kitchen table in the sun", "cat on a table"],
    3: ["two dogs playing in the grass", "dogs play on a lawn", "a dog and another dog in a field",
        "two brown dogs running on green grass near a fence", "dogs in the grass"],
    4: ["a plate of food on a table", "food on a plate", "a plate with rice and meat",
        "a dinner plate of food sits on the wooden table", "a meal on a plate"],
    5: ["a man on a horse near a fence", "a rider on a brown horse", "a horse in a field",
        "a man rides his horse", "horse and man"],
    6: ["a cat on the grass", "a cat in a field", "the cat sits on grass", "a cat outside", "cat in grass"],
}
SPLITS = {1: "train", 2: "train", 3: "train", 4: "train", 5: "val", 6: "test"}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> DataArtifact:
    """A data artifact made by the real `prepro coco` (imported features, max length 6)."""
    return prepro_captions(tmp_path_factory.mktemp("rl"), CAPTIONS, SPLITS, tokens=True, max_length=MAX_LEN,
                           batch_size=3)


# -- the published computation, in plain Python ---------------------------------------------------

def _ngrams(words: list[str], n: int = 4) -> Counter:
    return Counter(tuple(words[i:i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1))


def published_df(data: DataArtifact) -> tuple[dict, int]:
    """prepro_ngrams.py: for each training image, the n-grams of tokens + ['<eos>'] of its
    references, UNK-mapped, not clipped, counted once per image; '<eos>' is written '0'."""
    vocab = set(data.words)
    df: Counter = Counter()
    train = data.split_indices("train")
    for refs in data.references_raw(train):
        grams = set()
        for sent in refs:
            toks = [w if w in vocab else "UNK" for w in sent.split()] + ["0"]
            grams |= set(_ngrams(toks))
        df.update(grams)
    return dict(df), len(train)


def array_to_str(row, words: list[str]) -> list[str]:
    """self-critical.pytorch's array_to_str, as words: every id up to and including the first 0."""
    out = []
    for t in row:
        out.append("0" if t == 0 else words[int(t) - 1])
        if t == 0:
            break
    return out


def ciderd(hyp: list[str], refs: list[list[str]], df: dict, num_docs: int, sigma: float = 6.0) -> float:
    """pyciderevalcap's CiderD score of one hypothesis against its references (fixed df)."""
    ref_len = math.log(float(num_docs))

    def vec(words):
        v, norm, length = [defaultdict(float) for _ in range(4)], [0.0] * 4, 0
        for g, tf in _ngrams(words).items():
            n = len(g) - 1
            v[n][g] = tf * (ref_len - math.log(max(1.0, df.get(g, 0.0))))
            norm[n] += v[n][g] ** 2
            if n == 1:
                length += tf
        return v, [math.sqrt(x) for x in norm], length

    vh, nh, lh = vec(hyp)
    total = np.zeros(4)
    for r in refs:
        vr, nr, lr = vec(r)
        val = np.zeros(4)
        for n in range(4):
            for g in vh[n]:
                val[n] += min(vh[n][g], vr[n][g]) * vr[n][g]
            if nh[n] != 0 and nr[n] != 0:
                val[n] /= nh[n] * nr[n]
            val[n] *= math.e ** (-((lh - lr) ** 2) / (2 * sigma ** 2))
        total += val
    return float(np.mean(total) / len(refs) * 10.0)


def published_reward(data, samples: np.ndarray, refs: list[np.ndarray]):
    """q (B, M), S (B, M, M) and the R-DPP weights of quality_diversity_reward(is_cut=True)."""
    df, num_docs = published_df(data)
    words = data.words
    B, M, _ = samples.shape
    padded = np.zeros((B, M, MAX_LEN), np.int64)  # the published samples are seq_length wide
    padded[..., :samples.shape[-1]] = samples
    caps = [[array_to_str(padded[b, i], words) for i in range(M)] for b in range(B)]
    gts = [[array_to_str(r, words) for r in img] for img in refs]
    q = np.array([[ciderd(caps[b][i], gts[b], df, num_docs) for i in range(M)] for b in range(B)])
    S = np.zeros((B, M, M))
    for b in range(B):
        for i in range(M):
            for j in range(i, M):  # reference c_i, hypothesis c_j
                S[b, i, j] = S[b, j, i] = ciderd(caps[b][j], [caps[b][i]], df, num_docs)
    L = S * q[:, :, None] * q[:, None, :]
    inv = np.linalg.inv(L + 1e-10 * np.eye(M)[None])
    cut = np.where(inv > 0, 1.0, np.where(inv < 0, -1.0, inv))
    return q, S, (cut * L).sum(-1) / M


def ids(data: DataArtifact, sentence: str, T: int = MAX_LEN) -> np.ndarray:
    row = np.zeros(T, np.int64)
    w2i = {w: i + 1 for i, w in enumerate(data.words)}
    toks = [w2i.get(w, w2i["UNK"]) for w in sentence.split()]
    row[:len(toks)] = toks
    return row


# -- 1. the end token: df, q, S, weights --------------------------------------------------------------

@pytest.mark.integration
def test_cider_df_counts_the_end_token_of_every_unclipped_reference(data):
    want, num_docs = published_df(data)
    df = DocFreq.from_h5(data.cider_df_path)
    eos = data.vocab_size + 1
    name = {i + 1: w for i, w in enumerate(data.words)} | {eos: "0"}
    got = {tuple(name[int(t)] for t in g if t): float(v) for g, v in zip(df.ngrams, df.df)}
    assert df.num_docs == num_docs == 4
    assert got == want
    # what that means, counted by hand: "table" ends a reference of images 2 and 4, "horse" of image 1
    assert got[("table", "0")] == 2 and got[("horse", "0")] == 1 and got[("a", "horse", "0")] == 1
    # words past MAX_LEN count too: "man riding a horse on the sand near the ocean" gives "near the"
    # (words 8-9) and, with "ocean" a rare word, "the UNK <eos>" (also "in the sun" of image 2)
    assert got[("near", "the")] == 1 and got[("the", "UNK", "0")] == 2
    with h5py.File(data.cider_df_path) as f:
        assert int(f.attrs["eos_id"]) == eos


@pytest.mark.integration
def test_q_kernel_and_weights_equal_the_published_code(data):
    img = data.split_indices("train")[:2]  # images 1 and 2
    refs = data.references_ids(img)
    sents = [["a man riding a horse", "a man riding a", "a horse on a beach near", "a man on a horse"],
             ["a cat on a table", "a cat on a", "a cat on a cat", ""]]
    samples = np.stack([np.stack([ids(data, s) for s in row]) for row in sents])
    samples = samples[..., :samples.astype(bool).sum(-1).max()]  # trimmed, as decoding returns them
    q_pub, S_pub, w_pub = published_reward(data, samples, refs)

    step = RewardStep(data=data, cider=TrainCider.for_data(data), reward="dpp", m=4, max_len=MAX_LEN)
    q, S = step.cider.score_and_pairwise(samples, refs)
    np.testing.assert_allclose(q, q_pub, rtol=0, atol=1e-12)
    np.testing.assert_allclose(S, S_pub, rtol=0, atol=1e-12)
    w = dpp_weights(torch.from_numpy(q), torch.from_numpy(S))
    np.testing.assert_allclose(w.numpy(), w_pub, rtol=0, atol=1e-12)
    w32, logs = step.weights(samples, None, refs)
    np.testing.assert_allclose(w32.numpy(), w_pub, rtol=1e-5, atol=1e-5)
    assert logs["sample_cider"] == pytest.approx(q_pub.mean(), abs=1e-12)
    # the scores the separate calls give are the same numbers
    np.testing.assert_allclose(step.cider.score(samples.reshape(8, -1), refs, np.repeat([0, 1], 4)),
                               q_pub.reshape(-1), atol=1e-12)
    np.testing.assert_allclose(step.cider.pairwise(samples), S_pub, atol=1e-12)
    # what the end token does: stopping mid-phrase costs, ending where references end pays
    assert q[0, 1] < q[0, 0] and q[1, 1] < q[1, 0]
    # the kernel is CIDEr-D's asymmetric direction of the published code: reference i, hypothesis j
    eos = data.vocab_size + 1
    c0, c2 = with_eos(samples[1, 0:1], MAX_LEN, eos), with_eos(samples[1, 2:3], MAX_LEN, eos)
    hyp_j = step.cider.cider.score(c2, [c0])  # "a cat on a cat" against "a cat on a table"
    hyp_i = step.cider.cider.score(c0, [c2])
    assert S[1, 0, 2] == S[1, 2, 0] == pytest.approx(hyp_j[0], abs=1e-12)
    assert abs(hyp_i[0] - hyp_j[0]) > 1e-3  # the two directions differ on this pair


@pytest.mark.integration
def test_a_caption_at_the_length_limit_is_scored_without_an_end_token(data):
    eos = data.vocab_size + 1
    cut = ids(data, "a man riding a horse on")  # MAX_LEN words: cut by the limit, no EOS
    ended = ids(data, "a man riding a horse")
    out = with_eos(np.stack([cut, ended]), MAX_LEN, eos)
    assert list(out[0]) == list(cut) + [0] and list(out[1][:6]) == list(ended[:5]) + [eos]
    # and a reference clipped to the label width has none either (image 1's fourth, 10 words)
    refs = TrainCider.for_data(data).references(data.references_ids(data.split_indices("train")[:1]))[0]
    assert (refs[3] != eos).all() and (refs[0] == eos).sum() == 0  # "a man riding a horse on a beach": clipped
    assert (refs[1] == eos).sum() == 1  # "a man on a horse" ended


@pytest.mark.integration
def test_validation_scores_the_greedy_caption_with_the_end_token(data):
    model = Att2in(Att2inConfig(vocab_size=data.vocab_size, input_encoding_size=16, rnn_size=16, att_hid_size=16,
                                att_feat_size=8, seq_length=MAX_LEN))
    val = data.split_indices("val")
    got = greedy_cider(model, data, val)["val_cider"]
    from rdpp_cli.decoding.decode import DecodeConfig, decode

    _, att, mask = data.features(val)
    model.eval()
    hyps = decode(model, att, DecodeConfig(method="greedy", max_len=MAX_LEN)).tokens[:, 0].numpy()
    q_pub, _, _ = published_reward(data, hyps[:, None, :], data.references_ids(val))
    assert got == pytest.approx(float(q_pub.sum()), abs=1e-12)


# -- 2. on-policy samples, 3. no loss on the forced EOS -------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return DataArtifact.open(write_tiny_data(tmp_path_factory.mktemp("tiny") / "tiny", n_train=12, n_val=4))


def _policy(tiny: DataArtifact, dropout: float = 0.5) -> Att2in:
    torch.manual_seed(0)
    return att2in_for(tiny, 24, dropout)


def _batch(tiny: DataArtifact):
    return next(iter(CaptionBatches(tiny, "train", batch_size=6, seq_per_img=1, seed=0).epoch(0))).to("cpu")


@pytest.mark.unit
def test_the_loss_uses_the_log_probs_the_captions_were_drawn_with(tiny):
    model = _policy(tiny, dropout=0.5).train()
    batch = _batch(tiny)
    step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward="dpp", m=4, max_len=8)
    d = step.sample(model, batch)
    assert d.drop is not None and model.training
    token_logp, mask = step.policy_logprobs(model, batch, d)
    drawn = d.logprobs.reshape(token_logp.shape)
    on = mask.bool()
    assert on.sum() > 40
    assert torch.allclose(token_logp[on], drawn[on], atol=1e-5, rtol=0)
    # the same captions scored with fresh dropout (what rdpp did before) are far from it
    fresh, _ = model.token_logprobs(batch.att, d.samples)
    assert (fresh[on] - drawn[on]).abs().max() > 0.5
    # the same step twice draws the same captions (the masks come from the step's seeded generator)
    again = step.sample(model, batch)
    assert torch.equal(again.samples, d.samples) and torch.equal(again.drop.embed, d.drop.embed)


@pytest.mark.unit
def test_off_policy_sampling_stays_an_option(tiny):
    model = _policy(tiny, dropout=0.5).train()
    step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward="scst", m=3, max_len=8, sample_mode="eval")
    d = step.sample(model, _batch(tiny))
    assert d.drop is None and model.training  # sampled in eval mode, mode restored


@pytest.mark.unit
def test_the_forced_end_token_is_not_in_the_policy_gradient(tiny):
    model = _policy(tiny, dropout=0.5).train()
    batch = _batch(tiny)
    step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward="dpp", m=4, max_len=3)
    d = step.sample(model, batch)  # an untrained model rarely stops within 3 words
    lengths = d.lengths.reshape(-1)
    _, mask = step.policy_logprobs(model, batch, d)
    cut, ended = lengths == 3, lengths < 3
    assert cut.sum() > 5
    assert (mask[cut, 3] == 0).all() and (mask[cut, :3] == 1).all()  # three sampled words, no EOS
    if ended.any():  # a caption that sampled its EOS keeps it
        assert (mask[ended, lengths[ended]] == 1).all()
    # by hand: words 0-2 and the EOS of a 2-word caption count; a 3-word caption's forced EOS does not
    m = torch.tensor([[1., 1, 1, 1], [1, 1, 1, 0]])
    assert torch.equal(sampled_mask(m, torch.tensor([3, 2]), 3), torch.tensor([[1., 1, 1, 0], [1, 1, 1, 0]]))
    assert torch.equal(sampled_mask(m[:, :3], torch.tensor([2, 2]), 3), m[:, :3])


@pytest.mark.unit
def test_on_policy_score_function_has_mean_zero(tiny):
    """E[grad log p(c)] = 0 under the distribution c is drawn from: the mean over many on-policy
    samples is within noise of 0, while eval-mode samples scored with fresh dropout are biased."""
    model = _policy(tiny, dropout=0.5).train()
    with torch.no_grad():  # a peaked policy, as a trained one is: there dropout moves p the most
        model.logit.weight.mul_(8.0)
    batch = _batch(tiny)

    def z_score(mode: str, reps: int = 100) -> float:
        step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward="dpp", m=8, max_len=8,
                          sample_mode=mode)
        grads = []
        for r in range(reps):
            b = type(batch)(**{**batch.__dict__, "batch": r})
            d = step.sample(model, b)
            logp, mask = step.policy_logprobs(model, b, d)
            model.zero_grad()
            (logp * mask).sum(1).mean().backward()  # the mean over 48 captions of grad log p(c)
            grads.append(model.logit.bias.grad.clone())
        g = torch.stack(grads)  # (reps, V+1): independent estimates of E[grad log p]
        z = g.mean(0) / (g.std(0) / math.sqrt(reps) + 1e-12)
        return float(z.abs().max())

    assert z_score("train") < 4.0  # the largest |z| of 20 words' mean gradients: noise
    assert z_score("eval") > 6.0


# -- 4. outdated data, 5. the paper preset ----------------------------------------------------------------

@pytest.fixture(scope="module")
def ws(tiny_xe_workspace_copy) -> Path:
    return tiny_xe_workspace_copy


@pytest.mark.integration
def test_a_data_artifact_made_before_the_end_token_is_refused(tmp_path):
    data = write_tiny_data(tmp_path / "data" / "old-v1", n_train=16, n_val=6, n_test=2)
    man = data / "manifest.json"
    man.write_text(json.dumps({**json.loads(man.read_text()), "schema": 1}))  # as rdpp 0.1 wrote it
    train_xe(data, workspace=tmp_path, preset="small", epochs=1, batch_size=8, val_images=0, device="cpu")
    r = CliRunner().invoke(app, ["finetune", str(tmp_path / "xe" / "att2in-small-v1"), "--data", str(data),
                                 "--out", str(tmp_path / "o"), "--device", "cpu", "--workspace", str(tmp_path)])
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert len(line.splitlines()) == 1, line
    assert "schema 1" in line and "does not count the end token" in line and "`rdpp prepro toy`" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.integration
def test_the_paper_preset(ws, tmp_path):
    assert model_spec("att2in").recipe("finetune", "paper") == {
        "epochs": 100, "batch_size": 128, "lr": 5e-4, "lr_decay_every": 15, "lr_decay_rate": 0.8, "lr_schedule": "step"}
    art = finetune(ws / "xe" / "att2in-small-v1", preset="paper", epochs=1, batch_size=8, val_images=2,
                   device="cpu", out=tmp_path / "ft", workspace=ws)
    cfg = read_artifact(art.path).config
    assert cfg["preset"] == "paper" and cfg["lr"] == 5e-4 and cfg["lr_decay_every"] == 15
    assert cfg["lr_decay_rate"] == 0.8 and cfg["epochs"] == 1 and cfg["batch_size"] == 8  # given: they win
    assert cfg["sample_mode"] == "train" and cfg["train_reward"] == "cider-d+eos"
    toy = finetune(ws / "xe" / "att2in-small-v1", epochs=1, val_images=0, device="cpu", out=tmp_path / "toy",
                   workspace=ws, batch_size=16)
    cfg = read_artifact(toy.path).config
    assert cfg["preset"] == "small" and cfg["lr"] == 1e-4 and cfg["lr_decay_every"] == 0
