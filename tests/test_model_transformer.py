"""Transformer (rdpp_cli/models/transformer.py): its parts by hand, the key/value cache against the
full-prefix pass, on-policy dropout replay, and equality with self-critical.pytorch's own
TransformerModel loaded with the same weights (skipped where the peer checkout is absent)."""

from __future__ import annotations

import math

import pytest
import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches
from rdpp_cli.decoding.decode import DecodeConfig, decode
from rdpp_cli.metrics.train_cider import TrainCider
from rdpp_cli.models import load_model, save_checkpoint, select_rows, sequence_logprobs
from rdpp_cli.models.base import CaptionModel, stepwise_logprobs
from rdpp_cli.models.registry import model_spec
from rdpp_cli.models.transformer import LayerNorm, Transformer, TransformerConfig, causal_mask, positional_encoding
from rdpp_cli.precision import autocast
from rdpp_cli.training.finetune import RewardStep
from rdpp_cli.training.xe import xe_loss
import helpers
import peer_loader
from helpers import fit_captions, write_tiny_data

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = dict(N_enc=2, N_dec=2, d_model=32, d_ff=48, num_att_heads=4)


def tiny(vocab=20, dropout=0.0, seed=0, feat=7, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(vocab_size=vocab, seq_length=8, att_feat_size=feat,
                                         dropout=dropout, drop_prob_lm=dropout, **{**SIZES, **kw}))


def inputs(B=3, R=5, n=4, L=6, vocab=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    att = torch.randn(B, R, 7, generator=g)
    mask = torch.ones(B, R)
    mask[0, 3:] = 0
    mask[2, 4:] = 0
    seqs = torch.randint(1, vocab + 1, (B, n, L), generator=g)
    seqs[0, 0, 3:] = 0
    seqs[1, 2, 1:] = 0
    return att, mask, seqs


# -- the parts, by hand -------------------------------------------------------------------------

@pytest.mark.unit
def test_layer_norm_is_the_peers_unbiased_std_plus_eps():
    ln = LayerNorm(4, eps=0.5)
    with torch.no_grad():
        ln.weight.copy_(torch.tensor([1.0, 2.0, 1.0, 1.0]))
        ln.bias.fill_(0.25)
    x = torch.tensor([[1.0, 2.0, 3.0, 6.0]])  # mean 3, unbiased var (4+1+0+9)/3 = 14/3
    std = math.sqrt(14 / 3)
    want = torch.tensor([[-2 / (std + 0.5), 2 * -1 / (std + 0.5), 0.0, 3 / (std + 0.5)]]) + 0.25
    assert torch.allclose(ln(x), want, atol=1e-6)
    # not nn.LayerNorm's (x − mean) / √(biased var + eps)
    assert (ln(x) - torch.nn.functional.layer_norm(x, (4,), ln.weight, ln.bias, eps=0.5)).abs().max() > 0.05


@pytest.mark.unit
def test_positional_encoding_values():
    pe = positional_encoding(0, 3, 6)
    assert torch.equal(pe[0], torch.tensor([0.0, 1, 0, 1, 0, 1]))
    for t in (1, 2):
        for i in range(3):
            angle = t / 10000 ** (2 * i / 6)
            assert pe[t, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[t, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert torch.equal(positional_encoding(2, 1, 6)[0], pe[2])  # a step's position


@pytest.mark.unit
def test_causal_mask():
    assert torch.equal(causal_mask(3, 3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    assert torch.equal(causal_mask(2, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool())
    assert causal_mask(1, 5) is None


@pytest.mark.unit
def test_a_word_never_sees_later_words_nor_padded_regions():
    m = tiny().eval()
    att, mask, seqs = inputs()
    lp = m(att, seqs, mask)
    later = seqs.clone()
    later[:, :, 3] = 1 + later[:, :, 3] % 20  # outputs 0-3 read inputs 0-3 = BOS and words 0-2
    att2 = att.clone()
    att2[0, 3:] = 100.0  # image 0's padded regions
    lp2 = m(att2, later, mask)
    assert torch.allclose(lp[:, :4], lp2[:, :4], atol=1e-5)
    assert (lp[:, 4:] - lp2[:, 4:]).abs().max() > 1e-3


@pytest.mark.unit
def test_the_interface_and_the_registry():
    m = tiny()
    assert isinstance(m, CaptionModel) and not m.uses_fc and m.supports_fast
    spec = model_spec("transformer")
    cfg = spec.config("paper", vocab_size=9487, att_feat_size=2048, seq_length=16)
    assert (cfg.N_enc, cfg.N_dec, cfg.d_model, cfg.d_ff, cfg.num_att_heads, cfg.dropout) == (6, 6, 512, 2048, 8, 0.1)
    assert spec.config("small", vocab_size=9, att_feat_size=4, seq_length=5).d_model == 128
    with pytest.raises(ValueError, match="multiple"):
        Transformer(TransformerConfig(vocab_size=5, d_model=30, num_att_heads=4))


# -- the key/value cache ---------------------------------------------------------------------------

@pytest.mark.unit
def test_cached_steps_equal_the_full_prefix_pass():
    m = tiny().eval()
    att, mask, seqs = inputs()
    full = m(att, seqs, mask)
    assert full.shape == (12, 7, 21)
    assert torch.allclose(stepwise_logprobs(m, att, seqs, mask), full, atol=1e-5, rtol=0)
    tok, on = m.token_logprobs(att, seqs, mask)
    want, want_on = sequence_logprobs(full, seqs)
    assert torch.equal(on, want_on) and torch.allclose(tok, want, atol=1e-5, rtol=0)


@pytest.mark.unit
def test_token_logprobs_gradients_equal_the_full_pass():
    att, mask, seqs = inputs()
    grads = []
    for fast in (True, False):
        m = tiny().eval()
        tok, on = m.token_logprobs(att, seqs, mask) if fast else sequence_logprobs(m(att, seqs, mask), seqs)
        (-tok.sum() / on.sum()).backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert torch.allclose(*grads, atol=1e-6)


@pytest.mark.unit
def test_the_state_is_a_cache_of_rows_and_the_memory_is_shared():
    m = tiny().eval()
    att, mask, _ = inputs()
    enc = m.encode(att, mask)
    wide = m.expand(enc, 4)
    assert wide.per_image == 4 and wide.keys[0] is enc.keys[0]  # not copied
    assert enc.keys[0].shape == (3, 4, 5, 8)  # (B, h, R, d_k)
    state = m.init_state(12)
    assert len(state) == 4 and state[0].shape == (12, 4, 0, 8)
    it = torch.zeros(12, dtype=torch.long)
    for t in range(3):
        lp, state = m.step(it, wide, state)
        it = lp.argmax(-1)
    assert all(s.shape == (12, 4, 3, 8) for s in state)
    # rows reordered within their image, as beam search does: a row's next step reads its own cache
    order = torch.tensor([1, 1, 0, 3, 7, 4, 5, 6, 8, 8, 8, 11])
    lp_sel, _ = m.step(it[order], wide, select_rows(state, order))
    assert torch.allclose(lp_sel, m.step(it, wide, state)[0][order], atol=1e-6)


# -- dropout drawn in advance ----------------------------------------------------------------------

@pytest.mark.unit
def test_teacher_forcing_with_the_masks_gives_the_sampling_log_probs():
    m = tiny(dropout=0.3).train()
    att, mask, _ = inputs()
    drop = m.draw_dropout(3, 12, 9, 5, generator=torch.Generator().manual_seed(3))
    assert drop.embed.dtype == torch.bool and drop.self_attn.shape == (12, 9, 2, 4, 9)
    assert drop.src_attn.shape == (12, 9, 2, 4, 5) and drop.sub.shape == (12, 9, 2, 3, 32)
    dec = decode(m, att, DecodeConfig(method="random", n=4, max_len=8), att_mask=mask,
                 generator=torch.Generator().manual_seed(4), drop=drop)
    tok, on = m.token_logprobs(att, dec.tokens, mask, drop=drop)
    drawn = dec.logprobs.reshape(tok.shape)
    assert on.sum() > 30
    assert torch.allclose(tok, drawn, atol=1e-5, rtol=0)
    fresh, _ = m.token_logprobs(att, dec.tokens, mask)
    assert (fresh - drawn).abs().max() > 0.1  # the masks matter


@pytest.mark.unit
def test_the_replay_holds_under_bf16_autocast():
    """Sampling and its replay in the same precision (as the RL step runs them): the same log-probs,
    float32, and bf16's own (not the fp32 ones)."""
    m = tiny(dropout=0.3).train()
    att, mask, _ = inputs()
    drop = m.draw_dropout(3, 12, 9, 5, generator=torch.Generator().manual_seed(3))
    with autocast("bf16", "cpu"):
        dec = decode(m, att, DecodeConfig(method="random", n=4, max_len=8), att_mask=mask,
                     generator=torch.Generator().manual_seed(4), drop=drop)
        tok, on = m.token_logprobs(att, dec.tokens, mask, drop=drop)
    drawn, on = dec.logprobs.reshape(tok.shape), on.bool()
    assert tok.dtype == torch.float32 and torch.allclose(tok[on], drawn[on], atol=1e-5, rtol=0)
    fp32, _ = m.token_logprobs(att, dec.tokens, mask, drop=drop)
    assert 1e-4 < (fp32[on] - drawn[on]).abs().max() < 0.5


@pytest.mark.unit
def test_the_encoder_replays_its_dropout_from_the_seed():
    m = tiny(dropout=0.3).train()
    att, mask, _ = inputs()
    a, b = (m.draw_dropout(3, 3, 2, 5, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    k1, k2, k3 = (m.encode(att, mask, drop=d).keys[1] for d in (a, a, b))
    assert torch.equal(k1, k2) and (k1 - k3).abs().max() > 1e-2
    eval_keys = m.eval().encode(att, mask).keys[1]
    assert (k1 - eval_keys).abs().max() > 1e-2  # dropout was on


# -- self-critical.pytorch's own TransformerModel ----------------------------------------------------

@pytest.fixture(scope="module")
def peer_modules():
    mods = helpers.peer_modules()
    return peer_loader, mods


@pytest.fixture(scope="module")
def trained():
    """A briefly trained model: peaked, captions of 2-5 words (ties would make decoding fragile)."""
    m = tiny(seed=5)
    g = torch.Generator().manual_seed(6)
    att = torch.randn(6, 5, 7, generator=g)
    seqs = torch.randint(1, 21, (6, 2, 5), generator=g)
    lengths = torch.randint(2, 6, (6, 2), generator=g)
    seqs *= torch.arange(5) < lengths.unsqueeze(-1)
    fit_captions(m, att, seqs, steps=60, lr=3e-3)
    mask = torch.ones(6, 5)
    mask[1, 3:] = 0
    return m.eval(), att, mask


@pytest.mark.unit
def test_teacher_forced_log_probs_equal_the_peers(peer_modules):
    pt, mods = peer_modules
    m = tiny().eval()
    peer = pt.build(mods, m).eval()
    att, mask, seqs = inputs()
    ours = m(att, seqs, mask)
    theirs = peer(torch.zeros(3, 7), att, pt.peer_labels(seqs.reshape(12, -1)), mask)
    tok, on = sequence_logprobs(ours, seqs)
    assert torch.allclose(tok, sequence_logprobs(theirs, seqs)[0], atol=1e-5, rtol=0)
    every = (ours - theirs).abs().amax(-1)  # every word's log-prob, where the outputs count
    assert float((every * on).max().detach()) < 1e-5


@pytest.mark.unit
def test_greedy_and_beam_captions_equal_the_peers(peer_modules, trained):
    pt, mods = peer_modules
    m, att, mask = trained
    peer = pt.build(mods, m, max_length=8).eval()
    for cfg, opt in ((DecodeConfig(method="greedy", max_len=8), dict(sample_method="greedy")),
                     (DecodeConfig(method="beam", beam=3, max_len=8), dict(beam_size=3, sample_n=1))):
        ours = decode(m, att, cfg, att_mask=mask).tokens[:, 0]
        with torch.no_grad():
            theirs, _ = peer(torch.zeros(6, 7), att, mask, opt=opt, mode="sample")
        assert (ours > 0).sum(1).min() >= 1  # real captions, not the empty one
        assert torch.equal(torch.nn.functional.pad(ours, (0, 8 - ours.shape[1])), theirs), cfg.method


# -- through the stages ----------------------------------------------------------------------------

@pytest.mark.integration
def test_xe_rl_decoding_and_checkpoint_end_to_end(tmp_path):
    data = DataArtifact.open(write_tiny_data(tmp_path / "tiny", n_train=12, n_val=4))
    model = model_spec("transformer").build("small", vocab_size=data.vocab_size, att_feat_size=data.att_dim,
                                            seq_length=data.seq_length, d_model=32, d_ff=64)
    batches = [b.to("cpu") for b in CaptionBatches(data, "train", batch_size=6, seq_per_img=5, seed=0).epoch(0)]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    losses = []
    for _ in range(8):  # XE
        for batch in batches:
            loss = xe_loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    step = RewardStep(data=data, cider=TrainCider.for_data(data), reward="xe-cider", m=3, max_len=8)
    loss, logs = step(model, batches[0])  # RL: on-policy sampling with the model's masks
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())
    save_checkpoint(tmp_path / "m.pt", model, data.words)
    back, vocab, _ = load_model(tmp_path / "m.pt", "cpu")
    assert type(back) is Transformer and back.config == model.config and vocab == data.words
    att = batches[0].att
    a, b = (decode(x.eval(), att, DecodeConfig(method="beam", beam=3, n=2, max_len=8)) for x in (model, back))
    assert torch.equal(a.tokens, b.tokens) and a.tokens.shape[:2] == (att.shape[0], 2)
