"""Att2in: shapes, the math against a literal step-by-step reference, masking, overfitting, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rdpp_cli.errors import RdppError
from rdpp_cli.models.att2in import Att2in
from rdpp_cli.models.registry import build
from rdpp_cli.models import (
    load_checkpoint,
    load_model,
    save_checkpoint,
    sequence_logprobs,
)
from helpers import fit_captions


pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("one_thread")]


def tiny(vocab=12, seed=0, dropout=0.0, **kw):
    torch.manual_seed(seed)
    kw = dict(dict(input_encoding_size=8, rnn_size=16, att_hid_size=10, drop_prob_lm=dropout), **kw)
    return build("att2in", "small", vocab_size=vocab, att_feat_size=7, seq_length=5, **kw)


def reference_logprobs(m: Att2in, att, seqs, att_mask=None):
    """self-critical.pytorch's Att2in2 written out literally: features repeated per caption,
    one step at a time, output layer inside the loop."""
    B, n, L = seqs.shape
    H = m.config.rnn_size
    a = F.relu(m.att_embed(att)).repeat_interleave(n, 0)
    p = m.ctx2att(a)
    mask = None if att_mask is None else att_mask.repeat_interleave(n, 0)
    s = seqs.reshape(B * n, L)
    h = torch.zeros(B * n, H)
    c = torch.zeros(B * n, H)
    out = []
    for t in range(L + 1):
        it = torch.zeros(B * n, dtype=torch.long) if t == 0 else s[:, t - 1]
        xt = F.relu(m.embed(it))
        dot = m.alpha_net(torch.tanh(p + m.h2att(h).unsqueeze(1))).squeeze(2)
        w = F.softmax(dot, 1)
        if mask is not None:
            w = w * mask
            w = w / w.sum(1, keepdim=True)
        att_res = torch.bmm(w.unsqueeze(1), a).squeeze(1)
        sums = m.i2h(xt) + m.h2h(h)
        sig = torch.sigmoid(sums[:, :3 * H])
        ig, fg, og = sig[:, :H], sig[:, H:2 * H], sig[:, 2 * H:]
        it_ = sums[:, 3 * H:] + m.a2c(att_res)
        it_ = torch.max(it_[:, :H], it_[:, H:])
        c = fg * c + ig * it_
        h = og * torch.tanh(c)
        out.append(F.log_softmax(m.logit(h), 1))
    return torch.stack(out, 1)


def test_forward_shapes_and_reference_math():
    m = tiny().eval()
    att = torch.randn(3, 5, 7)
    seqs = torch.randint(1, 13, (3, 4, 5))
    seqs[0, 0, 3:] = 0
    lp = m(att, seqs)
    assert lp.shape == (12, 6, 13)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(12, 6), atol=1e-5)
    assert torch.allclose(lp, reference_logprobs(m, att, seqs), atol=1e-5)
    # (B*n, L) input is the same as (B, n, L)
    assert torch.equal(lp, m(att, seqs.reshape(12, 5)))


def test_att_mask_ignores_padded_regions():
    m = tiny().eval()
    att = torch.randn(2, 5, 7)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    seqs = torch.randint(1, 13, (2, 2, 5))
    lp = m(att, seqs, att_mask=mask)
    assert torch.allclose(lp, reference_logprobs(m, att, seqs, mask), atol=1e-5)
    # changing the padded regions changes nothing
    att2 = att.clone()
    att2[0, 3:] = 100.0
    assert torch.allclose(lp, m(att2, seqs, att_mask=mask), atol=1e-6)
    # image 0 with only its 3 real regions gives the same log-probs
    lp3 = m(att[:1, :3], seqs[:1])
    assert torch.allclose(lp[:2], lp3, atol=1e-5)


def test_step_equals_teacher_forcing():
    m = tiny().eval()
    att = torch.randn(2, 5, 7)
    seqs = torch.randint(1, 13, (2, 3, 5))
    lp = m(att, seqs)
    enc = m.expand(m.encode(att), 3)
    state = m.init_state(6)
    it = torch.zeros(6, dtype=torch.long)
    s = seqs.reshape(6, 5)
    for t in range(6):
        out, state = m.step(it, enc, state)
        assert torch.allclose(out, lp[:, t], atol=1e-5)
        if t < 5:
            it = s[:, t]


def test_gradients_equal_those_of_the_literal_reference():
    # (the kernels' own gradients: tests/test_ops.py)
    m = tiny().train()
    att = torch.randn(2, 5, 7)
    seqs = torch.randint(1, 13, (2, 3, 5))
    m(att, seqs).sum().backward()
    g1 = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    m.eval()
    reference_logprobs(m, att, seqs).sum().backward()
    for n, p in m.named_parameters():
        assert torch.allclose(g1[n], p.grad, atol=1e-4), n


def test_sequence_logprobs_masks_after_first_eos():
    # vocab 3 (logits over 4); hand-set log-probs: value at [i, t, w] = -(10 t + w) / 100
    N, L, V1 = 3, 4, 4
    t = torch.arange(L + 1).view(1, -1, 1).float()
    w = torch.arange(V1).view(1, 1, -1).float()
    lp = (-(10 * t + w) / 100).expand(N, L + 1, V1).contiguous()
    seqs = torch.tensor([[2, 3, 0, 0],   # 2 words, EOS at t=2, padding after
                         [1, 1, 1, 1],   # full length: EOS at t=4
                         [0, 0, 0, 0]])  # empty: EOS at t=0
    tok, mask = sequence_logprobs(lp, seqs)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert tok[0].tolist() == pytest.approx([-0.02, -0.13, -0.20, 0, 0])
    assert tok[1].tolist() == pytest.approx([-0.01, -0.11, -0.21, -0.31, -0.40])
    assert tok[2].tolist() == pytest.approx([0.0, 0, 0, 0, 0])
    # EOS counted once: the number of counted tokens is words + 1
    assert mask.sum(1).tolist() == [3, 5, 1]


def test_token_logprobs_equals_forward_then_sequence_logprobs():
    m = tiny().train()
    att = torch.randn(3, 5, 7)
    seqs = torch.randint(1, 13, (3, 2, 5))
    seqs[0, 0, 2:] = 0
    seqs[1, 1, 3:] = 0
    seqs[2, :, 4:] = 0
    m.eval()  # same values (no dropout)
    a, ma = sequence_logprobs(m(att, seqs), seqs)
    b, mb = m.token_logprobs(att, seqs)
    assert torch.equal(ma, mb) and torch.allclose(a, b, atol=1e-6)
    # same gradients
    a.sum().backward()
    g1 = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    m.token_logprobs(att, seqs)[0].sum().backward()
    for n, p in m.named_parameters():
        assert torch.allclose(g1[n], p.grad, atol=1e-5), n
    # all captions short: the LSTM runs only as long as needed, the numbers do not change
    short = seqs.clone()
    short[..., 2:] = 0
    a, _ = sequence_logprobs(m(att, short), short)
    b, _ = m.token_logprobs(att, short)
    assert torch.allclose(a, b, atol=1e-6) and (b[:, 3:] == 0).all()


def test_tiny_model_overfits_four_images():
    torch.manual_seed(0)
    m = tiny(vocab=10, rnn_size=32, att_hid_size=16, input_encoding_size=16)
    att = torch.randn(4, 3, 7)
    seqs = torch.tensor([[3, 4, 5, 0, 0], [6, 2, 0, 0, 0], [7, 7, 8, 9, 1], [2, 0, 0, 0, 0]]).view(4, 1, 5)
    loss = fit_captions(m, att, seqs, steps=300)
    assert loss.item() < 0.01
    # and greedy decoding by steps reproduces the captions
    m.eval()
    enc, state = m.encode(att), m.init_state(4)
    it = torch.zeros(4, dtype=torch.long)
    got = []
    for _ in range(6):
        lp, state = m.step(it, enc, state)
        it = lp.argmax(1)
        got.append(it)
    got = torch.stack(got, 1)
    for i in range(4):
        words = seqs[i, 0][seqs[i, 0] > 0].tolist()
        assert got[i, :len(words) + 1].tolist() == words + [0]


def test_checkpoint_roundtrip_and_errors(tmp_path):
    m = tiny()
    vocab = [f"w{i}" for i in range(12)]
    save_checkpoint(tmp_path / "ck" / "best.pt", m, vocab, epoch=3, val_cider=1.25)
    ck = torch.load(tmp_path / "ck" / "best.pt", weights_only=True)
    assert ck["model_class"] == "Att2in" and ck["epoch"] == 3 and ck["vocab"] == vocab
    assert ck["model_config"]["rnn_size"] == 16
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["best.pt"]  # no temp file left
    m2, v2, raw = load_model(tmp_path / "ck" / "best.pt")
    assert not m2.training and v2 == vocab and raw["val_cider"] == 1.25
    for k, v in m.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k])
    with pytest.raises(RdppError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    with pytest.raises(RdppError, match="corrupt"):
        load_model(bad)
    with pytest.raises(ValueError, match="vocab"):
        save_checkpoint(tmp_path / "x.pt", m, vocab[:5])
    assert math.isclose(sum(p.numel() for p in m2.parameters()), sum(p.numel() for p in m.parameters()))


def test_an_older_checkpoint_recording_fc_feat_size_still_loads(tmp_path):
    """Checkpoints written before Att2inConfig lost ``fc_feat_size`` (the model never read fc) carry
    it in ``model_config``: it is dropped, and the model gives the saved model's numbers."""
    m = tiny().eval()
    save_checkpoint(tmp_path / "new.pt", m, [f"w{i}" for i in range(12)])
    old = torch.load(tmp_path / "new.pt", weights_only=True)
    old["model_config"] = {**old["model_config"], "fc_feat_size": 6}
    torch.save(old, tmp_path / "old.pt")
    m2, _, raw = load_model(tmp_path / "old.pt")
    assert raw["model_config"]["fc_feat_size"] == 6 and not hasattr(m2.config, "fc_feat_size")
    att, seqs = torch.randn(2, 5, 7), torch.randint(1, 13, (2, 3, 5))
    assert torch.equal(m2(att, seqs), m(att, seqs))


def test_a_checkpoint_of_another_model_class_is_refused_in_one_line(tmp_path):
    save_checkpoint(tmp_path / "m.pt", tiny(), [f"w{i}" for i in range(12)])
    ck = torch.load(tmp_path / "m.pt", weights_only=True)
    torch.save({**ck, "model_class": "ShowTell"}, tmp_path / "t.pt")
    with pytest.raises(RdppError) as e:
        load_model(tmp_path / "t.pt")
    assert str(e.value).startswith(f"{tmp_path / 't.pt'}: unknown model class 'ShowTell'; this rdpp knows Att2in")
