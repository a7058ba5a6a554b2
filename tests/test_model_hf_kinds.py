"""Every kind of Hugging Face captioner ``--model hf`` reads (rdpp_cli/hf_folder.py): a
VisionEncoderDecoderModel with a BERT decoder, BlipForConditionalGeneration and GitForCausalLM (the
ViT+GPT-2 one is tests/test_model_hf.py's), each against the full transformers model with the same
weights fed the same pixels: teacher-forced log-probs equal its forward to 1e-5 (fp32, eval), greedy
and beam-3 captions equal its ``generate`` (settings in ``_generate``, as docs/model.md says), the
on-policy rule, the position cap and one train-xe run. Tiny random models built in the test
(tests/helpers.py): no download."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers import TINY_CAPTIONERS  # noqa: E402

from rdpp_cli.decoding.decode import DecodeConfig, decode  # noqa: E402
from rdpp_cli.hf_folder import model_class, vision_encoder  # noqa: E402
from rdpp_cli.models.base import stepwise_logprobs  # noqa: E402
from rdpp_cli.models.hf import HFCaptioner  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

KINDS = ["bert", "blip", "git"]
CAPTIONS = ["a red circle", "a blue square on a plain background", "one green triangle", "a yellow circle"]


@pytest.fixture(scope="module", params=KINDS)
def trained(request, tmp_path_factory):
    """(rdpp model, the full transformers model with the same weights, pixels (4, 3, 32, 32), att):
    the decoder fitted for a few steps to one caption per image, so that captions end."""
    folder = TINY_CAPTIONERS[request.param](tmp_path_factory.mktemp(request.param) / "captioner")
    torch.manual_seed(0)
    model = HFCaptioner.from_folder(folder, seq_length=20)
    hf = model_class(model.config.kind).from_pretrained(folder).eval()
    pixels = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        att = vision_encoder(hf, model.config.kind)(pixel_values=pixels).last_hidden_state
    bridge = model.bridge(["a"], 8)
    labels = bridge.tokenizer(CAPTIONS, add_special_tokens=False)["input_ids"]
    seqs = torch.zeros(4, max(map(len, labels)), dtype=torch.long)
    for i, ids in enumerate(labels):
        seqs[i, :len(ids)] = torch.from_numpy(bridge.rdpp_of_ids(ids))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(40):
        lp, mask = model.token_logprobs(att, seqs)
        opt.zero_grad()
        (-lp.sum() / mask.sum()).backward()
        opt.step()
    model.eval()
    model._save_into(hf)
    return model, hf, pixels, att, folder


def _their_logits(model, hf, pixels, ids):
    kind = model.config.kind
    if kind == "ved":
        return hf(pixel_values=pixels, decoder_input_ids=ids).logits
    logits = hf(pixel_values=pixels, input_ids=ids).logits
    return logits[:, -ids.shape[1]:]  # GIT: after the image's tokens


@pytest.mark.unit
def test_teacher_forced_logprobs_equal_the_models_forward(trained):
    model, hf, pixels, att, _ = trained
    seqs = torch.randint(1, model.config.vocab_size + 1, (4, 3, 7), generator=torch.Generator().manual_seed(1))
    start = torch.full((12, 1), model.config.decoder_start_token_id)
    ids = torch.cat([start, model.hf_of[seqs.reshape(12, -1)]], 1)
    with torch.no_grad():
        ours = model(att, seqs)
        theirs = torch.log_softmax(_their_logits(model, hf, pixels.repeat_interleave(3, 0), ids).float(), -1)
        stepwise = stepwise_logprobs(model, att, seqs)  # the cached pass, a token at a time
    assert ours.shape == (12, 8, model.config.vocab_size + 1)
    assert (ours - theirs[..., model.hf_of]).abs().max() < 1e-5
    assert (stepwise - ours).abs().max() < 1e-5


def _generate(model, hf, pixels, **kw):
    """``generate`` on the pixels: greedy or beam, no length penalty, at most seq_length + 1 new tokens."""
    c = model.config
    extra = {"decoder_start_token_id": c.decoder_start_token_id} if c.kind == "ved" else {}
    if c.kind != "blip":  # BLIP's generate sets its own: [SEP] and [PAD]
        extra.update(eos_token_id=c.eos_token_id, pad_token_id=c.eos_token_id)
    out = hf.generate(pixel_values=pixels, max_new_tokens=c.seq_length + 1, do_sample=False, length_penalty=0.0, early_stopping=False,
                      **extra, **kw)
    return [model.tokenizer.decode(row[1:], skip_special_tokens=True) for row in out]


@pytest.mark.unit
def test_greedy_and_beam3_captions_equal_generate(trained):
    model, hf, pixels, att, _ = trained
    with torch.no_grad():
        got = {b: decode(model, att, DecodeConfig(method="greedy" if b == 1 else "beam", beam=b,
                                                   max_len=model.config.seq_length)) for b in (1, 3)}
    for b, dec in got.items():
        ours = [model.tokenizer.decode(model.hf_of[t[t > 0]].tolist(), skip_special_tokens=True)
                for t in dec.tokens[:, 0]]
        assert ours == _generate(model, hf, pixels, num_beams=b), b
    assert set(model.bridge(["a"], 8).texts(got[1].tokens[:, 0])) <= set(CAPTIONS)  # fitted: they end


@pytest.mark.unit
def test_on_policy_samples_and_logprobs_both_without_dropout(trained):
    """In train mode, a pass given dropout masks (finetune's on-policy draw and its replay) runs
    without dropout: the sampled log-probs equal the replayed ones and eval mode's; without masks
    the model's own dropout is on (XE)."""
    model, _, _, att, _ = trained
    model.train()
    try:
        gen = torch.Generator().manual_seed(3)
        drop = model.draw_dropout(4, 16, 11, att.shape[1], generator=gen)
        dec = decode(model, att, DecodeConfig(method="random", n=4, max_len=10), generator=gen, drop=drop)
        replay, _ = model.token_logprobs(att, dec.tokens, drop=drop)
        fresh, _ = model.token_logprobs(att, dec.tokens)
    finally:
        model.eval()
    with torch.no_grad():
        evaluated, _ = model.token_logprobs(att, dec.tokens)
    T = dec.tokens.shape[-1]
    assert (replay - dec.logprobs.reshape(16, T + 1)).abs().max() < 1e-5
    assert (replay - evaluated).abs().max() < 1e-5
    assert (fresh - replay).abs().max() > 1e-3
    assert model.training is False and not model.decoder.training


@pytest.mark.unit
@pytest.mark.parametrize("kind", KINDS)
def test_decoding_length_is_capped_at_the_position_limit(kind, tmp_path):
    folder = TINY_CAPTIONERS[kind](tmp_path / "short", layers=1, positions=8)
    model = HFCaptioner.from_folder(folder, seq_length=24)
    assert model.config.seq_length == 7  # the start token and 7 tokens fill the 8 positions
    with torch.no_grad():
        dec = decode(model, torch.randn(2, 17, 16), DecodeConfig(method="random", n=2, max_len=model.config.seq_length))
    assert dec.tokens.shape[-1] <= 7


def ok(result):
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_train_xe_reads_each_kind(kind, tmp_path):
    """One train-xe epoch with --model hf on each kind of folder; the checkpoint records the kind."""
    from helpers import rdpp, write_tiny_data

    from rdpp_cli.models.checkpoint import load_checkpoint

    folder = TINY_CAPTIONERS[kind](tmp_path / "captioner", layers=1)
    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2, dim=16)
    ok(rdpp("train-xe", "--workspace", ws, "--model", "hf", "--hf-model", folder, "--epochs", "1", "--batch-size", "8",
            "--val-images", "2", "--lr", "1e-3", "--device", "cpu"))
    ckpt = load_checkpoint(ws / "xe" / "hf-paper-v1" / "checkpoints" / "best.pt")
    assert ckpt["model_config"]["kind"] == {"bert": "ved"}.get(kind, kind)
