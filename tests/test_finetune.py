"""`rdpp finetune`: the reward step on real CIDEr-D, a tiny end-to-end run per reward, exact resume,
and bad input (one clear line, nothing written)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches
from rdpp_cli.metrics.train_cider import TrainCider
from rdpp_cli.metrics.self_cider import self_cider_from_kernel
from rdpp_cli.models.checkpoint import load_model
from rdpp_cli.training.finetune import RewardStep, finetune, run_name, sample_seed

import cider_reference
from helpers import Crash, state_dict, tiny_workspace, write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"
runner = CliRunner()


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace with a tiny data artifact and an XE model trained on it (3 epochs)."""
    return tiny_workspace(tmp_path_factory.mktemp("ws"), xe_epochs=3)


def _xe(ws: Path) -> Path:
    return ws / "xe" / "att2in-small-v1"


def _data(ws: Path) -> DataArtifact:
    return DataArtifact.open(ws / "data" / "tiny-v1")


# -- the reward step on real CIDEr-D ---------------------------------------------------------------

def _step(ws: Path, reward: str, m: int, **kw) -> tuple[RewardStep, DataArtifact]:
    d = _data(ws)
    return RewardStep(data=d, cider=TrainCider.for_data(d), reward=reward, m=m,
                      max_len=d.seq_length, **kw), d


def _ids(d: DataArtifact, sentence: str, T: int = 8) -> np.ndarray:
    row = np.zeros(T, np.int64)
    toks = [d.words.index(w) + 1 for w in sentence.split()]
    row[:len(toks)] = toks
    return row


@pytest.mark.integration
def test_scst_advantage_is_zero_when_the_samples_are_the_greedy_caption(ws):
    step, d = _step(ws, "scst", 3)
    img = d.split_indices("train")[:2]
    refs = d.references_ids(img)
    greedy = np.stack([_ids(d, d.references_raw([i])[0][0]) for i in img])  # a reference: CIDEr-D > 0
    samples = np.repeat(greedy[:, None, :], 3, axis=1)
    w, logs = step.weights(samples, greedy, refs)
    assert logs["greedy_cider"] > 1.0 and logs["sample_cider"] == pytest.approx(logs["greedy_cider"])
    assert torch.equal(w, torch.zeros(2, 3))
    # one sample better than greedy, one worse: the advantage has their sign, against real CIDEr-D
    samples[0, 1] = _ids(d, "a a a")
    w, _ = step.weights(samples, greedy, refs)
    assert w[0, 1] < 0 and w[0, 0] == 0 and (w[1] == 0).all()


@pytest.mark.integration
def test_dpp_weights_on_real_captions(ws):
    step, d = _step(ws, "dpp", 3)
    img = d.split_indices("train")[:1]
    refs = d.references_ids(img)
    r = d.references_raw(img)[0]
    same = np.stack([_ids(d, r[0])] * 3)[None]  # three identical samples: q²S(2 − M)/M each
    w, logs = step.weights(same, None, refs)
    q = step.cider.score(same[0], refs, np.zeros(3, int))
    S = step.cider.pairwise(same)[0]
    assert np.allclose(q, q[0]) and np.allclose(S, S[0, 0]) and S[0, 0] > 5  # S_ii ≈ 10
    assert torch.allclose(w, torch.full((1, 3), float(q[0] ** 2 * S[0, 0] * (2 - 3) / 3)), rtol=1e-5)
    assert logs["self_cider"] == pytest.approx(0.0, abs=1e-6)
    # two different references and an empty caption: finite, the empty one weighs 0 and the
    # other two get the weights of the pair alone, rescaled from 1/2 to 1/3
    mixed = np.stack([_ids(d, r[0]), _ids(d, r[2]), np.zeros(8, np.int64)])[None]
    w, logs = step.weights(mixed, None, refs)
    pair, _ = _step(ws, "dpp", 2)[0].weights(mixed[:, :2], None, refs)
    assert torch.isfinite(w).all() and w[0, 2] == 0
    assert torch.allclose(w[0, :2], pair[0] * 2 / 3, rtol=1e-5)
    assert logs["self_cider"] == pytest.approx(float(self_cider_from_kernel(step.cider.pairwise(mixed))[0]))
    assert logs["self_cider"] > 0.2
    # all-empty samples: zero weights, nothing infinite
    w, _ = step.weights(np.zeros((1, 3, 8), np.int64), None, refs)
    assert torch.equal(w, torch.zeros(1, 3))


@pytest.mark.integration
def test_mean_baseline_options(ws):
    d = _data(ws)
    img = d.split_indices("train")[:1]
    refs = d.references_ids(img)
    r = d.references_raw(img)[0]
    caps = np.stack([_ids(d, r[0]), _ids(d, r[1]), _ids(d, "a a")])[None]
    plain, _ = _step(ws, "dpp", 3)[0].weights(caps, None, refs)
    centred, _ = _step(ws, "dpp", 3, baseline="mean")[0].weights(caps, None, refs)
    assert torch.allclose(centred, plain - plain.mean(), atol=1e-6) and abs(float(centred.sum())) < 1e-4
    adv, _ = _step(ws, "scst-mean", 3)[0].weights(caps, None, refs)
    q = _step(ws, "scst-mean", 3)[0].cider.score(caps[0], refs, np.zeros(3, int))
    assert torch.allclose(adv[0], torch.tensor(q - (q.sum() - q) / 2, dtype=torch.float32), atol=1e-6)


@pytest.mark.unit
def test_sampling_seed_depends_only_on_the_position():
    assert sample_seed(1, 2, 3, 0) == sample_seed(1, 2, 3, 0)
    assert len({sample_seed(1, e, b, r) for e in range(3) for b in range(3) for r in range(2)}) == 18


@pytest.mark.unit
def test_run_names():
    assert run_name("dpp", 5, "none", 5) == "dpp-m5" and run_name("dpp", 2, "mean", 5) == "dpp-m2-mean"
    assert run_name("scst", 5, "none", 5) == "scst" and run_name("scst-mean", 3, "none", 5) == "scst-mean-m3"
    assert run_name("xe-cider", 5, "none", 5.0) == "xe-cider-l5"


# -- end to end --------------------------------------------------------------------------------------

@pytest.mark.integration
def test_tiny_dpp_run_writes_a_valid_model_artifact(ws, tmp_path):
    art = finetune(_xe(ws), reward="dpp", m=3, epochs=2, batch_size=8, lr=1e-3, val_images=4, device="cpu",
                   seed=2, out=tmp_path / "ft", workspace=ws)
    art.verify()  # every listed file's sha256
    man = art.manifest
    assert man["kind"] == "rdpp.model"
    cfg = man["config"]
    assert cfg["stage"] == "finetune" and cfg["reward"] == "dpp" and cfg["m"] == 3 and cfg["baseline"] == "none"
    assert cfg["model"] == "xe/att2in-small-v1" and cfg["model_config"]["rnn_size"] == 256
    assert cfg["model_sha256"] == read_artifact(_xe(ws)).manifest_sha256  # the resume identity: content
    # --out outside a workspace: inputs recorded by absolute path (and hash)
    assert [i["kind"] for i in man["inputs"]] == ["rdpp.data", "rdpp.model"]
    assert Path(man["inputs"][1]["path"]) == _xe(ws).resolve()
    assert man["inputs"][1]["manifest_sha256"] == read_artifact(_xe(ws)).manifest_sha256
    m = pd.read_csv(art.path / "metrics.csv")
    assert list(m["epoch"]) == [1, 2] and list(m["step"]) == [2, 4]
    for col in ("loss", "reward", "sample_cider", "self_cider", "val_cider", "val_sample_cider", "val_self_cider"):
        assert col in m.columns and np.isfinite(m[col]).all(), col
    # the checkpoint is a complete model: loads alone and decodes with the data's vocabulary
    model, vocab, ck = load_model(art.path / "checkpoints" / "best.pt")
    assert vocab == _data(ws).words and ck["stage"] == "finetune"
    # (what the logged numbers are, and that training follows the R-DPP weights: the tests below)


@pytest.mark.integration
@pytest.mark.parametrize("reward", ["scst", "scst-mean", "xe-cider"])
def test_other_rewards_run_through_the_workspace(ws, reward):
    r = runner.invoke(app, ["finetune", "--workspace", str(ws), "--reward", reward, "--m", "2", "--epochs", "1",
                            "--batch-size", "8", "--val-images", "2", "--device", "cpu", "--lr", "1e-3"])
    assert r.exit_code == 0, r.output
    name = run_name(reward, 2, "none", 5.0)
    art = read_artifact(ws / "finetune" / f"{name}-v1", "rdpp.model")
    assert art.manifest["config"]["reward"] == reward and "rdpp finetune: done" in r.output
    m = pd.read_csv(art.path / "metrics.csv")
    assert np.isfinite(m["val_cider"]).all() and np.isfinite(m["sample_cider"]).all()
    if reward in ("scst", "xe-cider"):
        assert "greedy_cider" in m.columns
    if reward == "xe-cider":
        assert art.manifest["config"]["lam"] == 5.0 and (m["xe_loss"] > 0).all()


@pytest.mark.integration
def test_resume_after_a_crash_equals_an_uninterrupted_run(ws, tmp_path):
    kw = dict(reward="dpp", m=2, epochs=2, batch_size=8, lr=1e-3, val_images=2, save_every_steps=1,
              device="cpu", seed=7, workspace=ws)
    ref = finetune(_xe(ws), out=tmp_path / "ref", **kw)

    def crash(step):
        if step == 3:
            raise Crash("killed")

    with pytest.raises(Crash):  # 16 images / 8 = 2 steps per epoch; dies after step 3 (mid epoch 2)
        finetune(_xe(ws), out=tmp_path / "run", after_step=crash, **kw)
    assert not (tmp_path / "run" / "manifest.json").exists()
    again = finetune(_xe(ws), out=tmp_path / "run", **kw)
    a, b = state_dict(ref.path / "checkpoints" / "last.pt"), state_dict(again.path / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    cols = ["epoch", "step", "loss", "reward", "sample_cider", "val_cider", "val_self_cider"]
    pd.testing.assert_frame_equal(pd.read_csv(ref.path / "metrics.csv")[cols],
                                  pd.read_csv(again.path / "metrics.csv")[cols])


# -- one R-DPP step, replayed: what it logged, and which way it moved the weights -----------------------

ONE = dict(reward="dpp", m=4, seed=3)


@pytest.fixture(scope="module")
def one_step(ws, tmp_path_factory):
    """A run of one step: one epoch of one batch (all 16 training images) from the XE model, at a
    learning rate small enough for the update to be first-order; and that step's samples drawn
    again from the XE weights (the same batch and generator position: the same captions and
    dropout masks)."""
    art = finetune(_xe(ws), epochs=1, batch_size=16, lr=1e-5, val_images=0, device="cpu",
                   out=tmp_path_factory.mktemp("one") / "ft", workspace=ws, **ONE)
    d = _data(ws)
    step = RewardStep(data=d, cider=TrainCider.for_data(d), max_len=d.seq_length, **ONE)
    batch = CaptionBatches(d, "train", batch_size=16, seq_per_img=1, seed=ONE["seed"]).load(0, 0).to("cpu")
    xe = load_model(_xe(ws) / "checkpoints" / "best.pt")[0]
    draw = step.sample(xe, batch)
    return art, step, batch, draw, xe


def _independent_reward(d: DataArtifact, samples: np.ndarray, index: np.ndarray):
    """The step's captions as text (the end token of every caption that ended counted, in the
    samples and in the references: the training reward), their CIDEr-D q (B, M), self-CIDEr (B,)
    and R-DPP weights w (B, M), all computed here with pycocoevalcap's scorer on the df of
    cider_df.h5 (tests/cider_reference.py) and numpy, not with rdpp's metrics or rewards."""
    L = d.seq_length

    def text(ids) -> str:
        words = [d.words[t - 1] for t in ids if t]
        return " ".join(words + (["<eos>"] if len(words) < L else []))

    caps = [[text(c) for c in img] for img in samples.tolist()]
    refs = [[text(r) for r in rs] for rs in d.references_ids(index)]
    df, ref_len = cider_reference.df_from_h5(d.path / "cider_df.h5", d.words)
    q = np.stack(cider_reference.per_caption(caps, refs, df, ref_len))
    M = q.shape[1]
    # the reward's kernel has the published R-DPP direction, S_ij = CIDEr-D(c_j, {c_i}) for i <= j
    # (docs/rewards.md): the diversity code's direction on the captions in reverse order, which
    # permutes the kernel's rows and columns alike and leaves its singular values as they are
    self_c = np.array([cider_reference.self_cider(c[::-1], df, ref_len) for c in caps])
    w = np.zeros_like(q)
    for b, c in enumerate(caps):
        S = np.zeros((M, M))
        for i in range(M):
            for j in range(i, M):
                S[i, j] = S[j, i] = cider_reference.cider_d([(c[j], [c[i]])], df, ref_len)[0]
        Lk = S * np.outer(q[b], q[b])  # docs/rewards.md#r-dpp: L = S ⊙ q qᵀ, w_i = (1/M) Σ_j sign((L + εI)⁻¹_ij) L_ij
        w[b] = (np.sign(np.linalg.inv(Lk + 1e-10 * np.eye(M))) * Lk).sum(1) / M
    return caps, q, self_c, w


@pytest.mark.integration
def test_the_logged_sample_cider_and_self_cider_are_those_of_the_steps_samples(ws, one_step):
    """metrics.csv's sample_cider, self_cider and reward (the mean R-DPP weight) of the epoch (its
    one step), recomputed from the step's captions with pycocoevalcap's scorer, the authors'
    self-CIDEr formula and the R-DPP weights of docs/rewards.md#r-dpp."""
    art, step, batch, draw, _ = one_step
    caps, q, self_c, w = _independent_reward(_data(ws), draw.samples.numpy(), batch.index)
    row = pd.read_csv(art.path / "metrics.csv").iloc[0]
    assert row["step"] == 1 and q.shape == (16, 4)
    assert row["sample_cider"] == pytest.approx(float(q.mean()), abs=1e-6)
    assert row["reward"] == pytest.approx(float(w.mean()), abs=1e-6)
    # (tolerance: the authors' formula adds the square roots of round-off singular values, ~1e-8)
    assert row["self_cider"] == pytest.approx(float(self_c.mean()), abs=1e-6)
    assert 0.05 < row["self_cider"] < 0.95 and len({c for img in caps for c in img}) > 16  # not a degenerate batch


@pytest.mark.integration
def test_the_step_is_a_descent_step_of_the_rdpp_loss_of_its_samples(ws, one_step):
    """The run's one update, against the R-DPP loss of the step's samples written out here
    (docs/rewards.md#the-objectives, with weights computed independently: -w_i · log p(c_i,t) summed over each sample slot's
    tokens across the batch, divided by their number, averaged over the M slots): Adam's first step
    moves each weight by -lr · g/(|g| + eps), against the sign of the gradient g, and to first
    order it raises Σ_i w_i log p(c_i). Training on another objective fails this: without R-DPP's
    sign cut (every w_i = 1/M) only ~64 % of the weights move against g's sign, with the sign of
    the loss flipped none; a loss divided by the batch's total token count instead gives ~98 %."""
    art, step, batch, draw, xe = one_step
    ft = load_model(art.path / "checkpoints" / "last.pt")[0]
    _, _, _, w_np = _independent_reward(_data(ws), draw.samples.numpy(), batch.index)
    w = torch.from_numpy(w_np)
    B, M = w.shape
    assert (w > 0).sum() >= 8 and (w == 0).sum() >= 8 and (w < 0).any()  # R-DPP's weights, not all alike

    def logp(model) -> tuple[torch.Tensor, torch.Tensor]:  # sampled tokens' log-probs, the dropout replayed
        model.train()
        token_logp, mask = step.policy_logprobs(model, batch, draw)
        return token_logp * mask, mask

    per_token, mask = logp(xe)
    slot_tokens = mask.view(B, M, -1).sum((0, 2))
    loss = -((w.view(B, M, 1).float() * per_token.view(B, M, -1)).sum((0, 2)) / slot_tokens).mean()
    xe.zero_grad()
    loss.backward()
    g = torch.cat([p.grad.reshape(-1) for p in xe.parameters()])
    moved = torch.cat([(a.detach() - b.detach()).reshape(-1) for a, b in zip(ft.parameters(), xe.parameters())])
    sel = (moved != 0) & (g != 0)
    assert sel.sum() > 0.9 * g.numel()
    against = (torch.sign(moved[sel]) == -torch.sign(g[sel])).double().mean().item()
    assert against >= 0.95, f"only {against:.1%} of the weights moved against the R-DPP gradient's sign"
    with torch.no_grad():
        delta = logp(ft)[0].sum(1) - per_token.sum(1)
    assert float((w.reshape(-1) * delta.double()).sum()) > 0


# -- bad input ------------------------------------------------------------------------------------------

def _cli(*args):
    return runner.invoke(app, ["finetune", *map(str, args)])


def _one_line_error(r, *needles):
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    for n in needles:
        assert n in r.output, r.output


@pytest.mark.integration
def test_m1_for_dpp_is_refused(ws, tmp_path):
    r = _cli(_xe(ws), "--reward", "dpp", "--m", "1", "--out", tmp_path / "o", "--device", "cpu")
    _one_line_error(r, "--m 1 with --reward dpp", "use --m 2 or more")
    assert not (tmp_path / "o").exists()
    r = _cli(_xe(ws), "--reward", "scst", "--baseline", "mean", "--out", tmp_path / "o", "--device", "cpu")
    _one_line_error(r, "--baseline mean applies to --reward dpp only")
    assert not (tmp_path / "o").exists()


@pytest.mark.integration
def test_a_finetuned_model_is_not_an_xe_model(ws, tmp_path):
    ft = finetune(_xe(ws), reward="scst-mean", m=2, epochs=1, batch_size=16, val_images=0, device="cpu",
                  out=tmp_path / "ft", workspace=ws)
    r = _cli(ft.path, "--out", tmp_path / "o", "--device", "cpu")
    _one_line_error(r, str(ft.path), "not XE-trained", "rdpp train-xe")
    assert not (tmp_path / "o").exists()


@pytest.mark.integration
def test_an_xe_model_trained_on_other_data_is_refused(ws, tmp_path):
    other = write_tiny_data(tmp_path / "other", n_train=16, n_val=6, n_test=2, seed=9)
    r = _cli(_xe(ws), "--data", other, "--out", tmp_path / "o", "--device", "cpu")
    _one_line_error(r, "xe/att2in-small-v1 was made from data artifact data/tiny-v1", f"not from {other}")
    assert not (tmp_path / "o").exists()
    before = sorted(p.name for p in (ws / "finetune").iterdir()) if (ws / "finetune").exists() else []
    r = _cli("--workspace", ws, "--from", "no-such-model", "--device", "cpu")
    _one_line_error(r, "XE model artifact 'no-such-model' not found")
    after = sorted(p.name for p in (ws / "finetune").iterdir()) if (ws / "finetune").exists() else []
    assert before == after


@pytest.mark.integration
def test_no_xe_model_in_the_workspace(tmp_path):
    r = _cli("--workspace", tmp_path, "--device", "cpu")
    _one_line_error(r, "no XE model artifact in workspace", "rdpp train-xe")


@pytest.mark.integration
def test_config_file_sets_the_reward(ws, tmp_path):
    cfg = tmp_path / "ft.yaml"
    cfg.write_text("reward: dpp\nm: 1\n")
    r = _cli(_xe(ws), "--config", cfg, "--out", tmp_path / "o", "--device", "cpu")
    _one_line_error(r, "--m 1 with --reward dpp")
    assert not (tmp_path / "o").exists()
