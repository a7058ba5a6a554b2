"""The training fast path (``--fast``, rdpp_cli/training/fast.py): the same numbers as the eager path.

On the CPU with torch.compile's ``aot_eager`` backend (dynamo's graph capture and AOT autograd, the
mechanism the GPU runs, without inductor's C++ code generation, which takes minutes on 2 cores; the
``slow`` test runs inductor itself): the fixed-shape teacher-forced pass, the dropout drawn before
it, static decoding and the whole sampling pass as one ``fullgraph`` function (a hidden host sync
fails as a graph break), the reward compiled the same way, a whole RL epoch eager and fast side by
side, validation, the losses read every k steps, a whole toy run and its resume. Dynamo caches the
compiled functions per code object and input shape, so the tests share them by using the same
shapes. CUDA graphs and fused Adam are checked in tests/test_cuda.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import CaptionBatches
from rdpp_cli.data.vocab import unk_id
from rdpp_cli.decoding.decode import DecodeConfig, decode, draw_uniforms
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.train_cider import TrainCider
from rdpp_cli.metrics.train_cider_torch import reference_table, references_tensor
from rdpp_cli.training import fast as F
from rdpp_cli.training.finetune import RewardStep, finetune
from rdpp_cli.training.rewards import _inverse, dpp_weights
from rdpp_cli.training.validation import greedy_cider
from rdpp_cli.training.loggers import PendingLogs
from rdpp_cli.training.loop import TrainingRecipe
from rdpp_cli.training.options import TrainLoopOptions, XEOptions
from rdpp_cli.models.base import scheduled_logprobs, static_state, traceable_dropout
from rdpp_cli.models.registry import model_spec
from rdpp_cli.models.transformer import StaticKV
from rdpp_cli.training.xe import XELoss, train_xe, xe_loss

from helpers import Crash, att2in_for, drawn_xe_dropout, scoring_att2in, state_dict, write_tiny_data

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread", "dynamo")
AOT = F.FastSettings(backend="aot_eager", log_every=2)


@pytest.fixture(scope="module")
def dynamo():
    """Compiled code from a clean cache, and an error instead of a silent fall-back to eager."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> DataArtifact:
    return DataArtifact.open(write_tiny_data(Path(tmp_path_factory.mktemp("d")) / "tiny", n_train=16, n_val=6,
                                             n_test=2))


def _model(d: DataArtifact, dropout: float = 0.5, seed: int = 0):
    torch.manual_seed(seed)
    return att2in_for(d, 16, dropout).train()


SIZES = {"att2in": dict(input_encoding_size=16, rnn_size=16, att_hid_size=16),
         "updown": dict(input_encoding_size=16, rnn_size=16, att_hid_size=16),
         "transformer": dict(N_enc=1, N_dec=2, d_model=16, d_ff=24, num_att_heads=2, dropout=0.2)}
MODELS = list(SIZES)


def _any_model(name: str, d: DataArtifact, dropout: float = 0.3, seed: int = 0):
    """A tiny ``name`` model for ``d`` in train mode (every dropout ``dropout``)."""
    torch.manual_seed(seed)
    kw = dict(SIZES[name], drop_prob_lm=dropout, **({"dropout": dropout} if name == "transformer" else {}))
    return model_spec(name).build("small", vocab_size=d.vocab_size, att_feat_size=d.att_dim, fc_feat_size=d.fc_dim,
                                  seq_length=d.seq_length, **kw).train()


def _batch(d: DataArtifact, seq_per_img: int = 5, batch_size: int = 8):
    batches = CaptionBatches(d, "train", batch_size=batch_size, seq_per_img=seq_per_img, seed=0)
    return next(iter(batches.epoch(0))).to("cpu")


def _grads(model) -> dict[str, torch.Tensor]:
    out = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _close_grads(a: dict, b: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys() and len(a) > 5
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=rtol, atol=atol, msg=k)


# -- the pieces, eager ------------------------------------------------------------------------------

@pytest.mark.unit
def test_static_token_logprobs_equal_token_logprobs(tiny):
    model = _model(tiny)
    labels = torch.nn.functional.pad(_batch(tiny).labels, (0, 4))  # a label width past the longest caption
    att, L = _batch(tiny).att, labels.shape[-1]
    drop = model.draw_dropout(8, 40, L + 1, att.shape[1])
    for d in (drop, None):
        model.train(d is not None)
        tok, mask = model.token_logprobs(att, labels, drop=d)
        (-tok.sum()).backward()
        g_eager = _grads(model)
        tok_s, mask_s = model.static_token_logprobs(att, labels, drop=d)
        (-tok_s.sum()).backward()
        assert tok_s.shape == tok.shape == (40, L + 1) and torch.equal(mask_s, mask)
        torch.testing.assert_close(tok_s, tok, rtol=1e-5, atol=1e-6)
        _close_grads(g_eager, _grads(model))


@pytest.mark.unit
def test_the_fast_xe_steps_masks_are_drawn_once_as_the_rl_step_draws_them(tiny):
    """The fast XE step's dropout, drawn before the compiled pass, is ``draw_dropout`` over the
    batch's images, its caption rows and L+1 steps from torch's generator (as the RL step draws
    its masks); the eager step draws none (its pass draws its own); eval mode: none."""
    model = _model(tiny)
    batch = _batch(tiny)
    fast = F.FastPath(torch.device("cpu"), AOT)
    L, R = tiny.seq_length, batch.att.shape[1]
    torch.manual_seed(7)
    drop = fast.xe_dropout(model, batch.labels, R)
    torch.manual_seed(7)
    want = model.draw_dropout(8, 40, L + 1, R)
    for part in ("image", "row"):
        got, exp = getattr(drop, part), getattr(want, part)
        assert got.keys() == exp.keys() and all(torch.equal(got[k], exp[k]) for k in exp)
    assert drop.row["embed"].shape == (40, L + 1, 16) and set(drop.row["out"].unique().tolist()) == {0.0, 2.0}
    assert fast.xe_dropout(model.eval(), batch.labels, R) is None
    assert F.EAGER.xe_dropout(model.train(), batch.labels, R) is None


@pytest.mark.unit
def test_static_decoding_keeps_the_captions(tiny):
    model = _model(tiny)
    batch = _batch(tiny, seq_per_img=1)
    L = tiny.seq_length
    drop = model.draw_dropout(8, 24, L + 1, batch.att.shape[1])
    cfg = DecodeConfig(method="random", n=3, max_len=L)
    a = decode(model, batch.att, cfg, generator=torch.Generator().manual_seed(3), drop=drop)
    b = decode(model, batch.att, cfg, generator=torch.Generator().manual_seed(3), drop=drop, static=True)
    T = a.tokens.shape[-1]
    assert b.tokens.shape == (8, 3, L) and b.logprobs.shape == (8, 3, L + 1)
    assert torch.equal(b.tokens[..., :T], a.tokens) and not b.tokens[..., T:].any()
    assert torch.equal(b.logprobs[..., :T + 1], a.logprobs) and torch.equal(b.lengths, a.lengths)


@pytest.mark.unit
def test_pending_logs_are_read_in_order_in_one_transfer():
    p = PendingLogs(every=2)
    assert not p.add(1, 8, {"loss": torch.tensor(2.5), "reward": 0.25})
    assert p.add(2, 4, {"loss": torch.tensor(float("nan")), "reward": torch.tensor(1.0, dtype=torch.float64)})
    got = p.read()
    assert got[0] == (1, 8, {"loss": 2.5, "reward": 0.25}) and got[1][:2] == (2, 4)
    assert np.isnan(got[1][2]["loss"]) and got[1][2]["reward"] == 1.0 and p.read() == []


@pytest.mark.unit
@pytest.mark.parametrize("reward,kw", [("dpp", {}), ("dpp", {"baseline": "mean"}), ("scst", {}), ("scst-mean", {}),
                                       ("xe-cider", {})])
def test_the_reward_on_tensors_gives_the_numpy_weights(tiny, reward, kw):
    model = _model(tiny)
    batch = _batch(tiny, seq_per_img=5 if reward == "xe-cider" else 1)
    step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward=reward, m=4, max_len=tiny.seq_length, **kw)
    d = step.draw(model, batch)
    refs = tiny.references_ids(batch.index)
    w, logs = step.weights(d.samples.numpy(), d.greedy, refs)
    w_t, logs_t = step.device_weights(d.samples, d.greedy, *references_tensor(refs, "cpu"))
    assert w_t.dtype == torch.float32 and logs.keys() == logs_t.keys() and "self_cider" in logs
    torch.testing.assert_close(w_t, w, rtol=1e-6, atol=1e-7)
    for k in logs:
        assert float(logs_t[k]) == pytest.approx(logs[k], rel=1e-9, abs=1e-12), k


@pytest.mark.unit
def test_auto_is_on_only_where_measured(tiny):
    """``--fast auto``: on for Att2in on CUDA (measured faster and equal on an H200), off for UpDown
    and the Transformer until measured on a GPU, off on a CPU and for a model the table lacks."""
    auto = {(dev, name): F.resolve_fast("auto", dev, name) for dev in ("cpu", "cuda")
            for name in ("Att2in", "UpDown", "Transformer")}
    assert auto == {("cpu", "Att2in"): "off", ("cpu", "UpDown"): "off", ("cpu", "Transformer"): "off",
                    ("cuda", "Att2in"): "on", ("cuda", "UpDown"): "off", ("cuda", "Transformer"): "off"}
    assert F.resolve_fast("auto", "cuda", _model(tiny)) == "on"  # a module: its class
    assert F.resolve_fast("auto", "cuda", _any_model("updown", tiny)) == "off"
    assert F.resolve_fast("auto", "cuda") == "off" and F.resolve_fast("auto", "mps", "Att2in") == "off"
    assert F.resolve_fast("on", "cpu") == "on" and F.resolve_fast("off", "cuda", "Att2in") == "off"
    assert F.fast_path("off", "cpu") is None and F.fast_path("auto", "cpu", _model(tiny)) is None
    with pytest.raises(RdppError, match="--fast 'fast' is not a --fast setting; use one of auto, on, off"):
        XEOptions(fast="fast")


@pytest.mark.unit
@pytest.mark.parametrize("name", MODELS)
def test_every_model_has_the_fast_path(tiny, name):
    model = _any_model(name, tiny)
    assert model.supports_fast and isinstance(F.fast_path("on", "cpu", model), F.FastPath)


@pytest.mark.unit
@pytest.mark.parametrize("name", MODELS)
def test_the_static_pass_with_masks_drawn_once_gives_the_eager_numbers(tiny, name):
    """Each model's ``static_token_logprobs`` (all L+1 steps, a label width past the longest
    caption) with dropout masks drawn once (``draw_dropout``, as the RL step and the fast XE step
    draw them) gives ``token_logprobs``' log-probs and gradients with the same masks."""
    model, batch = _any_model(name, tiny), _batch(tiny, seq_per_img=2, batch_size=4)
    labels = torch.nn.functional.pad(batch.labels, (0, 3))
    kw = dict(att_mask=batch.att_mask, fc=batch.fc)
    drop = model.draw_dropout(4, 8, labels.shape[-1] + 1, batch.att.shape[1], torch.Generator().manual_seed(7))
    tok, mask = model.token_logprobs(batch.att, labels, drop=drop, **kw)
    (-tok.sum()).backward()
    g_eager = _grads(model)
    tok_s, mask_s = model.static_token_logprobs(batch.att, labels, drop=drop, **kw)
    (-tok_s.sum()).backward()
    assert tok_s.shape == (8, labels.shape[-1] + 1) and torch.equal(mask_s, mask) and tok.abs().sum() > 1
    torch.testing.assert_close(tok_s, tok, rtol=1e-5, atol=1e-6)
    _close_grads(g_eager, _grads(model))
    assert not hasattr(model, "eager_dropout")


@pytest.mark.unit
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("method", ["greedy", "random"])
def test_static_decoding_state_gives_the_eager_captions(tiny, name, method):
    """Decoding with the fixed-size state (the Transformer's preallocated key/value cache written at
    each row's position) gives the captions and log-probs of the growing cache."""
    model, batch = _any_model(name, tiny), _batch(tiny, seq_per_img=1, batch_size=4)
    model.eval()
    L = tiny.seq_length
    cfg = DecodeConfig(method=method, n=3, max_len=L)
    kw = dict(att_mask=batch.att_mask, fc=batch.fc)
    a = decode(model, batch.att, cfg, generator=torch.Generator().manual_seed(3), **kw)
    b = decode(model, batch.att, cfg, generator=torch.Generator().manual_seed(3), static=True, **kw)
    T = a.tokens.shape[-1]
    assert torch.equal(b.tokens[..., :T], a.tokens) and not b.tokens[..., T:].any() and a.lengths.float().mean() > 1
    torch.testing.assert_close(b.logprobs[..., :T + 1], a.logprobs, rtol=1e-5, atol=1e-5)
    state = static_state(model, 6, L + 1)
    if name == "transformer":  # a named state: the positions and the preallocated caches
        assert isinstance(state, StaticKV) and state.at.shape == (6,) and len(state.caches) == 2 * 2
        assert all(c.shape[0] == 6 and c.shape[2] == L + 1 for c in state.caches)
    else:
        assert all(s.shape[0] == 6 for s in state)


@pytest.mark.unit
def test_the_transformers_seeded_encoder_masks_drawn_out_are_the_same_masks(tiny):
    model, batch = _any_model("transformer", tiny), _batch(tiny, seq_per_img=2, batch_size=4)
    L = tiny.seq_length
    drop = model.draw_dropout(4, 8, L + 1, batch.att.shape[1], torch.Generator().manual_seed(2))
    out = traceable_dropout(model, drop, 4, batch.att.shape[1])
    assert "seed" not in out.image and len(out.image) == 1 + 4 * 1  # att embedding, one layer's four sites
    a = model.token_logprobs(batch.att, batch.labels, batch.att_mask, drop=drop)[0]
    b = model.token_logprobs(batch.att, batch.labels, batch.att_mask, drop=out)[0]
    assert torch.equal(a, b) and traceable_dropout(_model(tiny), drop, 4, 5) is drop


@pytest.mark.unit
def test_scheduled_sampling_draws_its_randomness_first_and_feeds_the_drawn_words(tiny):
    """``scheduled_logprobs``: without coin flips the teacher-forced log-probs; with every coin heads
    each step after the first is fed the word drawn with its uniform from the step before; the XE
    step with scheduled sampling is a function of the seed."""
    model, batch = _any_model("att2in", tiny), _batch(tiny, seq_per_img=2, batch_size=4)
    model.eval()
    labels = batch.labels.reshape(8, -1)
    full = model(batch.att, labels)
    torch.testing.assert_close(scheduled_logprobs(model, batch.att, labels), full, rtol=1e-5, atol=1e-6)
    L = labels.shape[1]
    use, u = torch.ones(8, L, dtype=torch.bool), torch.rand(8, L, generator=torch.Generator().manual_seed(1))
    lp = scheduled_logprobs(model, batch.att, labels, use=use, uniforms=u)
    fed = torch.stack([torch.searchsorted(lp[:, t].exp().cumsum(-1), (u[:, t] * lp[:, t].exp().sum(-1)).unsqueeze(1),
                                          right=True).squeeze(1) for t in range(L)], 1)
    torch.testing.assert_close(lp, model(batch.att, fed.clamp(max=lp.shape[-1] - 1)), rtol=1e-5, atol=1e-5)
    model.train()
    step = XELoss(lambda e: 0.5, 0.1, log_ss=True)
    losses = []
    for seed in (4, 4, 5):
        torch.manual_seed(seed)
        losses.append(step(model, batch)[0].item())
    assert losses[0] == losses[1] != losses[2]


@pytest.mark.integration
def test_a_nan_loss_is_caught_when_read_back_and_never_saved(tiny, tmp_path):
    """With the losses read every 3 steps, a NaN at step 3 stops the run at the epoch's end, naming
    step 3; the epoch's checkpoints are never written (last.pt is epoch 1's, finite)."""

    def nan_at_step_3(net, batch):
        loss = xe_loss(net, batch)
        return loss * float("nan") if (batch.epoch, batch.batch) == (1, 0) else loss

    opts = TrainLoopOptions(epochs=3, batch_size=8, lr=1e-2, val_images=2, device="cpu", seed=0)  # 2 steps/epoch
    fast = F.FastPath(torch.device("cpu"), F.FastSettings(backend="aot_eager", log_every=3))
    recipe = TrainingRecipe(stage="xe", model=_model(tiny), data=tiny, out_dir=tmp_path / "m", opts=opts,
                            step_fn=nan_at_step_3, inputs=[tiny.artifact], manifest_config={}, steps=fast)
    with pytest.raises(RdppError, match=r"^training diverged at epoch 2, step 3: the loss is nan \(last finite loss"):
        recipe.run()
    last = torch.load(tmp_path / "m" / "checkpoints" / "last.pt", weights_only=True)
    assert last["epoch"] == 1 and all(torch.isfinite(t).all() for t in last["state_dict"].values())
    assert recipe.position.step == 4  # the step after it ran before the read


# -- compiled (aot_eager) --------------------------------------------------------------------------

def _eager_and_fast_xe(model, fast, batch, seed: int = 11):
    """The eager XE loss with the masks the fast XE step draws (drawn once from the same RNG state)
    and the fast XE loss: (eager loss, fast loss, eager gradients, fast gradients)."""
    torch.manual_seed(seed)
    drop = fast.xe_dropout(model, batch.labels, batch.att.shape[1])
    tok, mask = model.token_logprobs(batch.att, batch.labels, batch.att_mask, drop=drop, fc=batch.fc)
    want = -tok.sum() / mask.sum()
    want.backward()
    g_want = _grads(model)
    torch.manual_seed(seed)
    got = xe_loss(model, batch, fast)
    got.backward()
    return want.detach(), got.detach(), g_want, _grads(model)


@pytest.mark.integration
def test_the_fast_xe_step_gives_the_eager_loss_and_gradients(tiny):
    """The fast XE step of a full batch (8 images) and of a partial one (6 images, padded to 8 by
    the fast path so that it reuses the full batch's graph): the loss and gradients of the eager
    step of those very images on the same masks (to 1e-6); one graph for both."""
    model = _model(tiny)
    fast = F.FastPath(torch.device("cpu"), AOT)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for batch in (_batch(tiny), _batch(tiny, batch_size=6)):
        want, got, g_want, g_got = _eager_and_fast_xe(model, fast, batch)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        _close_grads(g_want, g_got)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 1  # compiled, once for both


@pytest.mark.integration
@pytest.mark.parametrize("reward", ["dpp", "scst"])
def test_the_fast_rl_step_gives_the_eager_loss_and_gradients(tiny, reward):
    """The same samples (on-policy masks from the step's generator, compiled decoding steps), the
    same reward on tensors, the same policy-gradient loss and gradients."""
    model = _model(tiny)
    batch = _batch(tiny, seq_per_img=1)
    kw = dict(data=tiny, cider=TrainCider.for_data(tiny), reward=reward, m=4, max_len=tiny.seq_length)
    eager, fast = RewardStep(**kw), RewardStep(**kw, steps=F.FastPath(torch.device("cpu"), AOT))
    d_e, d_f = eager.draw(model, batch), fast.draw(model, batch)
    T = d_e.samples.shape[-1]
    assert torch.equal(d_f.samples[..., :T], d_e.samples) and d_f.samples.shape[-1] == tiny.seq_length
    loss_e, logs_e = eager(model, batch)
    loss_e.backward()
    g = _grads(model)
    assert abs(float(loss_e.detach())) > 1e-3 and g["logit.weight"].abs().max() > 1e-4  # non-zero weights
    loss_f, logs_f = fast(model, batch)
    loss_f.backward()
    torch.testing.assert_close(loss_f, loss_e, rtol=1e-5, atol=1e-7)
    assert logs_e.keys() == logs_f.keys()
    for k in logs_e:
        assert float(logs_f[k]) == pytest.approx(float(logs_e[k]), rel=1e-5, abs=1e-7), k
    _close_grads(g, _grads(model))


@pytest.mark.integration
@pytest.mark.parametrize("name", MODELS)
def test_every_models_fast_passes_are_captured_whole(tiny, name):
    """Dynamo captures each model's fixed-shape passes whole (``fullgraph``: a host sync would be a
    graph break, an error): the teacher-forced pass with the masks as the RL step draws them, the
    scheduled-sampling pass, and a decoding step on the fixed-size state. The "eager" backend runs
    the captured graph as it is (no AOT autograd: seconds, not minutes; the aot_eager tests below)."""
    torch._dynamo.reset()
    model, batch = _any_model(name, tiny), _batch(tiny, seq_per_img=2, batch_size=4)
    labels, (B, R) = batch.labels[..., :4], batch.att.shape[:2]  # 4 words: fewer steps to trace
    L = labels.shape[-1]
    drop = traceable_dropout(model, model.draw_dropout(B, 2 * B, L + 1, R), B, R)
    compiled = lambda fn: torch.compile(fn, backend="eager", fullgraph=True, dynamic=False)  # noqa: E731
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tok, _ = compiled(model.static_token_logprobs)(batch.att, labels, batch.att_mask, drop, batch.fc)
    torch.testing.assert_close(tok, model.static_token_logprobs(batch.att, labels, batch.att_mask, drop, batch.fc)[0])
    use, u = torch.rand(2 * B, L) < 0.5, torch.rand(2 * B, L)
    lp = compiled(scheduled_logprobs)(model, batch.att, labels, batch.att_mask, batch.fc, drop, use, u)
    torch.testing.assert_close(lp, scheduled_logprobs(model, batch.att, labels, batch.att_mask, batch.fc, drop, use, u))
    with torch.no_grad():
        enc = model.expand(model.encode(batch.att, batch.att_mask, fc=batch.fc, drop=drop), 2)
        state, it, step = static_state(model, 2 * B, L + 1), torch.zeros(2 * B, dtype=torch.long), compiled(model.step)
        for t in range(3):  # one graph for every step: the shapes do not change
            lp, state = step(it, enc, state, drop.at(t))
            it = lp.argmax(-1)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs + 3  # one decoding graph for 3 steps


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", ["updown", "transformer"])
def test_the_fast_xe_step_of_every_model_gives_the_eager_loss_and_gradients(tiny, name):
    torch._dynamo.reset()
    model, batch = _any_model(name, tiny), _batch(tiny, seq_per_img=2, batch_size=4)
    want, got, g_want, g_got = _eager_and_fast_xe(model, F.FastPath(torch.device("cpu"), AOT), batch)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    _close_grads(g_want, g_got)


@pytest.mark.slow
@pytest.mark.integration
def test_scheduled_sampling_and_label_smoothing_on_the_fast_path_give_the_eager_numbers(tiny):
    """The XE step with scheduled sampling (the compiled step-at-a-time pass) and label smoothing:
    the same loss and gradients as eager from the same seed."""
    torch._dynamo.reset()
    model, batch = _any_model("att2in", tiny), _batch(tiny, seq_per_img=2, batch_size=4)
    fast = F.FastPath(torch.device("cpu"), AOT)
    out = []
    for f in (F.EAGER, fast):
        torch.manual_seed(3)
        loss, logs = XELoss(lambda e: 0.5, 0.1, log_ss=True, steps=f)(model, batch)
        loss.backward()
        out.append((loss.detach(), _grads(model), logs))
    (a, ga, la), (b, gb, lb) = out
    assert la == lb == {"ss_prob": 0.5}
    torch.testing.assert_close(b, a, rtol=1e-5, atol=0)
    _close_grads(ga, gb)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("name", ["updown", "transformer"])
def test_the_fast_rl_step_of_every_model_gives_the_eager_loss_and_gradients(tiny, name):
    """UpDown's and the Transformer's R-DPP step through the fast path (compiled decoding steps on
    the fixed-size state, the Transformer's encoder masks drawn out of their seed for the compiled
    teacher-forced pass): the eager loss and gradients."""
    torch._dynamo.reset()
    model, batch = _any_model(name, tiny), _batch(tiny, seq_per_img=1, batch_size=4)
    kw = dict(data=tiny, cider=TrainCider.for_data(tiny), reward="dpp", m=3, max_len=tiny.seq_length)
    out = []
    for fast in (None, F.FastPath(torch.device("cpu"), AOT)):
        torch.manual_seed(1)
        loss, _ = RewardStep(**kw, steps=fast)(model, batch)
        loss.backward()
        out.append((loss.detach(), _grads(model)))
    (a, ga), (b, gb) = out
    assert abs(float(a)) > 1e-3
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    _close_grads(ga, gb)


def _metrics(path: Path) -> pd.DataFrame:
    m = pd.read_csv(path / "metrics.csv")
    return m.drop(columns=["time", "images_per_s"])


@pytest.mark.slow
@pytest.mark.integration
def test_a_toy_run_with_the_fast_path_has_the_eager_metrics(tiny, tmp_path, monkeypatch):
    """XE then R-DPP, with --fast on and off: every metric the same within 1e-4 relative (float32
    rounding through a few Adam steps), the manifest records the setting."""
    monkeypatch.setitem(F.SETTINGS, "cpu", AOT)
    drawn_xe_dropout(monkeypatch)  # the eager XE step with the fast step's masks, drawn once
    kw = dict(preset="small", epochs=2, batch_size=8, val_images=4, lr=2e-3, device="cpu", seed=1)
    xe = {f: train_xe(tiny.path, out=tmp_path / f"xe-{f}", fast=f, **kw) for f in ("off", "on")}
    ft = {f: finetune(xe["off"].path, data=tiny.path, out=tmp_path / f"dpp-{f}", reward="dpp", m=3, epochs=1,
                      batch_size=8, val_images=4, device="cpu", seed=2, fast=f) for f in ("off", "on")}
    for runs in (xe, ft):
        a, b = _metrics(runs["off"].path), _metrics(runs["on"].path)
        assert list(a.columns) == list(b.columns) and len(a) >= 1
        np.testing.assert_allclose(b.to_numpy(float), a.to_numpy(float), rtol=1e-4, atol=1e-6)
        cfg = runs["on"].manifest["config"]
        assert (cfg["fast"], cfg["fast_option"], runs["off"].manifest["config"]["fast"]) == ("on", "on", "off")


@pytest.mark.slow
@pytest.mark.integration
def test_resume_with_the_fast_path_is_exact(tiny, tmp_path, monkeypatch):
    """A fast run killed after step 5 and rerun ends bitwise where an uninterrupted fast run ends;
    and --fast is not part of the run's identity: an eager run resumes with --fast on."""
    monkeypatch.setitem(F.SETTINGS, "cpu", AOT)
    kw = dict(preset="small", epochs=2, batch_size=6, save_every_steps=2, val_images=3, device="cpu", seed=5)
    ref = train_xe(tiny.path, out=tmp_path / "ref", fast="on", **kw)

    def crash(step):
        if step == 5:
            raise Crash("killed after step 5")

    with pytest.raises(Crash):
        train_xe(tiny.path, out=tmp_path / "run", fast="on", after_step=crash, **kw)
    resumed = train_xe(tiny.path, out=tmp_path / "run", fast="on", **kw)
    a, b = state_dict(ref.path / "checkpoints" / "last.pt"), state_dict(resumed.path / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    pd.testing.assert_frame_equal(_metrics(ref.path), _metrics(resumed.path))
    with pytest.raises(Crash):
        train_xe(tiny.path, out=tmp_path / "mixed", fast="off", after_step=crash, **kw)
    mixed = train_xe(tiny.path, out=tmp_path / "mixed", fast="on", **kw)
    assert (mixed.manifest["config"]["fast"], mixed.manifest["config"]["fast_ran"]) == ("mixed", ["off", "on"])
    assert list(pd.read_csv(mixed.path / "metrics.csv")["step"]) == [3, 6]


@pytest.mark.slow
@pytest.mark.integration
def test_the_inductor_compiled_xe_step_gives_the_eager_loss_and_gradients(tiny):
    """The fast XE step as ``--fast on`` runs it on a CPU (inductor, C++ kernels): minutes to compile
    on 2 cores, hence slow."""
    model = _model(tiny)
    fast = F.FastPath(torch.device("cpu"), F.SETTINGS["cpu"])
    want, got, g_want, g_got = _eager_and_fast_xe(model, fast, _batch(tiny))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    _close_grads(g_want, g_got, rtol=1e-4, atol=1e-6)


# -- the whole sampling pass and the reward as graphs ------------------------------------------------

@pytest.mark.unit
def test_uniforms_drawn_in_advance_are_the_step_by_step_draws(tiny):
    """On a CPU the (max_len, rows) uniforms drawn before decoding are the numbers the step-by-step
    sampler takes from the same generator: the same captions either way (so a seed's captions did
    not change on a CPU)."""
    model = _model(tiny).eval()  # no fresh dropout: the generator's draws are the only randomness
    att = _batch(tiny, seq_per_img=1).att
    cfg = DecodeConfig(method="random", n=3, max_len=tiny.seq_length)
    a = decode(model, att, cfg, generator=torch.Generator().manual_seed(9))
    u = draw_uniforms(24, tiny.seq_length, torch.Generator().manual_seed(9))
    b = decode(model, att, cfg, uniforms=u)
    assert u.shape == (tiny.seq_length, 24)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert a.lengths.float().mean() > 2  # real captions, not all empty


@pytest.mark.integration
def test_the_whole_sampling_pass_is_one_graph_with_the_eager_captions(tiny):
    """``FastPath.decode``: encoding, every step and the packing in one ``fullgraph`` function (a
    host sync in it would be an error): the RL step's sampling (train mode, pre-drawn masks and
    uniforms) and validation's greedy decoding (eval mode, UNK suppressed) give the eager captions
    and, to float32 rounding, log-probs, untrimmed."""
    model = _model(tiny)
    fast = F.FastPath(torch.device("cpu"), AOT)
    att, L = _batch(tiny, seq_per_img=1).att, tiny.seq_length
    gen = torch.Generator().manual_seed(4)
    drop = model.draw_dropout(8, 32, L + 1, att.shape[1], generator=gen)
    u = draw_uniforms(32, L, gen)
    cfg = DecodeConfig(method="random", n=4, max_len=L)
    for c, d, uu in ((cfg, drop, u), (DecodeConfig(method="greedy", max_len=L, unk_id=unk_id(tiny.words)), None, None)):
        model.train(d is not None)
        want = decode(model, att, c, drop=d, uniforms=uu)
        got = fast.decode(model, att, c, drop=d, uniforms=uu)
        T = want.tokens.shape[-1]
        assert got.tokens.shape[-1] == L and torch.equal(got.tokens[..., :T], want.tokens)
        assert torch.equal(got.lengths, want.lengths)
        torch.testing.assert_close(got.logprobs[..., :T + 1], want.logprobs, rtol=1e-5, atol=1e-6)  # float32 rounding


@pytest.mark.unit
def test_the_dpp_weights_compile_without_a_host_sync_and_keep_the_fallback():
    """Under ``torch.compile(fullgraph=True)`` the inverse's pseudo-inverse fallback is chosen by
    ``torch.where`` (the eager ``bad.any()`` would break the graph): singular matrices get the
    pseudo-inverse, regular ones the very inverse the eager path gives."""
    torch.manual_seed(0)
    X = torch.randn(4, 3, 3, dtype=torch.float64)
    A = X @ X.transpose(1, 2) + torch.eye(3, dtype=torch.float64)
    A[1], A[2] = 0.0, 1.0  # singular: zero and rank 1
    inv = torch.compile(_inverse, backend="aot_eager", fullgraph=True)(A)
    want = _inverse(A)  # eager, on the host: the fallback only where needed
    assert torch.equal(inv[[0, 3]], want[[0, 3]])
    torch.testing.assert_close(inv[[1, 2]], torch.linalg.pinv(A[[1, 2]], hermitian=True), rtol=1e-12, atol=1e-15)
    q = torch.rand(6, 5, dtype=torch.float64)
    K = torch.rand(6, 5, 5, dtype=torch.float64)
    K = K + K.transpose(1, 2)
    K[2], q[3] = 1.0, 0.0  # identical samples; zero quality
    got = torch.compile(dpp_weights, backend="aot_eager", fullgraph=True)(q, K)
    torch.testing.assert_close(got, dpp_weights(q, K), rtol=1e-12, atol=1e-15)


@pytest.mark.unit
def test_a_run_whose_cuda_graphs_were_skipped_says_so(capsys):
    """Inductor counts every compiled function it could not put in CUDA graphs; a fast path that
    asked for graphs notes the first skip once and records it for the manifest (here the count is
    raised by hand: no GPU; tests/test_cuda.py checks that a real run records "used")."""
    from torch._dynamo.utils import counters

    fast = F.FastPath(torch.device("cuda"), F.FastSettings(backend="aot_eager", train_mode="reduce-overhead"))
    assert fast.manifest_summary()["fast_cuda_graphs"] == "used" and not fast.check_graphs()
    counters["inductor"]["cudagraph_skips"] += 1
    assert fast.check_graphs() and fast.check_graphs()
    assert fast.manifest_summary()["fast_cuda_graphs"] == "skipped"
    err = capsys.readouterr().err
    assert err.count("without CUDA graphs") == 1
    assert F.FastPath(torch.device("cpu"), AOT).manifest_summary()["fast_cuda_graphs"] == "off"


@pytest.mark.integration
def test_an_rl_epoch_on_the_fast_path_draws_the_eager_captions_and_weights(tiny):
    """A whole (tiny) epoch of R-DPP and of SCST, eager and fast side by side, each training its own
    copy of the model with Adam: at every step 100 % the same captions, the weights within 1e-5
    (the fast reward compiled, on the reference table), and the same parameters after the epoch."""
    for reward in ("dpp", "scst"):
        eager_model = _model(tiny)
        fast_model = _model(tiny)
        kw = dict(data=tiny, cider=TrainCider.for_data(tiny), reward=reward, m=4, max_len=tiny.seq_length)
        eager, fast = RewardStep(**kw), RewardStep(**kw, steps=F.FastPath(torch.device("cpu"), AOT))
        opts = [torch.optim.Adam(m.parameters(), lr=1e-3) for m in (eager_model, fast_model)]
        steps = 0
        for batch in CaptionBatches(tiny, "train", batch_size=8, seq_per_img=1, seed=0).epoch(0):
            batch = batch.to("cpu")
            d_e, d_f = eager.draw(eager_model, batch), fast.draw(fast_model, batch)
            T = d_e.samples.shape[-1]
            assert torch.equal(d_f.samples[..., :T], d_e.samples) and not d_f.samples[..., T:].any()
            w_e, _ = eager.weights(d_e.samples.numpy(), d_e.greedy, tiny.references_ids(batch.index))
            w_f, _ = fast.device_weights(d_f.samples, d_f.greedy, *reference_table(tiny, "cpu").take(batch.index))
            torch.testing.assert_close(w_f, w_e, rtol=1e-5, atol=1e-5)
            sides = ((eager, eager_model, d_e, w_e, opts[0]), (fast, fast_model, d_f, w_f, opts[1]))
            for step, model, d, w, opt in sides:
                opt.zero_grad()
                step.loss(model, batch, d, w)[0].backward()
                opt.step()
            steps += 1
        assert steps == 2
        # alpha_net.bias aside: the attention softmax ignores a shift, so its gradient is rounding
        # noise around 0, which Adam scales up to lr-sized steps of either sign
        params = [{k: p for k, p in m.named_parameters() if k != "alpha_net.bias"} for m in (eager_model, fast_model)]
        _close_grads(*params)


@pytest.mark.integration
def test_validation_on_the_fast_path_gives_the_eager_cider(tiny, tmp_path):
    """Validation's greedy pass compiled as one graph and its CIDEr-D on the device against the
    reference table, its last partial batch padded to the full one's shapes: the eager sum to 1e-9."""
    model = att2in_for(tiny, 32, 0.3)
    model.load_state_dict(scoring_att2in(tiny, tmp_path / "m"))
    images = tiny.split_indices("val")  # 6: batches of 4 and 2, the last padded to 4 (one graph each)
    want = greedy_cider(model, tiny, images, batch_size=4)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    got = greedy_cider(model, tiny, images, batch_size=4, steps=F.FastPath(torch.device("cpu"), AOT))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= graphs + 2  # the greedy pass, the scores
    assert got.keys() == want.keys() and got["_n"] == want["_n"] == len(images)
    assert got["val_cider"] == pytest.approx(want["val_cider"], rel=1e-9, abs=1e-12) and want["val_cider"] > 0.01


# -- one owner: the steps chosen once -----------------------------------------------------------------

@pytest.mark.unit
def test_the_static_cache_is_a_named_state_that_beam_search_can_reorder(tiny):
    """The Transformer's fixed-size state is a ``StaticKV`` (positions and caches), moved on by
    ``update`` and reordered row-wise by ``select_rows`` as any state."""
    from rdpp_cli.models.base import select_rows

    model = _any_model("transformer", tiny).eval()
    state = model.init_static_state(3, 5)
    caches = tuple(c + i for i, c in enumerate(state.caches))
    moved = state.update(caches)
    assert isinstance(moved, StaticKV) and moved.at.tolist() == [1, 1, 1] and moved.caches[2].eq(2).all()
    picked = select_rows(moved._replace(at=torch.tensor([0, 4, 2])), torch.tensor([2, 2, 0]))
    assert isinstance(picked, StaticKV) and picked.at.tolist() == [2, 2, 0] and len(picked.caches) == 4


@pytest.mark.unit
def test_the_fast_path_is_only_built_for_a_model_that_speaks_the_datas_words(tiny):
    """The fast reward scores the model's ids as the data's words: a model with a token bridge of its
    own that claimed the fast path is refused where the steps are chosen; the hf model (which has
    one) has no fast path: --fast on is one line, auto is eager."""
    from rdpp_cli.models.att2in import Att2in
    from rdpp_cli.models.bridge import WordBridge

    class Bridged(Att2in):
        def bridge(self, words, seq_length):
            return WordBridge(words, seq_length)

    bridged = Bridged(_model(tiny).config)
    with pytest.raises(TypeError, match="has a token bridge of its own, so it must not claim supports_fast"):
        F.run_steps("on", "cpu", bridged)
    assert isinstance(F.run_steps("on", "cpu", _model(tiny)), F.FastPath)
    assert type(F.run_steps("off", "cpu", bridged)) is F.Steps
    hf_cls = model_spec("hf").cls
    assert not hf_cls.supports_fast and getattr(hf_cls, "bridge", None) is not None


@pytest.mark.integration
def test_finetune_resolves_fast_once_with_the_model_and_the_probe_times_that_step(tmp_path, monkeypatch):
    """Where --fast auto is on for the model (here Att2in on the CPU, as on CUDA), the precision
    probe is asked to time the fast step, the step the run takes, and the manifest says on."""
    import dataclasses

    from helpers import tiny_workspace
    from rdpp_cli.models.registry import MODELS
    from rdpp_cli.training import finetune as FT

    ws = tiny_workspace(tmp_path / "ws", xe_epochs=1)
    monkeypatch.setitem(MODELS, "att2in", dataclasses.replace(MODELS["att2in"], fast_auto=("cpu",)))
    probed = []

    def probe(option, device, shape=None):
        probed.append(shape.fast)
        raise Crash("probed")

    monkeypatch.setattr(FT, "resolve_precision", probe)
    with pytest.raises(Crash):
        finetune(ws / "xe" / "att2in-small-v1", reward="dpp", m=2, epochs=1, device="cpu", fast="auto",
                 workspace=ws)
    assert probed == ["on"]


@pytest.mark.unit
def test_compiled_code_is_kept_in_rdpps_cache_folder_unless_the_user_chose_one(tmp_path, monkeypatch):
    """The fast path turns on inductor's FX-graph cache and AOT autograd's cache in
    $XDG_CACHE_HOME/rdpp/inductor (not /tmp), before the first compile; a $TORCHINDUCTOR_CACHE_DIR
    the user set is kept."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    import subprocess
    import sys

    show = ("import os, torch; from rdpp_cli.training import fast as F; F.FastPath(torch.device('cpu')); "
            "from torch._inductor.runtime.cache_dir_utils import cache_dir; print(cache_dir())")
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    fresh = subprocess.run([sys.executable, "-c", show], env={**env, "XDG_CACHE_HOME": str(tmp_path / "new")},
                           capture_output=True, text=True, check=True)  # a new process: torch not yet imported
    assert fresh.stdout.strip() == str(tmp_path / "new" / "rdpp" / "inductor")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    monkeypatch.setattr(functorch_config, "enable_autograd_cache", False)
    fast = F.FastPath(torch.device("cpu"), AOT)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "xdg" / "rdpp" / "inductor") == str(fast.cache)
    assert inductor_config.fx_graph_cache and functorch_config.enable_autograd_cache
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(tmp_path / "xdg" / "rdpp" / "inductor")  # where inductor writes
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert F.FastPath(torch.device("cpu"), AOT).cache == tmp_path / "mine"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.integration
def test_a_runs_compile_seconds_are_in_its_manifest_and_summary(tiny, tmp_path, capsys):
    """``compile_s``: the seconds torch spent compiling the run's graphs (its own timers), in the
    manifest's summary and the closing table; nothing compiled, nothing counted."""
    opts = TrainLoopOptions(epochs=1, batch_size=8, lr=1e-3, val_images=0, device="cpu", seed=0)
    torch._dynamo.reset()
    fast = F.FastPath(torch.device("cpu"), F.FastSettings(backend="aot_eager", log_every=2))
    assert fast.compile_s == 0.0
    art = TrainingRecipe(stage="xe", model=_model(tiny), data=tiny, out_dir=tmp_path / "m", opts=opts,
                         step_fn=XELoss(steps=fast), inputs=[tiny.artifact], manifest_config={}, steps=fast).run()
    took = art.manifest["summary"]["compile_s"]
    assert took > 0.05 and took == round(fast.compile_s, 2)
    assert f"compiling took {fast.compile_s:.1f} s" in capsys.readouterr().out.replace("\n", " ").replace("│", "")
