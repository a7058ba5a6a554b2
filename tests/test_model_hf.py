"""The Hugging Face captioner (``--model hf``, rdpp_cli/models/hf.py) against ``transformers``' own
``VisionEncoderDecoderModel`` with the same weights: teacher-forced log-probs to 1e-5 (fp32, eval),
greedy and beam-3 captions equal to ``generate``'s on the same encoder outputs; the cached steps
against the one-pass forward; the on-policy rule (a pass given a sampling pass's masks runs without
dropout); the token bridge.
Tiny random configs built in the test (helpers.tiny_hf_captioner): no download."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers import fit_hf_captions, tiny_hf_captioner  # noqa: E402

from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.models.base import stepwise_logprobs  # noqa: E402
from rdpp_cli.models.hf import HFCaptioner  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CAPTIONS = ["a red circle", "a blue square on a plain background", "one green triangle", "a yellow circle"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_hf_captioner(tmp_path_factory.mktemp("hf") / "captioner")


@pytest.fixture(scope="module")
def trained(folder):
    """(rdpp model, transformers model with the same weights, att (4, 17, 16)): the decoder fitted
    for a few steps to one caption per image, so that captions end with the end token."""
    import transformers as tf

    torch.manual_seed(0)
    model = HFCaptioner.from_folder(folder, seq_length=24)
    att = torch.randn(4, 17, 16)
    fit_hf_captions(model, att, CAPTIONS)
    hf = tf.VisionEncoderDecoderModel.from_pretrained(folder).eval()
    hf.decoder.load_state_dict(model.decoder.state_dict())
    hf.enc_to_dec_proj.load_state_dict(model.enc_to_dec_proj.state_dict())
    return model, hf, att


def hf_ids(model, seqs):
    start = torch.full((seqs.shape[0], 1), model.config.decoder_start_token_id)
    return torch.cat([start, model.hf_of[seqs]], 1)


@pytest.mark.unit
def test_teacher_forced_logprobs_equal_transformers_forward(trained):
    from transformers.modeling_outputs import BaseModelOutput

    model, hf, att = trained
    seqs = torch.randint(1, model.config.vocab_size + 1, (4, 3, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(att, seqs)
        out = hf(encoder_outputs=BaseModelOutput(last_hidden_state=att.repeat_interleave(3, 0)),
                 decoder_input_ids=hf_ids(model, seqs.reshape(12, -1)))
    theirs = torch.log_softmax(out.logits.float(), -1)[..., model.hf_of]  # in rdpp's id order
    assert ours.shape == (12, 8, model.config.vocab_size + 1)
    assert (ours - theirs).abs().max() < 1e-5
    # the cached step-by-step pass gives the same numbers
    assert (stepwise_logprobs(model, att, seqs) - ours).abs().max() < 1e-5


def _generate(model, hf, att, **kw):
    from transformers.modeling_outputs import BaseModelOutput

    L = model.config.seq_length
    out = hf.generate(encoder_outputs=BaseModelOutput(last_hidden_state=att), decoder_start_token_id=
                      model.config.decoder_start_token_id, eos_token_id=model.config.eos_token_id,
                      pad_token_id=model.config.eos_token_id, max_new_tokens=L + 1, do_sample=False, **kw)
    return [model.bridge(["a"], 8).tokenizer.decode(row[1:], skip_special_tokens=True) for row in out]


@pytest.mark.unit
def test_greedy_and_beam3_captions_equal_generate(trained):
    model, hf, att = trained
    bridge = model.bridge(["a"], 8)
    with torch.no_grad():
        greedy = decode(model, att, DecodeConfig(method="greedy", max_len=model.config.seq_length))
        beam = decode(model, att, DecodeConfig(method="beam", beam=3, max_len=model.config.seq_length))
    ours_g = [bridge.tokenizer.decode(bridge.hf_of[t[t > 0]].tolist()) for t in greedy.tokens[:, 0]]
    ours_b = [bridge.tokenizer.decode(bridge.hf_of[t[t > 0]].tolist()) for t in beam.tokens[:, 0]]
    assert ours_g == _generate(model, hf, att, num_beams=1)
    assert ours_b == _generate(model, hf, att, num_beams=3, length_penalty=0.0, early_stopping=False)
    assert set(ours_g) <= set(CAPTIONS)  # fitted: the captions end (with the end token) where references do


@pytest.mark.unit
def test_dropout_replay_gives_the_sampled_logprobs(folder):
    torch.manual_seed(0)
    model = HFCaptioner.from_folder(folder, seq_length=10).train()
    att = torch.randn(3, 17, 16)
    gen = torch.Generator().manual_seed(3)
    drop = model.draw_dropout(3, 3 * 4, 11, 17, generator=gen)
    dec = decode(model, att, DecodeConfig(method="random", n=4, max_len=10), generator=gen, drop=drop)
    lp, mask = model.token_logprobs(att, dec.tokens, drop=drop)
    T = dec.tokens.shape[-1]
    assert (lp - dec.logprobs.reshape(12, T + 1)).abs().max() < 1e-5
    fresh, _ = model.token_logprobs(att, dec.tokens)  # without the masks: other dropout, other numbers
    assert (fresh - lp).abs().max() > 1e-3


@pytest.mark.unit
def test_bridge_words_both_ways(folder):
    model = HFCaptioner.from_folder(folder, seq_length=10)
    words = ["a", "red", "circle", "blue", "square", "UNK"]
    bridge = model.bridge(words, 4)
    from rdpp_cli.models.bridge import Bridge, WordBridge

    assert isinstance(bridge, Bridge) and isinstance(WordBridge(words, 4), Bridge)  # one protocol, both bridges
    labels = torch.tensor([[[1, 2, 3, 0], [1, 4, 5, 0]]])  # "a red circle", "a blue square"
    toks = bridge.model_labels(labels)
    assert toks.shape[:2] == (1, 2)
    assert bridge.texts(toks[0]) == ["a red circle", "a blue square"]
    assert bridge.data_ids(toks[0]).tolist() == [[1, 2, 3, 0], [1, 4, 5, 0]]
    # a word outside the data's vocabulary is UNK for the reward, and kept in the text
    other = bridge.model_labels(torch.tensor([[1, 2, 3, 0]]))
    green = torch.from_numpy(bridge.rdpp_of_ids(bridge.tokenizer(" green", add_special_tokens=False)["input_ids"]))
    row = torch.cat([other[0, other[0] > 0], green]).unsqueeze(0)
    assert bridge.texts(row) == ["a red circle green"]
    assert bridge.data_ids(row).tolist() == [[1, 2, 3, 6]]


# -- the stages -------------------------------------------------------------------------------------

def ok(result):
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


@pytest.mark.integration
def test_the_five_mission_commands_with_model_hf(folder, tmp_path):
    """prepro toy with the captioner's encoder, train-xe --model hf, finetune --reward dpp, sample and
    score; sample and finetune read the rdpp checkpoint alone (the folder is gone by then)."""
    import json
    import shutil

    from helpers import rdpp

    from rdpp_cli.models.checkpoint import load_checkpoint

    cap, ws = tmp_path / "captioner", tmp_path / "ws"
    shutil.copytree(folder, cap)
    out = ok(rdpp("prepro", "toy", "--workspace", ws, "--backbone", f"hf:{cap}", "--images", "30")).output
    assert "att 17×16" in out  # the ViT's 16 patches and its CLS token, its hidden size
    ok(rdpp("train-xe", "--workspace", ws, "--model", "hf", "--hf-model", cap, "--epochs", "1", "--batch-size", "12",
            "--val-images", "3", "--lr", "1e-3", "--device", "cpu"))
    ckpt = load_checkpoint(ws / "xe" / "hf-paper-v1" / "checkpoints" / "best.pt")
    words = json.loads((ws / "data" / "toy-v1" / "vocab.json").read_text())["words"]
    assert ckpt["model"] == "hf" and ckpt["vocab"] == words  # the data's words: what the reward reads
    assert "tokenizer.json" in ckpt["model_config"]["tokenizer_files"]
    shutil.rmtree(cap)  # the checkpoint carries the config and the tokenizer
    ok(rdpp("finetune", "--workspace", ws, "--reward", "dpp", "--m", "5", "--epochs", "1", "--batch-size", "12",
            "--val-images", "3", "--device", "cpu"))
    metrics = (ws / "finetune" / "dpp-m5-v1" / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 2 and "self_cider" in metrics[0]
    ok(rdpp("sample", "--workspace", ws, "--n", "20", "--method", "random", "--device", "cpu"))
    samples = json.loads(next((ws / "samples").glob("*/samples.json")).read_text())
    assert len(samples) == 3 and all(len(r["captions"]) == 20 for r in samples)
    assert all(c == " ".join(c.split()) and c == c.lower() for r in samples for c in r["captions"])  # words
    ok(rdpp("score", "--workspace", ws, "--oracle", "--self-cider"))
    scores = json.loads(next((ws / "scores").glob("*/scores.json")).read_text())
    assert {"accuracy", "oracle", "diversity"} <= set(scores)


@pytest.fixture(scope="module")
def xe_hf(folder, tmp_path_factory):
    """A workspace with the tiny data (16-d att) and xe/hf-paper-v1 trained on it for 2 epochs."""
    from helpers import rdpp, write_tiny_data

    ws = tmp_path_factory.mktemp("xe_hf")
    write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=2, n_test=2, dim=16)
    ok(rdpp("train-xe", "--workspace", ws, "--model", "hf", "--hf-model", folder, "--epochs", "2", "--batch-size", "8",
            "--val-images", "0", "--lr", "3e-3", "--device", "cpu"))
    return ws


@pytest.mark.integration
def test_export_hf_round_trips_to_transformers(xe_hf, tmp_path):
    """A model artifact written back with `rdpp export-hf` loads in transformers, and its `generate`
    gives rdpp's greedy captions on the same encoder outputs; OUT with files is refused without --force."""
    import transformers as tf

    from helpers import error_line, rdpp

    from rdpp_cli.models.checkpoint import load_model

    ws = xe_hf
    art = ws / "xe" / "hf-paper-v1"
    out = tmp_path / "exported"
    ok(rdpp("export-hf", art, out, "--workspace", ws))
    hf = tf.VisionEncoderDecoderModel.from_pretrained(out).eval()
    tf.AutoTokenizer.from_pretrained(out)
    tf.AutoImageProcessor.from_pretrained(out)
    model, _, _ = load_model(art / "checkpoints" / "best.pt")
    att = torch.randn(3, 17, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = decode(model, att, DecodeConfig(method="greedy", max_len=model.config.seq_length))
    bridge = model.bridge(["a"], 8)
    assert [bridge.tokenizer.decode(bridge.hf_of[t[t > 0]].tolist()) for t in ours.tokens[:, 0]] == \
        _generate(model, hf, att, num_beams=1)
    (out / "extra.txt").write_text("mine")
    assert "not empty" in error_line(rdpp("export-hf", art, out, "--workspace", ws))
    assert (out / "extra.txt").read_text() == "mine"


# -- bad input: one line, exit 2, nothing written -----------------------------------------------------

def refused(ws, *args) -> str:
    from helpers import error_line, listing, rdpp

    before = listing(ws)
    line = error_line(rdpp(*args))
    assert listing(ws) == before
    return line


@pytest.mark.integration
def test_a_folder_that_is_not_a_vision_encoder_decoder_is_refused(tmp_path):
    import transformers as tf

    from helpers import write_tiny_data

    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2, dim=16)
    gpt2 = tmp_path / "gpt2"
    tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=20, n_positions=8, n_embd=8, n_layer=1, n_head=2)).save_pretrained(gpt2)
    train = ("train-xe", "--workspace", ws, "--model", "hf", "--device", "cpu", "--hf-model")
    assert "holds a 'gpt2' model, not an image captioner rdpp reads" in refused(ws, *train, gpt2)
    assert "has no config.json" in refused(ws, *train, tmp_path)
    assert "is not a folder" in refused(ws, *train, tmp_path / "nowhere")
    assert "--model hf needs --hf-model DIR" in refused(ws, *train[:-1])
    assert "--hf-model is for --model hf, not --model att2in" in refused(
        ws, "train-xe", "--workspace", ws, "--model", "att2in", "--hf-model", gpt2)
    assert "backbone hf:" in refused(ws, "prepro", "toy", "--workspace", ws, "--backbone", f"hf:{gpt2}", "--images", "60")


@pytest.mark.integration
def test_an_encoder_of_another_size_and_a_tokenizer_without_an_end_token_are_refused(tmp_path):
    from helpers import write_tiny_data

    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2, dim=16)
    train = ("train-xe", "--workspace", ws, "--model", "hf", "--device", "cpu", "--hf-model")
    narrow = tiny_hf_captioner(tmp_path / "narrow", enc_dim=8, dec_dim=8, layers=1)
    assert "its encoder's hidden size is 8 but data artifact" in refused(ws, *train, narrow)
    no_end = tiny_hf_captioner(tmp_path / "no-end", layers=1, eos=False)
    assert "its tokenizer has no end token" in refused(ws, *train, no_end)


@pytest.mark.integration
def test_a_model_artifact_with_another_data_artifacts_vocabulary_is_refused(xe_hf, tmp_path):
    import numpy as np

    from helpers import write_data

    other = write_data(xe_hf / "data" / "other-v1", ["the", "red", "circle", "UNK"], [["the red circle"]] * 6,
                       ["train"] * 4 + ["val", "test"], np.zeros((6, 16)), np.zeros((6, 4, 16)))
    line = refused(xe_hf, "train-xe", "--workspace", xe_hf, "--model", "hf", "--init-from", "xe/hf-paper-v1", "--data",
                   other, "--device", "cpu")
    assert "its vocabulary (15 words) is not the one of data artifact" in line and "(4 words)" in line, line
    line = refused(xe_hf, "sample", "--workspace", xe_hf, "xe/hf-paper-v1", "--data", other, "--device", "cpu")
    assert "was made from data artifact data/tiny-v1, not from" in line, line


@pytest.mark.integration
def test_without_transformers_model_hf_names_the_extra(folder, tmp_path, monkeypatch):
    import sys

    from helpers import write_tiny_data

    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2, dim=16)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    line = refused(ws, "train-xe", "--workspace", ws, "--model", "hf", "--hf-model", folder, "--device", "cpu")
    assert "needs the transformers package" in line and "pip install 'rdpp[hf]'" in line


@pytest.mark.unit
def test_token_logprobs_are_the_forwards_at_the_tokens(trained):
    from rdpp_cli.models.base import sequence_logprobs

    model, _, att = trained
    seqs = torch.tensor([[[5, 9, 0, 0], [7, 0, 0, 0]], [[3, 3, 3, 3], [1, 2, 0, 0]],
                         [[4, 0, 0, 0], [6, 6, 0, 0]], [[8, 8, 8, 0], [2, 0, 0, 0]]])
    with torch.no_grad():
        lp, mask = model.token_logprobs(att, seqs)
        ref_lp, ref_mask = sequence_logprobs(model(att, seqs), seqs)
    assert torch.equal(mask, ref_mask) and mask.sum() == 2 + 1 + 1 + 1 + 4 + 1 + 2 + 1 + 1 + 1 + 2 + 1 + 3 + 1 + 1 + 1
    assert (lp - ref_lp).abs().max() < 1e-5
