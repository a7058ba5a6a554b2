"""Decoding: every method against greedy / each other on small seeded models, and hand-set cases."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from rdpp_cli.decoding.decode import DecodeConfig, decode
from rdpp_cli.models import save_checkpoint, sequence_logprobs
from rdpp_cli.models.registry import build

from helpers import fit_captions

V = 15


def model(seed=0, scale=1.0):
    """A small random Att2in; ``scale`` multiplies the output layer (peakier distributions)."""
    torch.manual_seed(seed)
    m = build("att2in", "small", vocab_size=V, att_feat_size=6, seq_length=8, rnn_size=24, input_encoding_size=12,
              att_hid_size=12, drop_prob_lm=0.0).eval()
    with torch.no_grad():
        m.logit.weight.mul_(scale)
        m.logit.bias.mul_(scale)
        m.logit.bias[0] -= 1.0  # EOS a bit less likely, so captions have a few words
    return m


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def feats():
    g = torch.Generator().manual_seed(1)
    return torch.randn(12, 5, 6, generator=g)


# A trained toy captioner: 18 images (colour × shape × size), 5 differently worded references each,
# so it has realistic peaked distributions, EOS, and several good captions per image.
WORDS = "a there is that red green blue circle square star small big".split()


def _toy_data():
    g = torch.Generator().manual_seed(0)
    proto = torch.randn(8, 6, generator=g)
    imgs = [(c, s, z) for c in range(3) for s in range(3) for z in range(2)]
    att = torch.zeros(len(imgs), 4, 6)
    seqs = torch.zeros(len(imgs), 5, 7, dtype=torch.long)
    for i, (c, s, z) in enumerate(imgs):
        att[i, 0], att[i, 1], att[i, 2] = proto[c], proto[3 + s], proto[6 + z]
        att[i, 3] = 0.1 * torch.randn(6, generator=g)
        C, S, Z = 5 + c, 8 + s, 11 + z  # word ids (1-based)
        for j, cap in enumerate(([1, C, S], [1, Z, C, S], [2, 3, 1, C, S], [1, S, 4, 3, C], [1, Z, S, 4, 3, C])):
            seqs[i, j, :len(cap)] = torch.tensor(cap)
    return att, seqs


@pytest.fixture(scope="module")
def toy():
    att, seqs = _toy_data()
    torch.manual_seed(0)
    m = build("att2in", "small", vocab_size=len(WORDS), att_feat_size=6, seq_length=7, rnn_size=32,
              input_encoding_size=16, att_hid_size=16, drop_prob_lm=0.0)
    loss = fit_captions(m, att, seqs, steps=150)
    assert loss.item() < 0.5  # close to the entropy of 5 equally likely wordings (log 5 / ~5 tokens)
    return m.eval(), att


def words(ids) -> str:
    return " ".join(WORDS[i - 1] for i in ids if i)


def run(m, att, gen_seed=0, **kw):
    return decode(m, att, DecodeConfig(**kw), generator=torch.Generator().manual_seed(gen_seed))


@pytest.mark.unit
def test_outputs_are_valid_sequences_of_the_model(feats):
    m = model(scale=3.0)
    for method in ("greedy", "random", "topk", "nucleus", "beam", "dbs"):
        d = run(m, feats, method=method, n=4, top_k=4, top_p=0.7, beam=4, groups=2, max_len=6)
        B, n, T = d.tokens.shape
        assert (B, n) == (12, 4) and 1 <= T <= 6 and d.logprobs.shape == (12, 4, T + 1)
        # tokens are 0 exactly from position `lengths` on
        pos = torch.arange(T)
        assert torch.equal(d.tokens > 0, pos < d.lengths.unsqueeze(-1)), method
        # the recorded log-probs are the model's: teacher forcing the tokens gives the same numbers
        tok, mask = sequence_logprobs(m(feats, d.tokens), d.tokens)
        assert torch.allclose(tok.view(B, n, T + 1), d.logprobs, atol=1e-5), method
        assert torch.equal(mask.view(B, n, T + 1).sum(-1), (d.lengths + 1).float()), method
        assert torch.allclose(d.seq_logprob, d.logprobs.sum(-1)), method


class StepTable:
    """A model for hand-computed cases: ``step`` (a fixed table in subclasses) ignores the image."""

    def encode(self, att, mask=None, fc=None, drop=None):
        return att

    def expand(self, enc, n):
        return enc.repeat_interleave(n, 0)

    def init_state(self, N):
        return torch.zeros(N, 1), torch.zeros(N, 1)


@pytest.mark.unit
def test_greedy_by_hand_and_max_len():
    """A model whose step is a fixed table: greedy must follow it; max_len forces the EOS."""

    class Table(StepTable):
        # next word = (it + 1) % 4 with prob 0.7, EOS only after word 3
        def step(self, it, enc, state, drop=None):
            lp = torch.full((it.shape[0], 5), 0.075).log()
            lp[torch.arange(it.shape[0]), (it + 1) % 4] = torch.tensor(0.7).log()
            return lp, state

    att = torch.zeros(2, 1, 1)
    d = decode(Table(), att, DecodeConfig(method="greedy", max_len=10))
    assert d.tokens[0, 0].tolist() == [1, 2, 3]
    assert d.lengths.tolist() == [[3], [3]]
    assert d.seq_logprob[0, 0].item() == pytest.approx(4 * torch.tensor(0.7).log().item(), rel=1e-6)
    d = decode(Table(), att, DecodeConfig(method="greedy", max_len=2))
    assert d.tokens[0, 0].tolist() == [1, 2]
    # the EOS forced after 2 words costs its own log-prob, log 0.075
    assert d.logprobs[0, 0].tolist() == pytest.approx([torch.tensor(x).log().item() for x in (0.7, 0.7, 0.075)])


@pytest.mark.unit
def test_beam_width_1_top_k_1_nucleus_p0_and_cold_temperature_equal_greedy(toy):
    m, feats = toy
    g = run(m, feats, method="greedy", max_len=8)
    refs = _toy_data()[1]
    for i in range(feats.shape[0]):  # the toy model learned its captions: greedy says one of them
        assert g.tokens[i, 0].tolist() + [0] * (7 - g.tokens.shape[-1]) in refs[i].tolist()
    for kw in (dict(method="beam", beam=1), dict(method="topk", top_k=1), dict(method="nucleus", top_p=1e-9),
               dict(method="random", temperature=1e-7), dict(method="dbs", beam=1, groups=1)):
        d = run(m, feats, max_len=8, **kw)
        assert torch.equal(d.tokens, g.tokens), kw
        assert torch.allclose(d.seq_logprob, g.seq_logprob), kw
    # n copies of greedy are the same caption
    g3 = run(m, feats, method="greedy", n=3, max_len=8)
    assert torch.equal(g3.tokens[:, 1], g.tokens[:, 0]) and torch.equal(g3.tokens[:, 2], g.tokens[:, 0])


def _pad(t, T=8):
    return torch.nn.functional.pad(t, (0, T - t.shape[-1]))


@pytest.mark.unit
def test_temperature_to_zero_approaches_greedy(toy):
    m, feats = toy
    g = run(m, feats, method="greedy", max_len=8)
    agree = []
    for temp in (2.0, 1.0, 0.3, 0.1, 1e-3, 1e-7):
        d = run(m, feats, method="random", n=20, temperature=temp, max_len=8)
        agree.append((_pad(d.tokens) == _pad(g.tokens)).all(-1).float().mean().item())
    # the toy model has near-ties (it learned 5 equally likely wordings), so only a very cold
    # temperature reproduces greedy on every image
    assert agree[0] < 0.2 and agree[1] < 0.4 and agree[-2] > 0.9 and agree[-1] == 1.0
    assert agree == sorted(agree)


@pytest.mark.unit
@pytest.mark.parametrize("which", ["toy", "random"])
def test_beam_best_is_at_least_greedy_on_every_image(which, toy, feats):
    m, feats = toy if which == "toy" else (model(seed=3, scale=1.5), feats)
    g = run(m, feats, method="greedy", max_len=8)
    for width in (2, 3, 5):
        b = run(m, feats, method="beam", beam=width, n=width, max_len=8)
        assert (b.seq_logprob[:, 0] >= g.seq_logprob[:, 0] - 1e-5).all(), width
        # beams come best first
        assert (b.seq_logprob[:, :-1] >= b.seq_logprob[:, 1:] - 1e-6).all()
    assert (b.seq_logprob[:, 0] > g.seq_logprob[:, 0] + 1e-3).any()  # and it does find better ones


@pytest.mark.unit
def test_beam_length_normalisation_prefers_longer_captions(toy):
    """On the trained toy captioner (short and long wordings of every image), ranking by
    log-prob / len**alpha (len counting the EOS) picks longer captions than plain log-prob."""
    m, att = toy
    plain = run(m, att, method="beam", beam=4, n=4, max_len=8)
    normed = run(m, att, method="beam", beam=4, n=4, max_len=8, length_norm=1.0)
    assert (plain.lengths < 8).all() and (normed.lengths < 8).all()  # all ended by EOS: len = words + 1

    def per_token(d):
        return d.seq_logprob / (d.lengths + 1).float()

    # each run is sorted by its own rule, and the two rules disagree on this model
    assert (plain.seq_logprob[:, :-1] >= plain.seq_logprob[:, 1:] - 1e-6).all()
    assert (per_token(normed)[:, :-1] >= per_token(normed)[:, 1:] - 1e-6).all()
    assert not (per_token(plain)[:, :-1] >= per_token(plain)[:, 1:] - 1e-6).all()
    # so the chosen caption changes on some images, and the top captions are longer on average
    assert (normed.tokens[:, 0] != plain.tokens[:, 0]).any(-1).sum() >= 3
    assert normed.lengths[:, 0].float().mean() > plain.lengths[:, 0].float().mean() + 0.5
    # the best normalised caption is at least as good per token as the plain winner
    assert (per_token(normed)[:, 0] >= per_token(plain)[:, 0] - 1e-5).all()


def _distinct(d):
    caps = [[tuple(row[:n].tolist()) for row, n in zip(d.tokens[i], d.lengths[i])] for i in range(d.tokens.shape[0])]
    distinct = sum(len(set(c)) for c in caps)
    bigrams = sum(len({(c[j], c[j + 1]) for c in cs for j in range(len(c) - 1)}) for cs in caps)
    return distinct, bigrams


@pytest.mark.unit
def test_diverse_beam_search_gives_more_distinct_captions(toy):
    m, feats = toy
    B = feats.shape[0]
    G, K = 3, 2
    same = run(m, feats, method="dbs", groups=G, beam=K, n=G * K, diversity_lambda=0.0, max_len=8)
    div = run(m, feats, method="dbs", groups=G, beam=K, n=G * K, diversity_lambda=3.0, max_len=8)
    # λ = 0: every group is the same beam search of width K
    assert _distinct(same)[0] == B * K
    assert _distinct(div)[0] > _distinct(same)[0]
    assert _distinct(div)[1] > _distinct(same)[1]  # and more distinct bigrams
    # the reported log-probs are the model's, not the penalised ranking scores
    tok, _ = sequence_logprobs(m(feats, div.tokens), div.tokens)
    assert torch.allclose(tok.view_as(div.logprobs), div.logprobs, atol=1e-5)
    # the first group of DBS is plain beam search of width K
    b = run(m, feats, method="beam", beam=K, n=K, max_len=8)
    assert torch.equal(div.tokens[:, 0, :b.tokens.shape[-1]], b.tokens[:, 0])


@pytest.mark.unit
def test_same_seed_same_samples(toy):
    m, feats = toy
    for method in ("random", "topk", "nucleus"):
        a = run(m, feats, gen_seed=7, method=method, n=5, top_k=5, top_p=0.9)
        b = run(m, feats, gen_seed=7, method=method, n=5, top_k=5, top_p=0.9)
        c = run(m, feats, gen_seed=8, method=method, n=5, top_k=5, top_p=0.9)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
        assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.unit
def test_top_k_and_nucleus_stay_in_their_sets(feats):
    m = model(scale=2.0)
    d = run(m, feats, method="topk", top_k=2, n=20, max_len=1)
    lp0 = m.step(torch.zeros(12, dtype=torch.long), m.encode(feats), m.init_state(12))[0]
    top2 = lp0.topk(2, -1).indices
    first = d.tokens[:, :, 0]
    assert ((first.unsqueeze(-1) == top2.unsqueeze(1)).any(-1)).all()
    assert len(set(first.flatten().tolist())) > 1
    # nucleus with p below every image's top-word probability: the top word alone
    p_top = lp0.exp().max(-1).values
    d = run(m, feats, method="nucleus", top_p=float(p_top.min().detach()) - 1e-4, n=20, max_len=1)
    assert (d.tokens[:, :, 0] == lp0.argmax(-1, keepdim=True)).all()


@pytest.mark.unit
def test_bad_settings_one_line():
    for kw, msg in ((dict(method="magic"), "unknown decoding method"), (dict(n=0), "at least 1"),
                    (dict(method="beam", beam=2, n=3), "more than the 2 beams"),
                    (dict(method="topk", top_k=0), "top-k"), (dict(method="nucleus", top_p=0), "top-p"),
                    (dict(method="random", temperature=0), "temperature")):
        with pytest.raises(ValueError, match=msg):
            DecodeConfig(**kw).check()


@pytest.mark.unit
def test_every_method_works_with_its_defaults(feats):
    """No method needs an extra flag: unset settings take the method's defaults (top-k 10, top-p
    0.9, beam search n beams (≥ 3), diverse beam search n groups of 1 beam), and check() records
    them in the config."""
    m = model(scale=2.0)
    want = {"topk": dict(top_k=10), "nucleus": dict(top_p=0.9), "beam": dict(beam=6, groups=None),
            "dbs": dict(groups=6, beam=1), "random": dict(top_k=None, top_p=None, beam=None, groups=None)}
    for method in ("greedy", "random", "topk", "nucleus", "beam", "dbs"):
        cfg = DecodeConfig(method=method, n=6, max_len=5)
        d = decode(m, feats, cfg, generator=torch.Generator().manual_seed(0))
        assert d.tokens.shape[:2] == (12, 6)
        for k, v in want.get(method, {}).items():
            assert getattr(cfg, k) == v, (method, k)
    assert DecodeConfig(method="beam", n=1).check().beam == 3
    assert DecodeConfig(method="dbs", n=20, groups=4).check().beam == 5
    assert DecodeConfig(method="dbs", n=20, beam=5).check().groups == 4
    assert DecodeConfig(method="topk", top_k=3).check().top_k == 3  # given settings are kept
    d = decode(m, feats, DecodeConfig(method="dbs", n=6, max_len=5))
    assert len({tuple(r) for r in d.tokens[0].tolist()}) > 1  # one caption per group, not one beam


@pytest.mark.integration
def test_checkpoint_decodes_the_same_in_a_fresh_process(tmp_path, feats):
    m = model(scale=2.0)
    save_checkpoint(tmp_path / "best.pt", m, [f"w{i}" for i in range(V)])
    torch.save(feats, tmp_path / "att.pt")
    want = run(m, feats, method="greedy", max_len=8).tokens.tolist()
    code = (
        "import json, sys, torch\n"
        "from rdpp_cli.models import load_model\n"
        "from rdpp_cli.decoding.decode import DecodeConfig, decode\n"
        f"m, vocab, _ = load_model({str(tmp_path / 'best.pt')!r})\n"
        f"att = torch.load({str(tmp_path / 'att.pt')!r})\n"
        "print(json.dumps(decode(m, att, DecodeConfig(method='greedy', max_len=8)).tokens.tolist()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == want


@pytest.mark.unit
def test_inverse_cdf_draw_matches_the_distribution():
    from rdpp_cli.decoding.decode import _draw

    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 0.0, 2.0]])  # any scale
    g = torch.Generator().manual_seed(0)
    draws = _draw(probs.repeat(20000, 1), g).view(20000, 2)
    freq = torch.bincount(draws[:, 0], minlength=4).float() / 20000
    assert freq.tolist() == pytest.approx([0.1, 0.0, 0.6, 0.3], abs=0.01)
    assert freq[1] == 0 and (draws[:, 1] == 3).all()


def _plain_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse CDF by one cumulative sum over the whole row: the first index whose sum passes u of the total."""
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)


def _dyadic_rows() -> torch.Tensor:
    """Rows of 300 words (two blocks of 128 and a padded one of 44) in multiples of 2**-12, whose sums are
    exact in float32: zeros scattered, at a block's edges (127, 128, 255, 256) and trailing (250-299); one
    row with only its last word, one with only its first."""
    g = torch.Generator().manual_seed(3)
    w = torch.randint(0, 9, (4, 300), generator=g).float()
    w[:, [127, 128, 255, 256]] = 0
    w[1, 250:] = 0
    w[2] = 0
    w[2, 299] = 5
    w[3] = 0
    w[3, 0] = 7
    return w / 2 ** 12


@pytest.mark.unit
def test_the_blocked_draw_is_the_plain_inverse_cdf():
    """Where float sums are exact (no rounding to differ on), the blocked cumulative sums are the plain
    ones and every uniform draws the plain inverse CDF's index -- including rows of fewer words than a
    block (top-k's), and zeros at the blocks' edges and in the padding."""
    from rdpp_cli.models.base import blocked_cumsum, draw_by_cdf

    probs = _dyadic_rows()
    assert torch.equal(blocked_cumsum(probs), probs.cumsum(-1))
    u = torch.linspace(0, 1, 2001)[:-1]  # [0, 1)
    rows = probs.repeat_interleave(len(u), 0)
    us = u.repeat(len(probs))
    got = draw_by_cdf(rows, us)
    assert torch.equal(got, _plain_inverse_cdf(rows, us))
    assert (rows.gather(1, got.unsqueeze(1)) > 0).all()
    assert set(got.view(4, -1)[2].tolist()) == {299} and set(got.view(4, -1)[3].tolist()) == {0}
    short = probs[[0, 1, 3], :100].repeat_interleave(len(u), 0)  # one block (row 2 has no word there)
    assert torch.equal(draw_by_cdf(short, us[:len(short)]), _plain_inverse_cdf(short, us[:len(short)]))


@pytest.mark.unit
def test_a_target_at_the_total_draws_the_last_word_of_positive_probability():
    """u = 1 (or a product rounded up to the row's total) passes every cumulative sum: the draw is the
    last word that can be drawn, never a word of probability 0 after it (nor padding)."""
    from rdpp_cli.models.base import draw_by_cdf

    probs = _dyadic_rows()
    last = [int(torch.nonzero(r).max()) for r in probs]
    assert last[1] < 250 and last[2] == 299
    assert draw_by_cdf(probs, torch.ones(4)).tolist() == last
    assert draw_by_cdf(torch.tensor([[0.5, 0.5, 0.0, 0.0]]), torch.ones(1)).tolist() == [1]


@pytest.mark.unit
def test_the_blocked_draw_picks_the_plain_index_at_the_papers_vocabulary():
    """Softmax rows at 9,488 words: the blocked sums differ from the plain ones by float rounding only,
    so the same uniforms draw the same words (a draw could differ only for a uniform within rounding of a
    boundary: none among these 25,000)."""
    from rdpp_cli.models.base import blocked_cumsum, draw_by_cdf

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(250, 9488, generator=g), -1)
    torch.testing.assert_close(blocked_cumsum(probs), probs.cumsum(-1), rtol=0, atol=1e-6)
    for _ in range(100):
        u = torch.rand(250, generator=g)
        assert torch.equal(draw_by_cdf(probs, u), _plain_inverse_cdf(probs, u))


@pytest.mark.unit
def test_nucleus_beyond_the_top_128_words_matches_a_full_sort():
    """Rows whose nucleus is wider than the top-128 shortcut fall back to a full sort: same set."""
    from rdpp_cli.decoding.decode import _nucleus

    V = 400
    flat = torch.linspace(2.0, 1.0, V)
    flat = flat[torch.randperm(V, generator=torch.Generator().manual_seed(0))]
    peaked = torch.zeros(V)
    peaked[[5, 17, 300]] = torch.tensor([0.5, 0.3, 0.2])
    probs = torch.stack([flat / flat.sum(), peaked])
    top_p = 0.9
    want = []
    for row in probs:
        sp, si = row.sort(descending=True)
        want.append(set(si[:int(((sp.cumsum(0) - sp) < top_p).sum())].tolist()))
    assert len(want[0]) > 128 and want[1] == {5, 17, 300}
    g = torch.Generator().manual_seed(1)
    got = _nucleus(probs.repeat(3000, 1), top_p, g).view(3000, 2)
    assert set(got[:, 0].tolist()) <= want[0] and len(set(got[:, 0].tolist())) > 0.9 * len(want[0])
    assert set(got[:, 1].tolist()) == want[1]
    freq = torch.bincount(got[:, 1], minlength=V)[[5, 17, 300]].float() / 3000
    assert freq.tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.03)


@pytest.mark.unit
def test_unk_is_never_emitted_when_suppressed_by_any_method(feats):
    """A model that prefers word V ("UNK") everywhere: without suppression every method emits it;
    with ``unk_id`` none does, and the log-probs reported are still the model's own."""
    m = model(scale=3.0)
    with torch.no_grad():
        m.logit.bias[V] += 4.0
    for method in ("greedy", "random", "topk", "nucleus", "beam", "dbs"):
        kw = dict(method=method, n=4, top_k=4, top_p=0.9, beam=4, groups=2, max_len=6)
        assert (run(m, feats, **kw).tokens == V).any(), method
        d = run(m, feats, unk_id=V, **kw)
        assert not (d.tokens == V).any() and (d.lengths > 0).any(), method
        B, n, T = d.tokens.shape
        tok, _ = sequence_logprobs(m(feats, d.tokens), d.tokens)
        assert torch.allclose(tok.view(B, n, T + 1), d.logprobs, atol=1e-5), method


@pytest.mark.unit
def test_unk_suppression_by_hand():
    """Word 4 (UNK) is the most probable after every word; suppressed, greedy and beam search take
    word 1, then the EOS: log-prob log(0.3 · 0.3), against log 0.05 for the empty caption."""

    class Table(StepTable):
        def step(self, it, enc, state, drop=None):
            p = torch.tensor([0.05, 0.3, 0.05, 0.05, 0.55]).expand(it.shape[0], 5).clone()
            p[it == 1] = torch.tensor([0.3, 0.05, 0.05, 0.05, 0.55])  # after word 1: EOS, else UNK
            return p.log(), state

    att = torch.zeros(1, 1, 1)
    assert decode(Table(), att, DecodeConfig(method="greedy", max_len=3)).tokens[0, 0].tolist() == [4, 4, 4]
    for method in ("greedy", "beam"):
        d = decode(Table(), att, DecodeConfig(method=method, beam=2, max_len=3, unk_id=4))
        assert d.tokens[0, 0].tolist() == [1], method
        assert d.seq_logprob[0, 0].item() == pytest.approx(float(torch.tensor(0.3 * 0.3).log()), rel=1e-6)


# The next-word table (EOS = 0, then a b c d = 1..4): the caption "a" ends early with
# log p = log(.95 · .12) = -2.17; every longer caption ends lower (-5.67 for six words without an EOS,
# -9.58 with the EOS forced after the sixth word). Context: 0 after BOS, 1 after "a", 2 after "a b",
# 3 after anything else.
_NEXT = torch.tensor([[0.0125, 0.95, 0.0125, 0.0125, 0.0125],
                      [0.12, 0.01, 0.75, 0.10, 0.02],
                      [0.10, 0.0, 0.31, 0.30, 0.29],
                      [0.02, 0.25, 0.246, 0.244, 0.24]])


def _next_context(ctx: torch.Tensor, it: torch.Tensor) -> torch.Tensor:
    return torch.where((ctx == 0) & (it == 1), 1, torch.where((ctx == 1) & (it == 2), 2, 3))


class EarlyEndTable(StepTable):
    """The table above as a model: the state is the context row (BOS before the first step)."""

    def init_state(self, N):
        return (torch.full((N,), -1),)

    def step(self, it, enc, state, drop=None):
        ctx = torch.where(state[0] < 0, 0, _next_context(state[0], it))
        return _NEXT[ctx].log(), (ctx,)


@pytest.mark.unit
def test_beam_search_keeps_a_caption_that_ended_early_when_the_live_beams_end_lower():
    """Beam 3, at most 6 words: "a" ends at step 1 and three live beams rank above it until all of
    them end lower; the best caption found is "a" (log p -2.17), for beam search and for the first
    group of diverse beam search, with or without diversity."""
    att = torch.zeros(2, 1, 1)
    want = float(torch.tensor(0.95 * 0.12).log())
    for cfg in (DecodeConfig(method="beam", beam=3, n=3, max_len=6),
                DecodeConfig(method="dbs", beam=3, groups=2, n=2, max_len=6, diversity_lambda=0.0),
                DecodeConfig(method="dbs", beam=3, groups=2, n=2, max_len=6, diversity_lambda=0.5)):
        d = decode(EarlyEndTable(), att, cfg)
        assert d.tokens[:, 0, :1].tolist() == [[1], [1]] and d.lengths[:, 0].tolist() == [1, 1], cfg.method
        assert d.seq_logprob[:, 0].tolist() == pytest.approx([want, want], abs=1e-5), cfg.method
    d = decode(EarlyEndTable(), att, DecodeConfig(method="beam", beam=3, n=3, max_len=6))
    # then the empty caption (log .0125 = -4.38), then the best six-word one, ended by the forced EOS
    assert d.lengths[0].tolist() == [1, 0, 6]
    assert d.seq_logprob[0, 1:].tolist() == pytest.approx([-4.38, -9.58], abs=0.01)


@pytest.mark.unit
def test_beam_search_on_the_early_end_table_equals_the_peers():
    """self-critical.pytorch's own ``beam_search`` on the same table returns "a" first too."""
    from helpers import peer_modules

    peer_modules()
    from captioning.models.CaptionModel import CaptionModel

    class PeerTable(CaptionModel):
        seq_length, eos_idx, unk_idx, vocab_size = 6, 0, None, 4

        def get_logprobs_state(self, it, state):
            ctx = _next_context(state[0][0], it)
            return _NEXT[ctx].log(), [ctx.unsqueeze(0)]

    init = [torch.zeros(1, 2, dtype=torch.long)]
    done = PeerTable().beam_search(init, _NEXT[[0, 0]].log(), opt={"beam_size": 3})
    ours = decode(EarlyEndTable(), torch.zeros(2, 1, 1), DecodeConfig(method="beam", beam=3, n=1, max_len=6))
    for b in range(2):
        assert done[b][0]["seq"].tolist() == [1, 0] and ours.tokens[b, 0].tolist() == [1]
        assert done[b][0]["p"] == pytest.approx(ours.seq_logprob[b, 0].item(), abs=1e-5)


@pytest.mark.unit
def test_a_temperature_float32_cannot_divide_by_is_refused_and_the_coldest_allowed_is_greedy(feats):
    """1e-39 and 1e-38 (below float32's normal range) turned every tempered log-prob into -inf and
    every caption into UNKs; they are refused, and sampling at the least temperature allowed is
    greedy, on every registered model."""
    from rdpp_cli.decoding.config import MIN_TEMPERATURE
    from rdpp_cli.models import MODELS, model_spec

    fc = feats.mean(1)
    for name in (n for n, spec in MODELS.items() if not spec.folder_option):  # hf: tests/test_model_hf.py
        torch.manual_seed(0)
        m = model_spec(name).build("small", vocab_size=V, att_feat_size=6, fc_feat_size=6, seq_length=6,
                                   drop_prob_lm=0.0).eval()
        greedy = decode(m, feats, DecodeConfig(method="greedy", n=3), fc=fc)
        for method in ("random", "topk", "nucleus"):
            for temperature in (1e-39, 1e-38):
                with pytest.raises(ValueError, match=rf"--temperature {temperature:g} is below 1e-37, where the "
                                                     r"log-probs divided by it leave float32's range"):
                    decode(m, feats, DecodeConfig(method=method, n=3, temperature=temperature), fc=fc)
            cold = decode(m, feats, DecodeConfig(method=method, n=3, temperature=MIN_TEMPERATURE), fc=fc,
                          generator=torch.Generator().manual_seed(0))
            assert torch.equal(cold.tokens, greedy.tokens) and (cold.lengths > 0).any(), (name, method)
