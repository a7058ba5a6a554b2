"""`rdpp export-hf` (rdpp_cli/captioning/export_hf.py, ``HFCaptioner.export``): the folder it writes
is rdpp's model for ``generate`` with nothing but the folder's own settings, a caption cut at the
length limit included. Tiny random captioners built in the test (helpers.tiny_hf_captioner)."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers")

from helpers import tiny_hf_captioner  # noqa: E402

from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.models.hf import HFCaptioner  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_hf_captioner(tmp_path_factory.mktemp("hf") / "captioner", layers=1)


@pytest.mark.unit
def test_generate_with_the_folders_settings_gives_rdpps_greedy_captions_cut_at_the_limit(folder, tmp_path):
    """A random decoder seldom draws the end token in 5 steps: every caption is cut at the limit, and ``generate`` must end it there too (the forced end token), not draw a sixth token."""
    import transformers as tf
    from transformers.modeling_outputs import BaseModelOutput

    model = HFCaptioner.from_folder(folder, seq_length=5)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights far from their init, so that the end token is as unlikely as any
        for p in model.decoder.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    model.export(tmp_path / "out", folder)
    hf = tf.VisionEncoderDecoderModel.from_pretrained(tmp_path / "out").eval()
    att = torch.randn(10, 17, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = decode(model, att, DecodeConfig(method="greedy", max_len=5)).tokens[:, 0]
        theirs = hf.generate(encoder_outputs=BaseModelOutput(last_hidden_state=att))
    eos = model.config.eos_token_id
    assert (ours > 0).all()  # every caption reached the limit: the case under test
    got = [[t for t in row[1:].tolist() if t != eos] for row in theirs]
    assert got == [model.hf_of[row].tolist() for row in ours]
    assert (theirs[:, -1] == eos).all() and theirs.shape[1] == 1 + 5 + 1  # start, 5 tokens, the forced end


# -- the stages on data made with a captioner's encoder --------------------------------------------------

def ok(result):
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def refused(root, *args) -> str:
    """The refusal's one line; nothing under ``root`` changed."""
    from helpers import error_line, listing, rdpp

    before = listing(root)
    line = error_line(rdpp(*args))
    assert listing(root) == before
    return line


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(root, workspace, folder A, folder B): data made with A's encoder (prepro toy --backbone hf:A),
    xe/hf-paper-v1 trained from A on it; B has A's config and other weights (another seed)."""
    from helpers import rdpp

    root = tmp_path_factory.mktemp("trained")
    a = tiny_hf_captioner(root / "A", layers=1)
    b = tiny_hf_captioner(root / "B", layers=1, seed=1)
    ws = root / "ws"
    ok(rdpp("prepro", "toy", "--workspace", ws, "--backbone", f"hf:{a}", "--images", "30"))
    ok(rdpp("train-xe", "--workspace", ws, "--model", "hf", "--hf-model", a, "--epochs", "1", "--batch-size", "12",
            "--val-images", "0", "--device", "cpu"))
    return root, ws, a, b


@pytest.mark.integration
def test_another_encoder_of_the_same_config_is_refused_by_train_xe_and_export_hf(trained, tmp_path):
    """B passes every size check (the same config); its weights are not those that made the data."""
    root, ws, a, b = trained
    line = refused(root, "train-xe", "--workspace", ws, "--model", "hf", "--hf-model", b, "--epochs", "1",
                   "--device", "cpu")
    assert f"--hf-model {b}: its weights" in line and "not those of the vision encoder data artifact" in line, line
    line = refused(root, "export-hf", ws / "xe" / "hf-paper-v1", tmp_path / "out", "--workspace", ws,
                   "--hf-model", b)
    assert f"--hf-model {b}: its weights" in line and "this model was made with" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_a_decoder_with_fewer_positions_than_tokens_decodes_to_its_limit(tmp_path):
    """The tiny data's 8 words are decoded to 2 x 8 = 16 tokens, which needs 17 positions: a decoder of
    12 caps its captions at 11 tokens (and says so) instead of failing mid-epoch."""
    from helpers import rdpp, write_tiny_data

    from rdpp_cli.models.checkpoint import load_model

    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2, dim=16)
    short = tiny_hf_captioner(tmp_path / "short", layers=1, positions=12)
    r = ok(rdpp("train-xe", "--workspace", ws, "--model", "hf", "--hf-model", short, "--epochs", "1", "--batch-size",
                "4", "--val-images", "2", "--device", "cpu"))
    assert "12 positions" in r.output and "11 tokens" in r.output, r.output
    model, _, _ = load_model(ws / "xe" / "hf-paper-v1" / "checkpoints" / "best.pt")
    assert model.config.seq_length == 11
    longest = torch.ones(1, 1, model.config.seq_length, dtype=torch.long)  # a caption cut at the limit
    lp, mask = model.token_logprobs(torch.zeros(1, 17, 16), longest)  # fits the 12 positions
    assert mask.sum() == 12 and torch.isfinite(lp).all()
    ok(rdpp("sample", "--workspace", ws, "--n", "2", "--method", "random", "--device", "cpu"))
    # a --max-len past the decoder's positions: one line naming both numbers, no folder claimed
    before = sorted(p.name for p in (ws / "samples").iterdir())
    line = refused(tmp_path, "sample", "--workspace", ws, "--n", "2", "--max-len", "20", "--device", "cpu")
    assert "--max-len 20" in line and "at most 11 tokens" in line and "--max-len 11 or less" in line, line
    assert sorted(p.name for p in (ws / "samples").iterdir()) == before


@pytest.mark.integration
def test_a_tokenizer_larger_than_the_decoders_embeddings_is_refused(tmp_path):
    from helpers import write_tiny_data

    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2, dim=16)
    small = tiny_hf_captioner(tmp_path / "small", layers=1, embeddings=300)
    line = refused(tmp_path, "train-xe", "--workspace", ws, "--model", "hf", "--hf-model", small, "--device", "cpu")
    assert "tokenizer has 316 tokens" in line and "embeddings hold 300" in line, line


@pytest.mark.integration
def test_export_hf_never_writes_over_what_it_reads_and_force_replaces_only_an_export(trained, tmp_path):
    from helpers import listing, rdpp

    root, ws, a, b = trained
    model = ws / "xe" / "hf-paper-v1"
    export = ("export-hf", model, "--workspace", ws)
    for out, how in ((a, "is"), (model / "hf", "lies inside"), (ws / "hf", "lies inside"), (ws, "holds"), (root, "holds")):
        line = refused(root, *export, "--out", out, "--force")
        assert f"--out {out} {how}" in line and "not even --force" in line, line
    out = tmp_path / "out"
    ok(rdpp(*export, "--out", out))
    first = listing(out)
    assert "rdpp-export.json" in first and "model.safetensors" in first
    ok(rdpp(*export, "--out", out, "--force"))  # an earlier export: replaced
    assert listing(out) == first
    (out / "mine.txt").write_text("mine")
    line = refused(tmp_path, *export, "--out", out, "--force")
    assert "not its earlier export's (mine.txt)" in line, line
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    line = refused(tmp_path, *export, other, "--force")  # OUT as an argument: the same as --out
    assert "is not an earlier rdpp export-hf folder" in line, line


@pytest.mark.integration
def test_a_second_export_into_an_out_being_written_is_refused(trained, tmp_path):
    from rdpp_cli.artifacts.lock import locked_beside

    root, ws, a, b = trained
    out = tmp_path / "out"
    with locked_beside(out):  # what a run writing OUT holds
        line = refused(tmp_path, "export-hf", ws / "xe" / "hf-paper-v1", "--out", out, "--workspace", ws)
    assert f"{out} is being written by another run (pid {os.getpid()}" in line, line
    assert not out.exists()


def lose_part_of_the_weights(monkeypatch) -> list:
    """The safetensors file that save_pretrained writes gets a hole of zeros in its data (a lost
    ``pwrite``: the same size, the writer told it was written); returns the list of files hit."""
    import transformers.modeling_utils as mu

    real, hit = mu.safe_save_file, []

    def save(tensors, filename, *a, **kw):
        real(tensors, filename, *a, **kw)
        size = os.path.getsize(filename)
        with open(filename, "r+b") as f:
            f.seek(size // 2)
            f.write(bytes(size // 4))
        hit.append(filename)

    monkeypatch.setattr(mu, "safe_save_file", save)
    return hit


@pytest.mark.integration
def test_a_lost_write_in_export_hf_is_caught_and_a_rerun_writes_the_folder(trained, tmp_path, monkeypatch):
    import transformers as tf

    from helpers import failure_line, rdpp

    root, ws, a, b = trained
    out = tmp_path / "out"
    args = ("export-hf", ws / "xe" / "hf-paper-v1", "--out", out, "--workspace", ws)
    with monkeypatch.context() as m:
        hit = lose_part_of_the_weights(m)
        r = rdpp(*args)
    assert hit, "the fault was never injected"
    failure_line(r, "model.safetensors", "tensors differ from those written", "a write was lost")
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing left behind, no temporary folder
    ok(rdpp(*args))
    hf = tf.VisionEncoderDecoderModel.from_pretrained(out)
    assert all(bool(v.abs().sum() > 0) for k, v in hf.state_dict().items() if k.endswith("weight"))


@pytest.mark.integration
def test_a_truncated_weights_file_in_an_hf_folder_is_one_line(trained, tmp_path):
    import shutil

    root, ws, a, b = trained
    cut = tmp_path / "cut"
    shutil.copytree(a, cut)
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    line = refused(root, "train-xe", "--workspace", ws, "--model", "hf", "--hf-model", cut, "--device", "cpu")
    assert f"--hf-model {cut} cannot be loaded" in line, line
    line = refused(root, "prepro", "toy", "--workspace", ws, "--backbone", f"hf:{cut}", "--images", "30")
    assert f"--backbone hf:{cut} cannot be loaded" in line, line


@pytest.mark.integration
def test_a_write_failing_in_export_hf_is_one_line_and_leaves_nothing(trained, tmp_path):
    """The file-size limit makes the weights file's write fail for real (EFBIG, as ENOSPC on a full disk):
    safetensors raises its SafetensorError; the command says one line naming the file."""
    import resource
    import signal

    from helpers import failure_line, rdpp

    root, ws, a, b = trained
    out = tmp_path / "out"
    size = (a / "model.safetensors").stat().st_size
    assert size > 4 * max(p.stat().st_size for p in a.iterdir() if p.name != "model.safetensors")
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, limits[1]))
        r = rdpp("export-hf", ws / "xe" / "hf-paper-v1", "--out", out, "--workspace", ws)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    failure_line(r, str(out / "model.safetensors"), "File too large")
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.integration
def test_a_relative_hf_folder_is_recorded_resolved_and_caption_follows_a_moved_one(tmp_path, monkeypatch):
    """prepro with ``--backbone hf:A`` typed relative records A's absolute path: `rdpp caption` from
    another folder finds it. Once A moved, caption says to pass ``--weights DIR`` (not a --backbone it
    does not have), takes the moved folder there, and refuses a folder of other weights."""
    import json
    import shutil

    from helpers import rdpp

    root = tmp_path / "root"
    a = tiny_hf_captioner(root / "A", layers=1)
    b = tiny_hf_captioner(tmp_path / "B", layers=1, seed=1)
    ws = root / "ws"
    monkeypatch.chdir(root)
    ok(rdpp("prepro", "toy", "--workspace", "ws", "--backbone", "hf:A", "--images", "30"))
    config = json.loads((ws / "data" / "toy-v1" / "manifest.json").read_text())["config"]
    assert config["backbone"] == f"hf:{a.resolve()}"
    ok(rdpp("train-xe", "--workspace", ws, "--model", "hf", "--hf-model", a, "--epochs", "1", "--batch-size", "12",
            "--val-images", "0", "--device", "cpu"))
    photos = sorted((ws / "data" / "toy-v1" / "source" / "images").glob("*.png"))[:2]
    monkeypatch.chdir(tmp_path)
    caption = ("caption", *photos, "--workspace", ws, "--device", "cpu")
    ok(rdpp(*caption, "--out", tmp_path / "c1"))
    moved = tmp_path / "moved"
    shutil.move(a, moved)
    line = refused(tmp_path, *caption, "--out", tmp_path / "c2")
    assert f"the vision encoder folder {a.resolve()} that data artifact" in line and "pass --weights DIR" in line, line
    line = refused(tmp_path, *caption, "--out", tmp_path / "c2", "--weights", b)
    assert f"--weights {b}: its weights" in line, line
    ok(rdpp(*caption, "--out", tmp_path / "c2", "--weights", moved))
    first = [r["captions"] for r in json.loads((tmp_path / "c1" / "results.json").read_text())]
    assert [r["captions"] for r in json.loads((tmp_path / "c2" / "results.json").read_text())] == first
