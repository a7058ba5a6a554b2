"""Cross-entropy training through the shared loop: learning, exact resume, the artifact, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.models.checkpoint import save_checkpoint
from rdpp_cli.training.loop import TrainingRecipe
from rdpp_cli.training.options import TrainLoopOptions
from rdpp_cli.training.xe import most_frequent_caption, train_xe, xe_loss

import cider_reference
from helpers import Crash, att2in_for, state_dict, write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_tiny_data(tmp_path_factory.mktemp("ws") / "data" / "tiny-v1", n_train=16, n_val=6, n_test=2)


@pytest.mark.integration
def test_tiny_model_overfits_four_images(tmp_path):
    # one caption per image (repeated 5 times), so the optimum loss is 0
    d = DataArtifact.open(write_tiny_data(tmp_path / "four", n_train=4, n_val=2, n_test=0, templates=["a {c} {s}"]))
    torch.manual_seed(0)
    model = att2in_for(d)
    cfg = TrainLoopOptions(epochs=60, batch_size=2, lr=1e-2, lr_decay_every=0, val_images=0, device="cpu", seed=0)
    art = TrainingRecipe(stage="xe", model=model, data=d, out_dir=tmp_path / "out", opts=cfg, step_fn=xe_loss,
                         inputs=[d.artifact], manifest_config={}).run()
    m = pd.read_csv(art.path / "metrics.csv")
    assert len(m) == 60 and m["step"].iloc[-1] == 120
    assert m["loss"].iloc[0] > 2.0  # log(vocab) at the start
    assert m["loss"].iloc[-1] < 0.02
    # the learnt captions are the training captions, word for word
    from rdpp_cli.decoding.decode import DecodeConfig, decode

    model.eval()
    idx = d.split_indices("train")
    _, att, mask = d.features(idx)
    got = decode(model, att, DecodeConfig(method="greedy", max_len=d.seq_length)).tokens[:, 0]
    assert [d.decode(t) for t in got] == [d.references_raw([i])[0][0] for i in idx]


@pytest.mark.integration
def test_resume_after_a_crash_equals_an_uninterrupted_run(data_dir, tmp_path):
    kw = dict(preset="small", epochs=2, batch_size=6, save_every_steps=2, val_images=3, device="cpu", seed=5)
    # 16 images / 6 = 3 steps per epoch; dropout 0.3 in the small preset, so the RNG state matters
    ref = train_xe(data_dir, out=tmp_path / "ref", **kw)

    ws = tmp_path / "ws"

    def crash_at(k):
        def hook(step):
            if step == k:
                raise Crash(f"killed after step {k}")
        return hook

    with pytest.raises(Crash):  # saved at steps 2 (mid-epoch), 3 (epoch end), 4 (mid-epoch); dies at 5
        train_xe(data_dir, workspace=ws, after_step=crash_at(5), **kw)
    partial = ws / "xe" / "att2in-small-v1"
    assert not (partial / "manifest.json").exists() and (partial / "checkpoints" / "last_state.pt").exists()
    assert torch.load(partial / "checkpoints" / "last.pt", weights_only=True)["step"] == 4
    # the same command again continues the unfinished run (no new version)
    resumed = train_xe(data_dir, workspace=ws, **kw)
    assert resumed.path == partial and not (ws / "xe" / "att2in-small-v2").exists()

    a, b = state_dict(ref.path / "checkpoints" / "last.pt"), state_dict(resumed.path / "checkpoints" / "last.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ma, mb = pd.read_csv(ref.path / "metrics.csv"), pd.read_csv(resumed.path / "metrics.csv")
    cols = ["epoch", "step", "loss", "val_cider", "lr"]
    pd.testing.assert_frame_equal(ma[cols], mb[cols])
    assert ref.manifest["summary"]["val_cider"] == resumed.manifest["summary"]["val_cider"]

    # a crash right at an epoch's end (resume state at step 3 = epoch 2, batch 0) also resumes exactly
    with pytest.raises(Crash):
        train_xe(data_dir, workspace=ws, after_step=crash_at(4), **{**kw, "save_every_steps": 0})
    again = train_xe(data_dir, workspace=ws, **{**kw, "save_every_steps": 0})
    c = state_dict(again.path / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], c[k]) for k in a)

    # --no-resume starts the unfinished run over in the same folder (and ends where ref ends)
    with pytest.raises(Crash):
        train_xe(data_dir, workspace=ws, after_step=crash_at(5), **kw)
    fresh = train_xe(data_dir, workspace=ws, resume=False, **kw)
    assert fresh.path == ws / "xe" / "att2in-small-v3"
    assert list(pd.read_csv(fresh.path / "metrics.csv")["step"]) == [3, 6]
    f = state_dict(fresh.path / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], f[k]) for k in a)


@pytest.mark.integration
def test_model_artifact_contents(data_dir, tmp_path):
    art = train_xe(data_dir, out=tmp_path / "m", preset="small", epochs=3, batch_size=8, val_images=4,
                   lr=2e-3, device="cpu", seed=1)
    man = art.manifest
    assert man["kind"] == "rdpp.model" and man["config"]["stage"] == "xe" and man["config"]["preset"] == "small"
    assert man["config"]["model_config"]["rnn_size"] == 256 and man["config"]["model_config"]["vocab_size"] == 15
    assert [i["kind"] for i in man["inputs"]] == ["rdpp.data"]
    assert Path(man["inputs"][0]["path"]) == data_dir.resolve()
    assert {"checkpoints/best.pt", "checkpoints/last.pt", "checkpoints/last_state.pt", "metrics.csv"} <= set(man["files"])
    m = pd.read_csv(art.path / "metrics.csv")
    assert list(m["epoch"]) == [1, 2, 3] and list(m["step"]) == [2, 4, 6]
    assert {"loss", "val_cider", "lr", "time", "images_per_s"} <= set(m.columns)
    assert (m["loss"].diff().iloc[1:] < 0).all()  # the training loss goes down
    best = int(m["val_cider"].idxmax())
    assert man["summary"]["val_cider"] == pytest.approx(m["val_cider"].max())
    ck = torch.load(art.path / "checkpoints" / "best.pt", weights_only=True)
    assert ck["epoch"] == best + 1 and ck["val_cider"] == pytest.approx(m["val_cider"].max())
    assert ck["vocab"] == DataArtifact.open(data_dir).words and ck["model_class"] == "Att2in"
    # best.pt really holds the weights that scored it: decode the 4 val images again and rescore
    from rdpp_cli.models.checkpoint import load_model
    from rdpp_cli.training.validation import greedy_cider

    d = DataArtifact.open(data_dir)
    model, _, _ = load_model(art.path / "checkpoints" / "best.pt")
    sums = greedy_cider(model, d, d.split_indices("val")[:4])
    assert sums["_n"] == 4 and sums["val_cider"] / 4 == pytest.approx(ck["val_cider"], abs=1e-9)
    # the trivial baseline: the most frequent training caption (ties: smallest ids) for every val
    # image, scored by pycocoevalcap with the df of cider_df.h5, all counted here independently;
    # the training reward's CIDEr-D counts the end token of every caption shorter than the label width
    words, L = d.words, d.seq_length
    train_rows = [r for i in d.split_indices("train") for r in range(d.label_start[i], d.label_end[i])]
    with h5py.File(data_dir / "captions.h5", "r") as f:
        labels = f["labels"][...]

    def text(row) -> str:
        ws = [words[t - 1] for t in row if t]
        return " ".join(ws + (["<eos>"] if len(ws) < L else []))

    counts = Counter(tuple(labels[r]) for r in train_rows)
    top = min(counts, key=lambda row: (-counts[row], row))
    hyp = text(top)
    assert counts[top] == 2 and hyp == "a blue circle <eos>"  # this data's 16 training images repeat 4 captions
    refs = [[text(labels[r]) for r in range(d.label_start[i], d.label_end[i])] for i in d.split_indices("val")[:4]]
    df, ref_len = cider_reference.df_from_h5(data_dir / "cider_df.h5", words)
    want = cider_reference.cider_d([(hyp, rs) for rs in refs], df, ref_len).mean()
    assert man["summary"]["baseline_cider"] == pytest.approx(want, abs=1e-9) and want > 0.1


@pytest.mark.integration
def test_checkpoint_decodes_the_same_captions_in_a_fresh_process(data_dir, tmp_path):
    art = train_xe(data_dir, out=tmp_path / "m", preset="small", epochs=1, batch_size=8, val_images=2,
                   lr=2e-3, device="cpu", seed=2)
    script = (
        "import json, sys, torch\n"
        "from rdpp_cli.data.dataset import DataArtifact\n"
        "from rdpp_cli.models.checkpoint import load_model\n"
        "from rdpp_cli.decoding.decode import DecodeConfig, decode\n"
        "d = DataArtifact.open(sys.argv[1]); m, vocab, _ = load_model(sys.argv[2])\n"
        "idx = d.split_indices('val'); _, att, mask = d.features(idx)\n"
        "t = decode(m, att, DecodeConfig(method='greedy', max_len=d.seq_length)).tokens[:, 0]\n"
        "print(json.dumps([d.decode(r) for r in t]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(data_dir), str(art.path / "checkpoints" / "best.pt")],
                         capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    fresh = json.loads(out.stdout.strip().splitlines()[-1])

    from rdpp_cli.decoding.decode import DecodeConfig, decode
    from rdpp_cli.models.checkpoint import load_model

    d = DataArtifact.open(data_dir)
    model, _, _ = load_model(art.path / "checkpoints" / "best.pt")
    idx = d.split_indices("val")
    _, att, _ = d.features(idx)
    here = [d.decode(r) for r in decode(model, att, DecodeConfig(method="greedy", max_len=d.seq_length)).tokens[:, 0]]
    assert fresh == here and len(here) == 6 and all(here)


@pytest.mark.unit
def test_trivial_baseline_caption_is_the_most_frequent(tmp_path):
    # image 3 (yellow circle) gets two more copies of "a yellow circle"; image 15 is also a yellow
    # circle, so that caption occurs 4 times among the training references, every other at most 2
    d = DataArtifact.open(write_tiny_data(tmp_path / "d", extra_captions={3: 2}))
    assert d.decode(most_frequent_caption(d, chunk=7)) == "a yellow circle"


# -- bad input: one clear line, non-zero exit, nothing written -------------------------------------

runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, ["train-xe", *map(str, args)])


@pytest.mark.integration
def test_not_a_data_artifact(tmp_path):
    folder = tmp_path / "notdata"
    folder.mkdir()
    (folder / "captions.h5").write_bytes(b"")
    r = _cli("--data", folder, "--out", tmp_path / "o", "--device", "cpu")
    assert r.exit_code == 2
    assert "has no manifest.json" in r.output and str(folder) in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.integration
def test_a_model_artifact_given_as_data(data_dir, tmp_path):
    art = train_xe(data_dir, out=tmp_path / "m", preset="small", epochs=1, batch_size=16, val_images=0, device="cpu")
    r = _cli("--data", art.path, "--out", tmp_path / "o", "--device", "cpu")
    assert r.exit_code == 2 and "is a rdpp.model artifact; expected an artifact of kind rdpp.data" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.integration
def test_init_from_a_checkpoint_of_another_vocabulary(data_dir, tmp_path):
    d = DataArtifact.open(data_dir)
    other = Att2in(Att2inConfig(vocab_size=5, rnn_size=8, att_hid_size=8, input_encoding_size=8,
                                att_feat_size=d.att_dim))
    save_checkpoint(tmp_path / "other.pt", other, ["w1", "w2", "w3", "w4", "UNK"])
    r = _cli("--data", data_dir, "--init-from", tmp_path / "other.pt", "--out", tmp_path / "o", "--device", "cpu")
    assert r.exit_code == 2
    assert "its vocabulary (5 words) is not the one of data artifact" in r.output and "15 words" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.integration
def test_init_from_a_model_with_the_same_vocabulary_starts_from_its_weights(data_dir, tmp_path):
    base = train_xe(data_dir, out=tmp_path / "a", preset="small", epochs=1, batch_size=16, val_images=0,
                    device="cpu", seed=3)
    r = _cli("--data", data_dir, "--init-from", base.path, "--out", tmp_path / "b", "--device", "cpu",
             "--epochs", "1", "--batch-size", "16", "--val-images", "0", "--lr", "1e-12", "--seed", "4")
    assert r.exit_code == 0, r.output
    a, b = state_dict(base.path / "checkpoints" / "best.pt"), state_dict(tmp_path / "b" / "checkpoints" / "best.pt")
    assert all(torch.allclose(a[k], b[k], atol=1e-8) for k in a)  # lr 1e-12: one step barely moves them
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["config"]["init_from"].endswith("best.pt")


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_device_cuda_without_a_gpu(data_dir, tmp_path):
    r = _cli("--data", data_dir, "--out", tmp_path / "o", "--device", "cuda")
    assert r.exit_code == 2
    assert "--device cuda was asked for but torch sees no CUDA GPU" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


@pytest.mark.integration
def test_bad_options_are_refused_before_anything_is_written(data_dir, tmp_path):
    r = _cli("--data", data_dir, "--out", tmp_path / "o", "--device", "cpu", "--preset", "huge")
    assert r.exit_code == 2 and "--preset 'huge' is not a preset" in r.output
    r = _cli("--data", data_dir, "--out", tmp_path / "o", "--device", "cpu", "--grad-clip-mode", "l3")
    assert r.exit_code == 2 and "--grad-clip-mode" in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.integration
def test_cli_writes_a_versioned_artifact_in_the_workspace(data_dir, tmp_path):
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    os.symlink(data_dir, ws / "data" / "tiny-v1")
    r = runner.invoke(app, ["train-xe", "--workspace", str(ws), "--preset", "small", "--epochs", "1",
                            "--batch-size", "16", "--val-images", "2", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    art = read_artifact(ws / "xe" / "att2in-small-v1", "rdpp.model")
    assert art.manifest["config"]["epochs"] == 1 and "rdpp xe: done" in r.output
    assert np.isfinite(art.manifest["summary"]["val_cider"])

    # --config FILE sets options; flags typed override it; both land in the manifest
    cfg = tmp_path / "xe.yaml"
    cfg.write_text("preset: small\nepochs: 2\nbatch-size: 16\nval_images: 0\nlr: 0.001\n")
    r = runner.invoke(app, ["train-xe", "--workspace", str(ws), "--config", str(cfg), "--epochs", "1",
                            "--device", "cpu"])
    assert r.exit_code == 0, r.output
    c = read_artifact(ws / "xe" / "att2in-small-v2", "rdpp.model").config
    assert (c["epochs"], c["batch_size"], c["val_images"], c["lr"], c["preset"]) == (1, 16, 0, 0.001, "small")


@pytest.mark.unit
def test_xe_loss_is_the_mean_token_nll_with_the_eos_counted_once(data_dir):
    d = DataArtifact.open(data_dir)
    torch.manual_seed(0)
    model = att2in_for(d).eval()
    from rdpp_cli.data.loader import CaptionBatches

    batch = CaptionBatches(d, batch_size=3, seed=0).load(0, 0).to("cpu")  # float32 features
    labels = batch.labels.clone()
    labels[0, 0, 2:] = 0  # a 2-word caption: 3 tokens count (2 words + EOS)
    batch.labels = labels
    with torch.no_grad():
        logp = model(batch.att, labels)  # (15, L+1, V+1)
    total, count = 0.0, 0
    for n, seq in enumerate(labels.reshape(-1, labels.shape[-1]).tolist()):
        words = [w for w in seq if w] if 0 not in seq else seq[:seq.index(0)]
        for t, w in enumerate(words + [0]):  # the words, then one EOS; nothing after it
            total -= float(logp[n, t, w])
            count += 1
    assert count == int((labels > 0).sum()) + 15
    with torch.no_grad():
        assert float(xe_loss(model, batch)) == pytest.approx(total / count, rel=1e-5)


@pytest.mark.integration
def test_data_without_val_images_needs_val_images_0(tmp_path):
    data = write_tiny_data(tmp_path / "noval", n_train=8, n_val=0, n_test=2)
    r = _cli("--data", data, "--out", tmp_path / "o", "--device", "cpu", "--preset", "small")
    assert r.exit_code == 2 and "has no val images to validate on; pass --val-images 0" in r.output
    assert not (tmp_path / "o").exists()
    r = _cli("--data", data, "--out", tmp_path / "o", "--device", "cpu", "--preset", "small", "--val-images", "0",
             "--epochs", "1", "--batch-size", "8")
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert "val_cider" not in man["summary"] and (tmp_path / "o" / "checkpoints" / "best.pt").exists()
