"""Sampling compiles at COCO's vocabulary (9,488 outputs, 250 caption rows: 50 images x 5).

Inductor lowers a cumulative sum over a whole 9,488-word row to a split scan whose Triton code it
cannot generate, so every draw (random, top-k, nucleus, scheduled sampling's words) takes its sums in
blocks (``rdpp_cli.models.base.blocked_cumsum``). Checked here on the CPU: no traced sampling pass
scans more than a block; inductor compiles the draws, and (``slow``: minutes of C++ code generation on
2 cores) the whole ``static_decode`` at the paper's shapes, with the eager captions. tests/test_cuda.py
compiles ``static_decode`` at the same shapes on a GPU, where the split scan failed."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from rdpp_cli.decoding.decode import DecodeConfig, _draw_from_prefix, draw_uniforms, static_decode
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.models.base import SCAN_BLOCK, draw_by_cdf, scheduled_logprobs

WORDS, IMAGES, N, STEPS = 9487, 50, 5, 16  # COCO's vocabulary (+ the EOS: 9,488 outputs), 250 rows, 16 words
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                               reason="inductor's CPU code generation needs a C++ compiler (g++)")


def papers_decoder(steps: int = STEPS) -> Att2in:
    """A small Att2in (width 16) with the paper's vocabulary: the rows and the vocabulary are what matter."""
    torch.manual_seed(0)
    cfg = Att2inConfig(vocab_size=WORDS, input_encoding_size=16, rnn_size=16, att_hid_size=16, att_feat_size=8,
                       drop_prob_lm=0.0, seq_length=steps)
    return Att2in(cfg).eval()


def _att() -> torch.Tensor:
    return torch.randn(IMAGES, 4, 8, generator=torch.Generator().manual_seed(1))


def _scans(fn, *args) -> list[int]:
    """The length of every cumulative sum in the traced graph of ``fn(*args)``."""
    graph = make_fx(fn)(*args).graph
    return [n.args[0].meta["val"].shape[n.args[1]] for n in graph.nodes
            if n.op == "call_function" and n.target is torch.ops.aten.cumsum.default]


@pytest.mark.unit
@pytest.mark.parametrize("method", ["random", "topk", "nucleus"])
def test_no_sampling_pass_scans_more_than_a_block_at_the_papers_vocabulary(method):
    steps = 2  # every step is the same graph
    model, att = papers_decoder(steps), _att()
    cfg = DecodeConfig(method=method, n=N, max_len=steps, top_k=50, top_p=0.9)
    u = draw_uniforms(IMAGES * N, steps, torch.Generator().manual_seed(2))
    scans = _scans(lambda a, uu: static_decode(model, a, cfg, uniforms=uu).tokens, att, u)
    assert scans and max(scans) <= SCAN_BLOCK, scans


@pytest.mark.unit
def test_scheduled_samplings_drawn_words_scan_no_more_than_a_block():
    steps = 2
    model, att = papers_decoder(steps), _att()
    g = torch.Generator().manual_seed(3)
    seqs = torch.randint(1, WORDS + 1, (IMAGES * N, steps), generator=g)
    use = torch.rand(IMAGES * N, steps, generator=g) < 0.5
    u = torch.rand(IMAGES * N, steps, generator=g)
    scans = _scans(lambda a, s, us, uu: scheduled_logprobs(model, a, s, use=us, uniforms=uu), att, seqs, use, u)
    assert scans and max(scans) <= SCAN_BLOCK, scans


@needs_cxx
@pytest.mark.integration
def test_inductor_compiles_the_draws_at_the_papers_vocabulary():
    """Random (and scheduled sampling's) draw and nucleus's prefix draw, compiled by inductor for 250
    rows of 9,488 words: the eager words from the same uniforms."""
    def draws(probs: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return draw_by_cdf(probs, u), _draw_from_prefix(*probs.sort(-1, descending=True), 0.9, None, u)

    g = torch.Generator().manual_seed(4)
    probs = torch.softmax(3 * torch.randn(IMAGES * N, WORDS + 1, generator=g), -1)
    u = torch.rand(IMAGES * N, generator=g)
    torch._dynamo.reset()
    got = torch.compile(draws, backend="inductor", fullgraph=True)(probs, u)
    want = draws(probs, u)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(set(want[0].tolist())) > 200  # real draws over the vocabulary


def compiled_decode_agrees(device: str, min_same: float) -> None:
    """``static_decode`` compiled by inductor (``fullgraph``) at the paper's shapes against eager, the
    same uniforms: the captions (all but a fraction ``1 - min_same`` that float rounding may flip: a
    uniform within rounding of a boundary) and, on the equal ones, their log-probs."""
    model, att = papers_decoder().to(device), _att().to(device)
    cfg = DecodeConfig(method="random", n=N, max_len=STEPS)
    u = draw_uniforms(IMAGES * N, STEPS, torch.Generator(device=device).manual_seed(5), device)
    want = static_decode(model, att, cfg, uniforms=u)
    torch._dynamo.reset()
    got = torch.compile(static_decode, backend="inductor", fullgraph=True)(model, att, cfg, uniforms=u)
    assert got.tokens.shape == want.tokens.shape == (IMAGES, N, STEPS)
    same = (got.tokens == want.tokens).all(-1)
    assert same.float().mean() >= min_same
    torch.testing.assert_close(got.logprobs[same], want.logprobs[same], rtol=1e-4, atol=1e-5)


@needs_cxx
@pytest.mark.slow
@pytest.mark.integration
def test_inductor_compiles_static_decode_at_the_papers_shapes():
    """16 steps of 250 rows over 9,488 words, one graph: about 100 s of C++ code generation on 2 cores."""
    compiled_decode_agrees("cpu", min_same=0.98)
