"""docs/api.md's Hugging Face snippet, as written there, on a tiny random VisionEncoderDecoderModel
(a one-layer ViT and GPT-2 with cross-attention, a byte-level BPE tokenizer trained on the
references; no download): the log-probs it computes are those `generate` drew the samples with, the
mask covers the words and the first end token, and the API scores the decoded words."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from rdpp_cli.objective import Objective  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

REFS = {"red": ["A red circle.", "A circle that is red.", "Red circle on a plain background."],
        "blue": ["A blue square.", "A square that is blue.", "Blue square on a plain background."]}


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([c for caps in REFS.values() for c in caps], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    end = "<|endoftext|>"
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=end, bos_token=end, pad_token=end)


def _captioner(tokenizer, pixel_values):
    """A tiny captioner fit for a few steps to the references (so its samples share words with them)."""
    T = transformers
    eos = tokenizer.eos_token_id
    enc = T.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                      image_size=32, patch_size=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    dec = T.GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                       add_cross_attention=True, bos_token_id=eos, eos_token_id=eos,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg = T.VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id = cfg.pad_token_id = cfg.eos_token_id = eos
    torch.manual_seed(0)
    model = T.VisionEncoderDecoderModel(config=cfg)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    texts = [c for caps in REFS.values() for c in caps]
    px = pixel_values.repeat_interleave(3, 0)
    labels = tokenizer([t + tokenizer.eos_token for t in texts], padding=True, return_tensors="pt")
    labels = labels.input_ids.masked_fill(labels.attention_mask == 0, -100)
    for _ in range(40):
        loss = model(pixel_values=px, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_the_documented_hugging_face_loop():
    tokenizer = _tokenizer()
    pixel_values = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    model = _captioner(tokenizer, pixel_values)
    image_ids, m = ["red", "blue"], 4
    objective = Objective.from_references(REFS, reward="scst", m=m)
    torch.manual_seed(1)
    # -- docs/api.md, "A Hugging Face captioner" (plus output_scores to check it) --
    gen = model.generate(pixel_values=pixel_values, do_sample=True, top_k=0, num_return_sequences=m,
                         max_new_tokens=16, output_scores=True, return_dict_in_generate=True)
    seqs = gen.sequences
    px = pixel_values.repeat_interleave(m, 0)
    logits = model(pixel_values=px, decoder_input_ids=seqs[:, :-1]).logits
    token_logp = logits.log_softmax(-1).gather(-1, seqs[:, 1:, None])[..., 0]
    eos = tokenizer.eos_token_id
    seen = (seqs[:, 1:] == eos).long().cumsum(1)
    mask = (seen == 0) | ((seen == 1) & (seqs[:, 1:] == eos))
    greedy = model.generate(pixel_values=pixel_values, do_sample=False, max_new_tokens=16)
    out = objective.step(image_ids, seqs, token_logp, mask, greedy=greedy,
                         decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    # the log-probs are those generate drew each token with (on-policy), over the masked tokens
    drawn = torch.stack(gen.scores, 1).log_softmax(-1).gather(-1, seqs[:, 1:, None])[..., 0]
    assert float(((drawn - token_logp.detach()).abs() * mask).max()) < 1e-5
    ended = (seqs[:, 1:] == eos).any(1)
    assert ended.all() and torch.equal(mask.sum(1), (seqs[:, 1:] == eos).int().argmax(1) + 1)
    # the words of the decoded texts are what is scored: the same numbers from the texts themselves
    texts = [tokenizer.decode(s, skip_special_tokens=True) for s in seqs]
    assert out.captions == texts and all(t and t[0].isupper() for t in texts)
    again = objective.weights(image_ids, texts, greedy=tokenizer.batch_decode(greedy, skip_special_tokens=True))
    assert torch.equal(again.weights, out.weights) and torch.equal(again.scores, out.scores)
    assert out.scores.max() > 1.0 and out.weights.abs().max() > 0.1
    out.loss.backward()
    assert model.decoder.lm_head.weight.grad.abs().sum() > 0


def test_generated_logprobs_are_the_models_forward_with_the_encoder_run_once_per_image():
    """rdpp_cli.objective_hf.generated_logprobs: the log-probs of the model's own forward on every
    row (1e-5), the words-plus-first-end-token mask, one encoder call on the B images, and a
    gradient that reaches the encoder through the repeated encoder output."""
    from rdpp_cli.objective_hf import generated_logprobs

    tokenizer = _tokenizer()
    pixel_values = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    model = _captioner(tokenizer, pixel_values)
    m, eos = 4, tokenizer.eos_token_id
    torch.manual_seed(2)
    gen = model.generate(pixel_values=pixel_values, do_sample=True, top_k=0, num_return_sequences=m,
                         max_new_tokens=6, return_dict_in_generate=True)
    seqs = gen.sequences
    calls = []
    hook = model.encoder.register_forward_hook(lambda mod, args, kwargs_out: calls.append(1))
    try:
        rows = generated_logprobs(model, pixel_values, gen, m=m)
    finally:
        hook.remove()
    assert len(calls) == 1  # the B images once, not the B*m rows
    full = model(pixel_values=pixel_values.repeat_interleave(m, 0), decoder_input_ids=seqs[:, :-1]).logits
    want = full.log_softmax(-1).gather(-1, seqs[:, 1:, None])[..., 0]
    assert rows.logprobs.shape == want.shape == rows.ids.shape == rows.mask.shape
    assert float((rows.logprobs - want).detach().abs().max()) < 1e-5 and torch.equal(rows.ids, seqs[:, 1:])
    ended = (rows.ids == eos).any(1)
    first = (rows.ids == eos).int().argmax(1)
    lengths = torch.where(ended, first + 1, torch.full_like(first, rows.ids.shape[1]))
    assert ended.any() and not ended.all()  # captions that ended and captions cut at max_new_tokens
    assert torch.equal(rows.mask.sum(1), lengths) and rows.mask.dtype == torch.bool
    objective = Objective.from_references(REFS, reward="dpp", m=m)
    out = objective.step(["red", "blue"], rows.ids, rows.logprobs, rows.mask,
                         decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    out.loss.backward()
    assert model.encoder.embeddings.patch_embeddings.projection.weight.grad.abs().sum() > 0
