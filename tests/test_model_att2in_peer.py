"""Att2in equal to self-critical.pytorch's own ``Att2in2Model`` (the model the R-DPP authors train):
the same weights give the same teacher-forced log-probs and the same greedy and beam-3 captions, as
tests/test_model_updown.py and tests/test_model_transformer.py check for the other two models.
Skipped where the peer's checkout (or its yacs/six imports) is absent."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.models.base import sequence_logprobs

import peer_loader
from helpers import assert_decodes_like_the_peer, peer_modules, write_tiny_data

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

def tiny_att2in(vocab: int = 15, feat: int = 16, size: int = 24, seed: int = 0) -> Att2in:
    torch.manual_seed(seed)
    return Att2in(Att2inConfig(vocab_size=vocab, input_encoding_size=size + 4, rnn_size=size, att_hid_size=size - 4,
                               att_feat_size=feat, drop_prob_lm=0.0, seq_length=8))


@pytest.fixture(scope="module")
def peer_att2in():
    """The peer's Att2in2Model with an rdpp Att2in's weights (tests/peer_loader.py), or a skip."""
    mods = peer_modules()
    return lambda model: peer_loader.build(mods, model).eval()


def test_teacher_forced_log_probs_equal_the_peers(peer_att2in):
    m = tiny_att2in().eval()
    ref = peer_att2in(m)
    g = torch.Generator().manual_seed(0)
    att, fc = torch.randn(3, 5, 16, generator=g), torch.randn(3, 16, generator=g)
    seqs = torch.randint(1, 16, (3, 2, 6), generator=g)
    seqs[0, 0, 3:] = 0
    seqs[1, 1, 1:] = 0
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    bos = torch.cat([seqs.new_zeros(3, 2, 1), seqs], 2)  # the peer's labels carry a BOS column
    for am in (None, mask):
        with torch.no_grad():
            ours, _ = sequence_logprobs(m(att, seqs, am), seqs)
            theirs, tmask = sequence_logprobs(ref(fc, att, bos, am), seqs)
        assert tmask.sum() == 34 and (ours - theirs).abs().max() < 1e-5


def test_greedy_and_beam_captions_equal_the_peers(tmp_path, peer_att2in):
    tiny = DataArtifact.open(write_tiny_data(tmp_path / "tiny", n_train=12, n_val=4))
    model = tiny_att2in(tiny.vocab_size, tiny.att_dim, size=32)
    fc, att, _ = tiny.features(np.arange(12))
    labels = torch.from_numpy(tiny.captions_per_image(np.arange(12), 5))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(30):  # peaked log-probs, not flat ones
        tok, mask = model.token_logprobs(att, labels)
        loss = -tok.sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert_decodes_like_the_peer(model, peer_att2in(model), att, fc)
