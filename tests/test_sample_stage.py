"""`rdpp sample`: the samples artifact, its lineage checks, reproducibility and bad input."""

import json

import pytest
import torch
from typer.testing import CliRunner

from rdpp_cli.artifacts import finish, prepare_output, read_artifact, write_manifest
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.toy import prepro_toy
from rdpp_cli.models.registry import build
from rdpp_cli.models.checkpoint import save_checkpoint


def _model_artifact(ws, data, vocab=None, seed=0, group="xe", name="att2in"):
    ds = DataArtifact(data)
    torch.manual_seed(seed)
    vocab = vocab or ds.words
    net = build("att2in", "small", vocab_size=len(vocab), att_feat_size=ds.att_dim, seq_length=ds.seq_length,
                rnn_size=32, input_encoding_size=32, att_hid_size=32)
    cfg = {"stage": "xe", "seed": seed, "vocab": len(vocab)}
    out = prepare_output(None, workspace=ws, group=group, name=name, kind="rdpp.model", config=cfg)
    save_checkpoint(out / "checkpoints" / "best.pt", net, vocab)
    art = write_manifest(out, "rdpp.model", cfg, inputs=[data])
    finish(out)
    return art


pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    data = prepro_toy(workspace=ws, images=120, seed=3)
    model = _model_artifact(ws, data)
    return ws, data, model


def _run(args):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200", "RDPP_NO_PROGRESS": "1"})


def test_sample_with_no_paths_writes_samples_of_the_test_split(ws):
    root, data, model = ws
    r = _run(["sample", "--n", "4", "--method", "random", "--workspace", str(root), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    # named after the model that made them; inputs recorded relative to the workspace, with their hashes
    art = read_artifact(root / "samples" / f"{model.name}.random-n4-v1", "rdpp.samples")
    assert [i["path"] for i in art.inputs] == [f"xe/{model.name}", f"data/{data.name}"]
    assert [i["manifest_sha256"] for i in art.inputs] == [model.manifest_sha256, data.manifest_sha256]
    recs = json.loads((art.path / "samples.json").read_text())
    ds = DataArtifact(data)
    assert [r_["image_id"] for r_ in recs] == [int(ds.image_ids[i]) for i in ds.split_indices("test")]
    for rec in recs:
        assert len(rec["captions"]) == 4 and len(rec["logprobs"]) == 4
        assert all(lp < 0 for lp in rec["logprobs"])
        assert all(w in ds.words for c in rec["captions"] for w in c.split())
    assert art.manifest["summary"]["n"] == 4 and art.config["method"] == "random"


def test_same_seed_same_samples_other_seed_other_samples(ws, tmp_path):
    root, _, model = ws
    outs = []
    for k, seed in enumerate((5, 5, 6)):
        r = _run(["sample", str(model.path), "--n", "3", "--seed", str(seed), "--out", str(tmp_path / f"s{k}"),
                  "--device", "cpu", "--workspace", str(root)])
        assert r.exit_code == 0, r.output
        outs.append(json.loads((tmp_path / f"s{k}" / "samples.json").read_text()))
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_greedy_copies_are_identical_and_beam_best_beats_greedy(ws, tmp_path):
    root, _, model = ws
    assert _run(["sample", "--from", model.name, "--method", "greedy", "--n", "2", "--out", str(tmp_path / "g"),
                 "--workspace", str(root), "--device", "cpu"]).exit_code == 0
    assert _run(["sample", "--from", model.name, "--method", "beam", "--beam", "3", "--n", "1",
                 "--out", str(tmp_path / "b"), "--workspace", str(root), "--device", "cpu"]).exit_code == 0
    greedy = json.loads((tmp_path / "g" / "samples.json").read_text())
    beam = json.loads((tmp_path / "b" / "samples.json").read_text())
    for g, b in zip(greedy, beam):
        assert g["captions"][0] == g["captions"][1]
        assert b["logprobs"][0] >= g["logprobs"][0] - 1e-5


@pytest.mark.parametrize("args, match", [
    (["--n", "0"], "--n must be at least 1"),
    (["--method", "telepathy"], "unknown decoding method 'telepathy'"),
    (["--n", "-1"], "--n must be at least 1 \\(got -1\\)"),
    pytest.param(["--device", "cuda"], "--device cuda was asked for but torch sees no CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")),
    (["--split", "holdout"], "unknown split 'holdout'"),
])
def test_bad_options_are_one_line(ws, args, match):
    import re

    root, _, _ = ws
    r = _run(["sample", "--workspace", str(root), *args])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("using ")]
    assert len(lines) == 1 and re.search(match, lines[0]), r.output


def test_model_with_another_vocabulary_is_refused(ws, tmp_path):
    root, data, _ = ws
    other = _model_artifact(tmp_path, data, vocab=DataArtifact(data).words[:-1] + ["zebra"])
    r = _run(["sample", str(other.path), "--data", str(data.path), "--workspace", str(root)])
    assert r.exit_code == 2
    n = len(DataArtifact(data).words)
    assert f"model {other.path}: its vocabulary ({n} words) is not the one of data artifact {data.path} ({n} words) " \
        "(as many, but other words or another order); sample with the data the model was trained on" in r.output
    assert not (tmp_path / "samples").exists()


def test_model_trained_on_other_data_is_refused(ws, tmp_path):
    root, data, model = ws
    other_data = prepro_toy(workspace=tmp_path, images=60, seed=4)
    r = _run(["sample", str(model.path), "--data", str(other_data.path), "--workspace", str(root)])
    assert r.exit_code == 2 and f"was made from data artifact data/{data.name}, not from" in r.output, r.output


def test_recorded_logprobs_are_the_models_and_summary_counts_distinct(ws, tmp_path):
    """samples.json's log-prob of each caption equals teacher forcing it through the checkpoint."""
    from rdpp_cli.models import load_model, sequence_logprobs

    root, data, model = ws
    r = _run(["sample", str(model.path), "--method", "topk", "--top-k", "3", "--n", "5", "--max-images", "6",
              "--out", str(tmp_path / "s"), "--workspace", str(root), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "captions/s" in r.output and "distinct per image" in r.output
    art = read_artifact(tmp_path / "s", "rdpp.samples")
    recs = json.loads((art.path / "samples.json").read_text())
    assert len(recs) == 6
    net, vocab, _ = load_model(model.path / "checkpoints" / "best.pt")
    ds = DataArtifact(data)
    ids = {w: i + 1 for i, w in enumerate(vocab)}
    row_of = {int(iid): k for k, iid in enumerate(ds.image_ids)}
    idx = [row_of[rec["image_id"]] for rec in recs]
    _, att, mask = ds.features(idx)
    seqs = torch.zeros(6, 5, ds.seq_length, dtype=torch.long)
    for b, rec in enumerate(recs):
        for j, cap in enumerate(rec["captions"]):
            words = cap.split()
            seqs[b, j, :len(words)] = torch.tensor([ids[w] for w in words], dtype=torch.long)
    with torch.no_grad():
        tok, _ = sequence_logprobs(net(att, seqs, att_mask=mask), seqs)
    want = tok.sum(1).view(6, 5)
    got = torch.tensor([rec["logprobs"] for rec in recs])
    assert torch.allclose(got, want, atol=1e-4)
    distinct = sum(len(set(rec["captions"])) for rec in recs) / 6
    assert art.manifest["summary"]["distinct"] == pytest.approx(distinct)


def test_every_method_runs_as_typed_and_records_its_defaults(ws, tmp_path):
    """`rdpp sample --method M` with no other flag (n = 20 by default) works for every method, and
    the manifest records the settings the method used."""
    root, _, model = ws
    want = {"topk": {"top_k": 10}, "nucleus": {"top_p": 0.9}, "beam": {"beam": 20},
            "dbs": {"groups": 20, "beam": 1, "diversity_lambda": 0.5}}
    for method, settings in want.items():
        r = _run(["sample", str(model.path), "--method", method, "--max-images", "2", "--out", str(tmp_path / method),
                  "--workspace", str(root), "--device", "cpu"])
        assert r.exit_code == 0, r.output
        art = read_artifact(tmp_path / method, "rdpp.samples")
        assert {k: art.config[k] for k in settings} == settings and art.config["n"] == 20
        assert all(len(rec["captions"]) == 20 for rec in json.loads((art.path / "samples.json").read_text()))


def test_select_keeps_n_of_the_candidates_and_scores_unchanged(ws, tmp_path):
    """`--select mbr --n 3 --candidates 8 --keep-candidates`: the candidates are the 8 random
    samples the same seed gives without --select; the captions are the 3 distinct candidates of
    highest consensus (mean CIDEr-D against the other 7: the training reward's scorer), computed
    here from the strings; the manifest records method, count, quality and selection; `rdpp score` reads it."""
    import shutil

    import numpy as np

    from rdpp_cli.metrics.train_cider import TrainCider

    root, data, model = ws
    common = [str(model.path), "--max-images", "6", "--seed", "7", "--workspace", str(root), "--device", "cpu"]
    assert _run(["sample", *common, "--n", "8", "--out", str(tmp_path / "plain")]).exit_code == 0
    r = _run(["sample", *common, "--n", "3", "--select", "mbr", "--candidates", "8", "--keep-candidates",
              "--out", str(tmp_path / "mbr")])
    assert r.exit_code == 0, r.output
    plain = json.loads((tmp_path / "plain" / "samples.json").read_text())
    recs = json.loads((tmp_path / "mbr" / "samples.json").read_text())
    art = read_artifact(tmp_path / "mbr", "rdpp.samples")
    assert {k: art.config[k] for k in ("method", "n", "candidates", "select", "quality", "keep_candidates")} == \
        {"method": "random", "n": 3, "candidates": 8, "select": "mbr", "quality": "consensus", "keep_candidates": True}
    ds = DataArtifact(data)
    reward = TrainCider.for_data(ds)  # the training reward's CIDEr-D: train df, EOS counted
    ids = {w: i + 1 for i, w in enumerate(ds.words)}
    for p, rec in zip(plain, recs):
        cands = rec["candidates"]
        assert cands == p["captions"] and rec["candidate_logprobs"] == p["logprobs"]
        assert rec["captions"] == [cands[j] for j in rec["chosen"]]
        assert rec["logprobs"] == [p["logprobs"][j] for j in rec["chosen"]]
        toks = np.zeros((len(cands), ds.seq_length), np.int64)
        for i, c in enumerate(cands):
            toks[i, :len(c.split())] = [ids[w] for w in c.split()]
        cons = np.array([reward.score(toks[i:i + 1], [np.delete(toks, i, 0)])[0] for i in range(len(cands))])
        first = [i for i, c in enumerate(cands) if c not in cands[:i]]
        best = sorted(first, key=lambda i: -cons[i])[:3]
        assert sorted(cons[rec["chosen"]]) == pytest.approx(sorted(cons[best]), abs=1e-12)
        assert len(set(rec["captions"])) == min(3, len(first))
    if shutil.which("java") is None:
        pytest.skip("java not found: `rdpp score` needs it (coco-caption's tokenizer)")
    r = _run(["score", str(tmp_path / "mbr"), "--metrics", "CIDEr", "--self-cider", "--workspace", str(root),
              "--out", str(tmp_path / "scores")])
    assert r.exit_code == 0, r.output
    scores = json.loads((tmp_path / "scores" / "scores.json").read_text())
    assert scores["settings"]["captions_per_image"] == 3 and scores["diversity"]["self_cider"] is not None


@pytest.mark.parametrize("args, match", [
    (["--select", "dpp", "--candidates", "4", "--n", "5"], "--candidates 4 must be at least --n 5"),
    (["--keep-candidates"], "--keep-candidates keeps the candidates of --select"),
    (["--select", "mbr", "--quality", "logprob"], "--select mbr ranks by consensus"),
])
def test_bad_selection_options_are_one_line(ws, args, match):
    root, _, _ = ws
    r = _run(["sample", "--workspace", str(root), *args])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("using ")]
    assert len(lines) == 1 and match in lines[0], r.output
