"""UpDown (rdpp_cli/models/updown.py): a literal step of the peer's equations, teacher forcing against
step-by-step decoding, rows sharing their image, on-policy replay of sampling dropout, the XE and RL
steps on the tiny data, and equality with self-critical.pytorch's own ``UpDownModel`` (skipped
where its checkout or its yacs/six imports are absent)."""

from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F
import peer_loader
from helpers import assert_decodes_like_the_peer, peer_modules, write_tiny_data

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches
from rdpp_cli.decoding.decode import DecodeConfig, decode
from rdpp_cli.metrics.train_cider import TrainCider
from rdpp_cli.models.base import CaptionModel, select_rows, sequence_logprobs, stepwise_logprobs
from rdpp_cli.models.checkpoint import load_model, save_checkpoint
from rdpp_cli.models.registry import model_spec
from rdpp_cli.models.updown import UpDown, UpDownConfig
from rdpp_cli.training.finetune import RewardStep
from rdpp_cli.training.xe import xe_loss

pytestmark = pytest.mark.usefixtures("one_thread")



def tiny_updown(vocab: int = 15, feat: int = 16, fc: int = 16, size: int = 24, dropout: float = 0.0,
                seed: int = 0) -> UpDown:
    torch.manual_seed(seed)
    return UpDown(UpDownConfig(vocab_size=vocab, input_encoding_size=size + 4, rnn_size=size, att_hid_size=size - 4,
                               att_feat_size=feat, fc_feat_size=fc, drop_prob_lm=dropout, seq_length=8))


def random_inputs(B=3, n=2, R=5, L=6, feat=16, fc=16, vocab=15, seed=0):
    g = torch.Generator().manual_seed(seed)
    att, fcs = torch.randn(B, R, feat, generator=g), torch.randn(B, fc, generator=g)
    seqs = torch.randint(1, vocab + 1, (B, n, L), generator=g)
    seqs[0, 0, 3:] = 0
    seqs[1, n - 1, 1:] = 0
    mask = torch.ones(B, R)
    mask[1, 3:] = 0
    return att, fcs, seqs, mask


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return DataArtifact.open(write_tiny_data(tmp_path_factory.mktemp("tiny") / "tiny", n_train=12, n_val=4))


@pytest.fixture(scope="module")
def trained(tiny):
    """A small UpDown after 30 Adam steps on the 12 training images (peaked, not flat, log-probs)."""
    model = tiny_updown(tiny.vocab_size, tiny.att_dim, tiny.att_dim, size=32)
    fc, att, _ = tiny.features(np.arange(12))
    labels = torch.from_numpy(tiny.captions_per_image(np.arange(12), 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):
        tok, mask = model.token_logprobs(att, labels, fc=fc)
        loss = -tok.sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 1.5  # from ~2.7: it learned something
    return model.eval(), att, fc


# -- its own parts ------------------------------------------------------------------------------------

def literal_step(m: UpDown, it, fc, att, att_mask, state):
    """The peer's UpDownCore step written out: nn.LSTMCell modules on concatenated inputs, the
    attention with a literal tanh, the (2, N, H) state of self-critical.pytorch unpacked."""
    h1, c1, h2, c2 = state
    x = F.relu(m.embed(it))
    v = F.relu(m.fc_embed(fc))
    a = F.relu(m.att_embed(att))
    h1, c1 = m.att_lstm(torch.cat([h2, v, x], 1), (h1, c1))
    e = m.alpha_net(torch.tanh(m.ctx2att(a) + m.h2att(h1).unsqueeze(1))).squeeze(-1)
    w = F.softmax(e, 1)
    if att_mask is not None:
        w = w * att_mask
        w = w / w.sum(1, keepdim=True)
    z = torch.bmm(w.unsqueeze(1), a).squeeze(1)
    h2, c2 = m.lang_lstm(torch.cat([z, h1], 1), (h2, c2))
    return F.log_softmax(m.logit(h2), 1), (h1, c1, h2, c2)


@pytest.mark.unit
def test_steps_equal_the_literal_equations():
    m = tiny_updown().eval()
    att, fc, seqs, mask = random_inputs(n=1)
    assert isinstance(m, CaptionModel) and m.uses_fc and m.supports_fast
    for am in (None, mask):
        enc = m.encode(att, am, fc=fc)
        state = ref = m.init_state(3)
        assert len(state) == 4 and all(s.shape == (3, 24) for s in state)  # the row first, as beam search needs
        for t in range(4):
            it = seqs[:, 0, t - 1] if t else torch.zeros(3, dtype=torch.long)
            lp, state = m.step(it, enc, state)
            lp_ref, ref = literal_step(m, it, fc, att, am, ref)
            assert (lp - lp_ref).abs().max() < 1e-5
            assert all((s - r).abs().max() < 1e-5 for s, r in zip(state, ref))
        if am is not None:  # a padded region's features change nothing
            att2 = att.clone()
            att2[1, 3:] = 100.0
            assert torch.allclose(m(att2, seqs, am, fc=fc), m(att, seqs, am, fc=fc), atol=1e-6)


@pytest.mark.unit
def test_teacher_forcing_equals_stepwise_decoding_and_token_logprobs():
    m = tiny_updown().eval()
    att, fc, seqs, mask = random_inputs()
    for am in (None, mask):
        lp = m(att, seqs, am, fc=fc)
        assert lp.shape == (6, 7, 16)
        assert (stepwise_logprobs(m, att, seqs, am, fc=fc) - lp).abs().max() < 1e-5
        tok, tmask = m.token_logprobs(att, seqs, am, fc=fc)
        ref_tok, ref_mask = sequence_logprobs(lp, seqs)
        assert torch.equal(tmask, ref_mask) and (tok - ref_tok).abs().max() < 1e-5
        assert tmask.sum() == 6 * 7 - 3 - 5  # the words, one EOS each, no padding
    # gradients too
    m.zero_grad()
    m.token_logprobs(att, seqs, mask, fc=fc)[0].sum().backward()
    g = {k: p.grad.clone() for k, p in m.named_parameters()}
    m.zero_grad()
    sequence_logprobs(m(att, seqs, mask, fc=fc), seqs)[0].sum().backward()
    for k, p in m.named_parameters():
        assert torch.allclose(g[k], p.grad, atol=1e-5, rtol=1e-4), k


@pytest.mark.unit
def test_rows_share_their_image_without_a_copy():
    m = tiny_updown().eval()
    att, fc, seqs, _ = random_inputs()
    enc = m.encode(att, fc=fc)
    wide = m.expand(enc, 2)
    assert wide.att is enc.att and wide.keys is enc.keys and wide.fc_gates is enc.fc_gates and wide.per_image == 2
    # two rows per image give the numbers of each image repeated
    rep = lambda x: x.repeat_interleave(2, 0)  # noqa: E731
    flat = seqs.reshape(6, -1)
    a = m(att, flat, fc=fc)
    b = m(rep(att), flat, fc=rep(fc))
    assert (a - b).abs().max() < 1e-5


@pytest.mark.unit
def test_beam_search_reorders_every_part_of_the_state():
    m = tiny_updown().eval()
    att, fc, _, _ = random_inputs()
    enc = m.expand(m.encode(att, fc=fc), 2)
    _, state = m.step(torch.arange(1, 7), enc, m.init_state(6))
    rows = torch.tensor([1, 1, 2, 3, 5, 4])
    moved = select_rows(state, rows)
    assert all(torch.equal(s[rows], t) for s, t in zip(state, moved))


@pytest.mark.unit
def test_registry_presets_and_missing_fc():
    spec = model_spec("updown")
    assert spec.cls is UpDown and spec.config_cls is UpDownConfig and spec.class_name == "UpDown"
    paper = spec.config("paper", vocab_size=9487, att_feat_size=2048, fc_feat_size=2048, seq_length=16)
    assert (paper.rnn_size, paper.input_encoding_size, paper.att_hid_size, paper.drop_prob_lm) == (1000, 1000, 512, 0.5)
    small = spec.build("small", vocab_size=15, att_feat_size=16, fc_feat_size=8, seq_length=8)
    assert small.config.rnn_size == 256 and small.fc_embed.in_features == 8
    with pytest.raises(ValueError, match="fc"):
        small.encode(torch.zeros(1, 4, 16))


@pytest.mark.unit
def test_checkpoint_roundtrip(tmp_path):
    m = tiny_updown(fc=8).eval()
    save_checkpoint(tmp_path / "best.pt", m, [f"w{i}" for i in range(15)])
    back, vocab, ckpt = load_model(tmp_path / "best.pt")
    assert type(back) is UpDown and ckpt["model"] == "updown" and back.config == m.config and len(vocab) == 15
    att, fc, seqs, _ = random_inputs(fc=8)
    assert torch.equal(back(att, seqs, fc=fc), m(att, seqs, fc=fc))


# -- on-policy RL: the teacher-forced pass replays the sampling pass's dropout ----------------------------

@pytest.mark.unit
def test_replayed_dropout_gives_the_sampled_log_probs(tiny):
    model = tiny_updown(tiny.vocab_size, tiny.att_dim, tiny.att_dim, dropout=0.5).train()
    fc, att, mask = tiny.features(np.arange(6))
    gen = torch.Generator().manual_seed(3)
    drop = model.draw_dropout(6, 24, 9, att.shape[1], generator=gen)
    assert drop.att.shape == (6, 16, 24) and drop.fc.shape == (6, 24)
    assert drop.embed.shape == (24, 9, 28) and drop.out.shape == (24, 9, 24)
    dec = decode(model, att, DecodeConfig(method="random", n=4, max_len=8), att_mask=mask, generator=gen, drop=drop,
                 fc=fc)
    tok, tmask = model.token_logprobs(att, dec.tokens, mask, drop=drop, fc=fc)
    drawn = dec.logprobs.reshape(tok.shape)
    on = tmask.bool()
    assert on.sum() > 60
    assert (tok[on] - drawn[on]).abs().max() < 1e-5
    fresh, _ = model.token_logprobs(att, dec.tokens, mask, fc=fc)  # other dropout: other numbers
    assert (fresh[on] - drawn[on]).abs().max() > 0.1


# -- the XE and RL steps on the tiny data ------------------------------------------------------------

@pytest.mark.integration
def test_xe_and_rl_steps_run_on_the_tiny_data(tiny):
    torch.manual_seed(0)
    model = model_spec("updown").build("small", vocab_size=tiny.vocab_size, att_feat_size=tiny.att_dim,
                                       fc_feat_size=tiny.att_dim, seq_length=tiny.seq_length,
                                       rnn_size=32, input_encoding_size=32, att_hid_size=32).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = CaptionBatches(tiny, "train", batch_size=6, seq_per_img=5, seed=0)
    losses = []
    for epoch in range(10):
        for batch in batches.epoch(epoch):
            loss = xe_loss(model, batch.to("cpu"))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]  # 20 steps with dropout 0.3
    step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward="dpp", m=3, max_len=8)
    batch = next(iter(CaptionBatches(tiny, "train", batch_size=4, seq_per_img=1, seed=0).epoch(0))).to("cpu")
    d = step.draw(model, batch)
    token_logp, mask = step.policy_logprobs(model, batch, d)
    on = mask.bool()
    assert (token_logp[on] - d.logprobs.reshape(token_logp.shape)[on]).abs().max() < 1e-5  # on-policy
    w, _ = step.weights(d.samples.numpy(), d.greedy, tiny.references_ids(batch.index))
    loss, _ = step.loss(model, batch, d, w)
    opt.zero_grad()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# -- equal to self-critical.pytorch's own UpDownModel ---------------------------------------------------

@pytest.fixture(scope="module")
def peer_updown():
    """The peer's UpDownModel with an rdpp UpDown's weights (tests/peer_loader.py), or a skip saying what is
    missing."""
    mods = peer_modules()
    return lambda model: peer_loader.build(mods, model).eval()


@pytest.mark.integration
def test_teacher_forced_log_probs_equal_the_peers(peer_updown):
    m = tiny_updown().eval()
    ref = peer_updown(m)
    att, fc, seqs, mask = random_inputs()
    bos = torch.cat([seqs.new_zeros(3, 2, 1), seqs], 2)  # the peer's labels carry a BOS column
    for am in (None, mask):
        with torch.no_grad():
            ours, _ = sequence_logprobs(m(att, seqs, am, fc=fc), seqs)
            theirs, tmask = sequence_logprobs(ref(fc, att, bos, am), seqs)
        assert tmask.sum() == 34 and (ours - theirs).abs().max() < 1e-5


@pytest.mark.integration
def test_greedy_and_beam_captions_equal_the_peers(trained, peer_updown):
    model, att, fc = trained
    assert_decodes_like_the_peer(model, peer_updown(model), att, fc)
