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

from helpers import TINY_CAPTIONERS, fit_hf_captions  # noqa: E402

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
    fit_hf_captions(model, att, CAPTIONS)
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
    out = hf.generate(pixel_values=pixels, max_new_tokens=c.seq_length + 1, do_sample=False, length_penalty=0.0,
                      early_stopping=False,
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


@pytest.mark.unit
def test_export_writes_a_folder_transformers_loads_and_generates_rdpps_captions(trained, tmp_path):
    """``export`` (rdpp export-hf) writes the full model with the trained decoder: loaded by its own
    transformers class, its ``generate`` on the pixels gives rdpp's greedy captions."""
    import transformers as tf

    model, _, pixels, att, folder = trained
    model.export(tmp_path / "out", folder)
    again = model_class(model.config.kind).from_pretrained(tmp_path / "out").eval()
    tf.AutoTokenizer.from_pretrained(tmp_path / "out")
    tf.AutoImageProcessor.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        dec = decode(model, att, DecodeConfig(method="greedy", max_len=model.config.seq_length))
    ours = [model.tokenizer.decode(model.hf_of[t[t > 0]].tolist(), skip_special_tokens=True) for t in dec.tokens[:, 0]]
    assert ours == _generate(model, again, pixels, num_beams=1)
    if model.config.kind != "blip":  # the folder's own generation config suffices (BLIP's generate reads another)
        with torch.no_grad():
            plain = again.generate(pixel_values=pixels)
        assert [model.tokenizer.decode(row[1:], skip_special_tokens=True) for row in plain] == ours


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("kind", ["gpt2", *KINDS])
def test_every_stage_with_each_kind(kind, tmp_path):
    """prepro (--backbone hf:DIR), train-xe, finetune with every reward, sample with every method,
    score, caption, compare and export-hf, on a tiny random captioner of each kind."""
    import json

    from helpers import rdpp

    from rdpp_cli.decoding.decode import METHODS
    from rdpp_cli.training.reward_table import REWARDS

    folder = TINY_CAPTIONERS[kind](tmp_path / "captioner", layers=1)
    ws = tmp_path / "ws"
    dev = ("--device", "cpu")
    ok(rdpp("prepro", "toy", "--workspace", ws, "--backbone", f"hf:{folder}", "--images", "30"))
    ok(rdpp("train-xe", "--workspace", ws, "--model", "hf", "--hf-model", folder, "--epochs", "1", "--batch-size", "12",
            "--val-images", "3", "--lr", "1e-3", "--out", ws / "xe" / "m", *dev))
    for reward in REWARDS:
        ok(rdpp("finetune", ws / "xe" / "m", "--workspace", ws, "--reward", reward, "--m", "3", "--epochs", "1",
                "--batch-size", "6", "--val-images", "3", "--out", ws / "ft" / reward, *dev))
    for method in METHODS:
        ok(rdpp("sample", ws / "ft" / "dpp", "--workspace", ws, "--method", method, "--n", "2", "--groups", "2",
                "--max-images", "3", "--out", ws / "samples" / method, *dev))
        recs = json.loads((ws / "samples" / method / "samples.json").read_text())
        assert len(recs) == 3 and all(len(r["captions"]) == 2 for r in recs), method
    ok(rdpp("score", ws / "samples" / "random", "--workspace", ws, "--self-cider"))
    photos = sorted((ws / "data" / "toy-v1" / "source" / "images").glob("*.png"))[:2]
    ok(rdpp("caption", *photos, "--from", ws / "ft" / "dpp", "--workspace", ws, "--out", tmp_path / "cap", *dev))
    assert len(json.loads((tmp_path / "cap" / "results.json").read_text())) == 2
    ok(rdpp("compare", ws / "samples" / "beam", ws / "samples" / "random", "--labels", "beam,random", "--workspace", ws,
            "--out", tmp_path / "compare"))
    ok(rdpp("export-hf", ws / "ft" / "dpp", "--workspace", ws, "--out", tmp_path / "exported"))
    model_class({"bert": "ved", "gpt2": "ved"}.get(kind, kind)).from_pretrained(tmp_path / "exported")


@pytest.mark.unit
def test_generated_logprobs_of_each_kind_equal_its_forward_with_the_encoder_once(trained):
    """``objective_hf.generated_logprobs`` on BLIP and GIT as on a VisionEncoderDecoderModel: the
    log-probs of ``generate``'s sampled rows equal the full forward's on the repeated pixels, the
    mask ends at the first end token, and the gradient reaches the vision encoder."""
    from rdpp_cli.objective_hf import generated_logprobs, sampled_mask

    model, hf, pixels, _, _ = trained
    c = model.config
    extra = {} if c.kind == "blip" else {"eos_token_id": c.eos_token_id, "pad_token_id": c.eos_token_id}
    extra.update({"decoder_start_token_id": c.decoder_start_token_id} if c.kind == "ved" else {})
    torch.manual_seed(0)
    with torch.no_grad():
        rows = hf.generate(pixel_values=pixels, do_sample=True, top_k=0, num_return_sequences=2, max_new_tokens=8,
                           **extra)
    got = generated_logprobs(hf, pixels, rows, m=2)
    with torch.no_grad():
        logits = _their_logits(model, hf, pixels.repeat_interleave(2, 0), rows[:, :-1])
    want = logits.log_softmax(-1).gather(-1, rows[:, 1:, None])[..., 0]
    assert (got.logprobs.detach() - want).abs().max() < 1e-5
    assert torch.equal(got.mask, sampled_mask(rows[:, 1:], c.eos_token_id))
    hf.zero_grad()
    (got.logprobs * got.mask).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in vision_encoder(hf, c.kind).parameters())


@pytest.mark.integration
def test_a_folder_of_no_captioner_kind_is_refused_in_one_line(tmp_path):
    """A BLIP folder of another head (question answering) and a VisionEncoderDecoderModel whose
    decoder has no cross-attention are refused by prepro and train-xe, nothing written."""
    import json

    from helpers import error_line, listing, rdpp, write_tiny_data

    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2, dim=16)
    vqa = TINY_CAPTIONERS["blip"](tmp_path / "vqa", layers=1)
    cfg = json.loads((vqa / "config.json").read_text())
    (vqa / "config.json").write_text(json.dumps({**cfg, "architectures": ["BlipForQuestionAnswering"]}))
    plain = TINY_CAPTIONERS["bert"](tmp_path / "plain", layers=1)
    cfg = json.loads((plain / "config.json").read_text())
    cfg["decoder"]["add_cross_attention"] = False
    (plain / "config.json").write_text(json.dumps(cfg))
    before = listing(ws)
    train = ("train-xe", "--workspace", ws, "--model", "hf", "--device", "cpu", "--hf-model")
    assert "holds a BlipForQuestionAnswering, not a BlipForConditionalGeneration" in error_line(rdpp(*train, vqa))
    assert "is not a causal language model with cross-attention" in error_line(rdpp(*train, plain))
    line = error_line(rdpp("prepro", "toy", "--workspace", ws, "--backbone", f"hf:{plain}", "--images", "30"))
    assert line.startswith(f"error: --backbone hf:{plain}: its decoder ('bert')"), line
    assert listing(ws) == before


@pytest.mark.integration
def test_a_checkpoint_without_a_kind_reads_as_a_vision_encoder_decoder(tmp_path):
    """Checkpoints written before the kinds (no ``kind`` in their config) are ViT + GPT-2 models."""
    import dataclasses

    from rdpp_cli.models.checkpoint import load_model, save_checkpoint

    model = HFCaptioner.from_folder(TINY_CAPTIONERS["gpt2"](tmp_path / "gpt2", layers=1), seq_length=6)
    save_checkpoint(tmp_path / "m.pt", model, ["a", "b"])
    ckpt = torch.load(tmp_path / "m.pt", weights_only=False)
    del ckpt["model_config"]["kind"]
    torch.save(ckpt, tmp_path / "old.pt")
    old, _, _ = load_model(tmp_path / "old.pt")
    assert old.config.kind == "ved" and dataclasses.asdict(old.config) == dataclasses.asdict(model.config)
    att = torch.randn(2, 17, 16)
    seqs = torch.tensor([[3, 4, 0], [5, 0, 0]])
    with torch.no_grad():
        assert torch.equal(old(att, seqs), model(att, seqs))


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["gpt2", "bert", "blip", "git"])
def test_prepros_pixels_are_the_image_processors(kind, tmp_path):
    """The pixels rdpp's reader gives an ``hf:DIR`` backbone are those the folder's own image processor
    (transformers' ``AutoImageProcessor``) makes, for photos of every shape: ViT's square resize
    (bilinear), BLIP's (bicubic), GIT's shorter side resized then the centre cropped (CLIP's)."""
    import numpy as np
    import transformers as tf
    from PIL import Image

    from rdpp_cli.data.backbones import HF_PREFIX, build_backbone
    from rdpp_cli.data.features import ImageFiles, iter_features
    from rdpp_cli.hf_folder import read_folder

    folder = TINY_CAPTIONERS[kind](tmp_path / "captioner")
    bb = build_backbone(HF_PREFIX + str(folder), att_size=1)
    proc = tf.AutoImageProcessor.from_pretrained(folder)
    rng, paths = np.random.default_rng(0), []
    for i, (w, h) in enumerate([(61, 37), (40, 90), (20, 20), (33, 32)]):
        path = tmp_path / f"photo{i}.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
        got, _, err = ImageFiles([path], bb.image_size, bb.mean, bb.std, bb.processor)[0]
        with Image.open(path) as im:
            want = proc(images=im.convert("RGB"), return_tensors="pt").pixel_values[0]
        assert not err and got.shape == want.shape, (w, h, got.shape, want.shape)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"{kind}, a {w}x{h} photo")
        paths.append(path)
    fc, att = next(iter_features(paths, bb, batch_size=len(paths), device="cpu"))  # prepro's extraction loop
    model, _, folder_kind = read_folder(str(folder), option="--backbone hf:")
    with torch.no_grad():
        pixels = proc(images=[Image.open(p).convert("RGB") for p in paths], return_tensors="pt").pixel_values
        want = vision_encoder(model, folder_kind).eval()(pixel_values=pixels).last_hidden_state
    torch.testing.assert_close(torch.from_numpy(att), want, rtol=1e-5, atol=1e-5)
