"""The CUDA path gives the CPU's numbers, and every stage runs on a GPU.

Skipped on machines without a CUDA GPU (CI has none); run on a GPU machine with
``python -m pytest tests/test_cuda.py``. The model is compared in float64, so agreement is to
rounding, not to TF32 tolerances.
"""

from __future__ import annotations

import json

import pytest
import torch

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.data.toy import prepro_toy
from rdpp_cli.decoding.decode import DecodeConfig, decode
from rdpp_cli.models.att2in import Att2in, Att2inConfig
from rdpp_cli.models.ops import AttScores
from rdpp_cli.models.checkpoint import load_model
from rdpp_cli.training.rewards import dpp_weights, pg_loss

pytestmark = pytest.mark.cuda

V, ATT, R, L = 40, 24, 6, 9


def _model(seed: int = 0) -> Att2in:
    torch.manual_seed(seed)
    cfg = Att2inConfig(vocab_size=V, input_encoding_size=32, rnn_size=32, att_hid_size=32,
                       att_feat_size=ATT, drop_prob_lm=0.0, seq_length=L)
    return Att2in(cfg).double().eval()


def _inputs(B: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    att = torch.rand(B, R, ATT, generator=g, dtype=torch.float64)
    seqs = torch.randint(1, V + 1, (B, 3, L), generator=g)
    seqs[:, :, 6:] = 0  # captions of 6 words
    seqs[0, 0, 2:] = 0  # and one of 2
    return att, seqs


@pytest.mark.unit
def test_teacher_forced_logprobs_and_gradients_match_the_cpu():
    cpu = _model()
    gpu = _model().cuda()
    att, seqs = _inputs(4)
    outs = {}
    for name, net, dev in (("cpu", cpu, "cpu"), ("cuda", gpu, "cuda")):
        net.train()
        tok, mask = net.token_logprobs(att.to(dev), seqs.to(dev))
        w = torch.linspace(-1, 1, tok.shape[0], dtype=torch.float64, device=dev)
        pg_loss(tok, mask, w).backward()
        outs[name] = (tok.detach().cpu(), mask.cpu(), {k: p.grad.cpu() for k, p in net.named_parameters()})
    tok_c, mask_c, grad_c = outs["cpu"]
    tok_g, mask_g, grad_g = outs["cuda"]
    assert torch.equal(mask_c, mask_g)
    torch.testing.assert_close(tok_g, tok_c, rtol=1e-10, atol=1e-10)
    assert grad_c.keys() == grad_g.keys()
    for k in grad_c:
        torch.testing.assert_close(grad_g[k], grad_c[k], rtol=1e-8, atol=1e-10, msg=k)
    assert any(g.abs().sum() > 0 for g in grad_c.values())


@pytest.mark.unit
def test_attention_scores_gradient_on_cuda():
    g = torch.Generator(device="cuda").manual_seed(0)
    k2 = torch.randn(2, 5, 7, dtype=torch.float64, device="cuda", generator=g, requires_grad=True)
    q = torch.randn(2, 3, 7, dtype=torch.float64, device="cuda", generator=g, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, device="cuda", generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(AttScores.apply, (k2, q, w))


@pytest.mark.unit
@pytest.mark.parametrize("cfg", [
    DecodeConfig(method="greedy"),
    DecodeConfig(method="beam", beam=4, n=3, max_len=L),
    DecodeConfig(method="dbs", beam=2, groups=3, n=6, max_len=L, diversity_lambda=0.5),
], ids=["greedy", "beam", "dbs"])
def test_deterministic_decoding_matches_the_cpu(cfg):
    att, _ = _inputs(8)
    cpu = decode(_model(), att, cfg)
    gpu = decode(_model().cuda(), att.cuda(), cfg)
    assert torch.equal(gpu.tokens.cpu(), cpu.tokens)
    torch.testing.assert_close(gpu.logprobs.cpu(), cpu.logprobs, rtol=1e-6, atol=1e-6)  # float32 out


@pytest.mark.unit
def test_random_sampling_on_cuda_follows_the_model():
    """First words of 20,000 samples on the GPU against the model's own first-step distribution."""
    net = _model().cuda()
    att = _inputs(1)[0].cuda()
    n = 20000
    out = decode(net, att, DecodeConfig(method="random", n=n, max_len=L),
                 generator=torch.Generator(device="cuda").manual_seed(0))
    first = out.tokens.reshape(n, -1)[:, 0].cpu()
    with torch.no_grad():
        probs = net(att, torch.zeros(1, 1, L, dtype=torch.long, device="cuda"))[0, 0].exp().cpu()
    freq = torch.bincount(first, minlength=V + 1).double() / n
    assert 0.5 * (freq - probs).abs().sum() < 0.03  # total variation; ~0.01 expected from noise


@pytest.mark.integration
def test_inductor_compiles_static_decode_at_the_papers_shapes_on_cuda():
    """Vocabulary 9,488, 250 rows, 16 steps: the sampling pass the fast RL step compiles (a cumsum over
    the whole vocabulary made inductor's Triton code generation fail here), with the eager captions."""
    from test_sampling_compiles import compiled_decode_agrees

    compiled_decode_agrees("cuda", min_same=0.95)


@pytest.mark.unit
def test_dpp_weights_on_cuda_equal_the_cpu():
    g = torch.Generator().manual_seed(0)
    q = torch.rand(16, 5, generator=g, dtype=torch.float64) * 3
    X = torch.rand(16, 5, 8, generator=g, dtype=torch.float64)
    S = 10 * X @ X.transpose(1, 2) / (X.norm(dim=-1, keepdim=True) * X.norm(dim=-1)[:, None])
    torch.testing.assert_close(dpp_weights(q.cuda(), S.cuda()).cpu(), dpp_weights(q, S), rtol=1e-9, atol=1e-12)


@pytest.mark.integration
def test_the_stages_run_on_cuda_and_their_checkpoints_load_on_the_cpu(tmp_path):
    """Eager stages (the fast path compiles for a minute; its own tests are below): XE, R-DPP, sampling."""
    from rdpp_cli.decoding.sample import sample
    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    ws = tmp_path / "ws"
    data = prepro_toy(workspace=ws, images=200, seed=5)
    xe = train_xe(data.path, workspace=ws, preset="small", epochs=1, batch_size=40, lr=1e-3, val_images=20,
                  device="cuda", fast="off")
    dpp = finetune(xe.path, data=data.path, workspace=ws, reward="dpp", m=3, epochs=1, batch_size=40,
                   val_images=20, device="cuda", fast="off")
    assert read_artifact(dpp.path, "rdpp.model").manifest["config"]["reward"] == "dpp"
    for method in ("random", "beam", "nucleus", "dbs"):
        extra = {"nucleus": {"top_p": 0.9}, "beam": {"beam": 4}, "dbs": {"groups": 2, "beam": 2}}.get(method, {})
        art = sample(dpp.path, data=data.path, workspace=ws, n=4, method=method, device="cuda", **extra)
        recs = json.loads((art.path / "samples.json").read_text())
        assert len(recs) == 20 and all(len(r["captions"]) == 4 for r in recs), method
    net, vocab, _ = load_model(dpp.path / "checkpoints" / "best.pt", device="cpu")
    assert next(net.parameters()).device.type == "cpu" and len(vocab) == net.config.vocab_size


@pytest.mark.unit
def test_on_policy_replay_on_cuda(tmp_path):
    """The RL step's on-policy property on a GPU: dropout masks drawn on the device, sampling with
    them, and the replayed teacher-forced pass give the same log-probs (float32, no TF32)."""
    from rdpp_cli.data.dataset import DataArtifact
    from rdpp_cli.data.loader import CaptionBatches
    from rdpp_cli.metrics.train_cider import TrainCider
    from rdpp_cli.training.finetune import RewardStep
    from helpers import write_tiny_data

    data = DataArtifact.open(write_tiny_data(tmp_path / "tiny", n_train=12, n_val=4))
    torch.manual_seed(0)
    model = Att2in(Att2inConfig(vocab_size=data.vocab_size, input_encoding_size=32, rnn_size=32, att_hid_size=32,
                                att_feat_size=16, drop_prob_lm=0.5, seq_length=8)).cuda().train()
    batch = next(iter(CaptionBatches(data, "train", batch_size=6, seq_per_img=1, seed=0).epoch(0))).to("cuda")
    step = RewardStep(data=data, cider=TrainCider.for_data(data), reward="dpp", m=4, max_len=8)
    d = step.sample(model, batch)
    assert d.drop.embed.is_cuda and d.samples.is_cuda
    token_logp, mask = step.policy_logprobs(model, batch, d)
    on = mask.bool()
    assert torch.allclose(token_logp[on], d.logprobs.reshape(token_logp.shape)[on], atol=1e-4, rtol=0)
    loss, _ = step.loss(model, batch, d, step.weights(d.samples.cpu().numpy(), None,
                                                      data.references_ids(batch.index))[0])
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


# -- the training fast path (--fast on: rdpp_cli/training/fast.py) on a GPU -----------------------------
# Its settings for CUDA: the teacher-forced pass compiled into CUDA graphs ("reduce-overhead"), the
# decoding step compiled, fused Adam. One fast path for the module, so each shape compiles once.

@pytest.fixture(scope="module")
def gpu_fast():
    from rdpp_cli.training import fast as F

    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield F.fast_path("on", "cuda")
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def gpu_tiny(tmp_path_factory):
    from rdpp_cli.data.dataset import DataArtifact
    from helpers import write_tiny_data

    return DataArtifact.open(write_tiny_data(tmp_path_factory.mktemp("tiny") / "tiny", n_train=16, n_val=6, n_test=2))


def _gpu_model(data, seed: int = 0) -> Att2in:
    from helpers import att2in_for

    torch.manual_seed(seed)
    return att2in_for(data, 32, 0.5).cuda().train()


def _gpu_batch(data, seq_per_img: int):
    from rdpp_cli.data.loader import CaptionBatches

    return next(iter(CaptionBatches(data, "train", batch_size=8, seq_per_img=seq_per_img, seed=0).epoch(0))).to("cuda")


def _loss_and_grads(model, tok, mask):
    loss = -tok.sum() / mask.sum()
    loss.backward()
    g = {k: p.grad.clone() for k, p in model.named_parameters() if k != "alpha_net.bias"}  # (a shift: rounding noise)
    model.zero_grad(set_to_none=True)
    return loss.detach(), g


@pytest.mark.integration
def test_the_fast_xe_pass_in_cuda_graphs_gives_the_eager_numbers(gpu_fast, gpu_tiny):
    """Three steps (CUDA graphs warm up, record, then replay), each with fresh dropout masks drawn
    before the pass: loss and gradients equal the eager pass's with the same masks (float32)."""
    assert gpu_fast is not None and gpu_fast.settings.train_mode == "reduce-overhead"
    model = _gpu_model(gpu_tiny)
    batch = _gpu_batch(gpu_tiny, 5)
    for _ in range(3):
        drop = gpu_fast.xe_dropout(model, batch.labels, batch.att.shape[1])
        assert drop.embed.is_cuda and drop.embed.shape[1] == gpu_tiny.seq_length + 1
        want, g_want = _loss_and_grads(model, *model.token_logprobs(batch.att, batch.labels, drop=drop))
        gpu_fast.begin_step()
        got, g_got = _loss_and_grads(model, *gpu_fast.token_logprobs(model, batch.att, batch.labels, None, drop))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
        for k in g_want:
            torch.testing.assert_close(g_got[k], g_want[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.integration
def test_fast_xe_training_steps_follow_the_eager_steps(gpu_fast, gpu_tiny):
    """Four whole steps (the fast XE loss in CUDA graphs, fused Adam) against eager steps (eager pass
    with the same masks, Adam unfused), from the same weights: the same losses and weights."""
    from rdpp_cli.training.xe import fast_xe_loss

    eager, fast = _gpu_model(gpu_tiny), _gpu_model(gpu_tiny)
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-4)
    opt_f = gpu_fast.optimizer(fast.parameters(), 1e-4)
    assert opt_f.defaults["fused"]
    batch = _gpu_batch(gpu_tiny, 5)
    step = fast_xe_loss(gpu_fast)
    for _ in range(4):
        state = torch.cuda.get_rng_state()
        tok, mask = eager.token_logprobs(batch.att, batch.labels,
                                         drop=gpu_fast.xe_dropout(eager, batch.labels, batch.att.shape[1]))
        want = -tok.sum() / mask.sum()
        torch.cuda.set_rng_state(state)  # the fast step draws the very same masks
        gpu_fast.begin_step()
        got = step(fast, batch)
        for m, opt, loss in ((eager, opt_e, want), (fast, opt_f, got)):
            loss.backward()
            torch.nn.utils.clip_grad_value_(m.parameters(), 0.1)
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=0)
    pe, pf = dict(eager.named_parameters()), dict(fast.named_parameters())
    for k in pe:
        if k != "alpha_net.bias":
            torch.testing.assert_close(pf[k], pe[k], rtol=0, atol=1e-5, msg=k)


@pytest.mark.integration
@pytest.mark.parametrize("reward", ["dpp", "scst"])
def test_the_fast_rl_step_on_cuda_gives_the_eager_numbers(gpu_fast, gpu_tiny, reward):
    """Compiled decoding steps, the reward on the GPU, the compiled policy pass: the captions of the
    eager step, its weights (to 1e-6, float32) and, on the same captions, its loss and gradients."""
    from rdpp_cli.metrics.train_cider import TrainCider
    from rdpp_cli.metrics.train_cider_torch import references_tensor
    from rdpp_cli.training.finetune import RewardStep

    model = _gpu_model(gpu_tiny)
    batch = _gpu_batch(gpu_tiny, 1)
    kw = dict(data=gpu_tiny, cider=TrainCider.for_data(gpu_tiny), reward=reward, m=4, max_len=gpu_tiny.seq_length)
    eager, fast = RewardStep(**kw), RewardStep(**kw, steps=gpu_fast)
    gpu_fast.begin_step()
    d = fast.draw(model, batch)
    d_e = eager.draw(model, batch)
    T = d_e.samples.shape[-1]
    same = (d.samples[..., :T] == d_e.samples).all(-1).float().mean()
    assert same >= 0.9 and not d.samples[..., T:].any()  # float rounding may flip a rare draw
    refs = gpu_tiny.references_ids(batch.index)
    w, logs = eager.weights(d.samples.cpu().numpy(), d.greedy, refs)
    w_t, logs_t = fast.device_weights(d.samples, d.greedy, *references_tensor(refs, "cuda"))
    torch.testing.assert_close(w_t.cpu(), w, rtol=1e-6, atol=1e-6)
    assert all(float(logs_t[k]) == pytest.approx(logs[k], rel=1e-9, abs=1e-12) for k in logs)
    fixed = torch.linspace(-1.0, 1.0, w.numel()).view(w.shape)
    want = eager.loss(model, batch, d, fixed)[0]
    want.backward()
    g_want = {k: p.grad.clone() for k, p in model.named_parameters() if k != "alpha_net.bias"}
    model.zero_grad(set_to_none=True)
    gpu_fast.begin_step()
    got = fast.loss(model, batch, d, fixed)[0]
    got.backward()
    torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-7)
    for k, g in g_want.items():
        torch.testing.assert_close(dict(model.named_parameters())[k].grad, g, rtol=1e-4, atol=1e-6, msg=k)
    model.zero_grad(set_to_none=True)


@pytest.mark.unit
def test_the_training_reward_on_cuda_equals_the_numpy_one(gpu_tiny):
    import numpy as np

    from rdpp_cli.metrics.self_cider import self_cider_from_kernel
    from rdpp_cli.metrics.train_cider import TrainCider
    from rdpp_cli.metrics import train_cider_torch as TT

    cider = TrainCider.for_data(gpu_tiny)
    rng = np.random.default_rng(0)
    B, M, Lw = 6, 5, gpu_tiny.seq_length
    words = rng.integers(0, Lw + 1, (B, M, 1))
    samples = rng.integers(1, gpu_tiny.vocab_size + 1, (B, M, Lw)) * (np.arange(Lw) < words)
    refs = gpu_tiny.references_ids(gpu_tiny.split_indices("train")[:B])
    q, S = cider.score_and_pairwise(samples, refs)
    q_t, S_t = TT.DeviceTrainCider(cider, "cuda").score_and_pairwise(torch.from_numpy(samples).cuda(),
                                                                      *TT.references_tensor(refs, "cuda"))
    np.testing.assert_allclose(q_t.cpu().numpy(), q, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(S_t.cpu().numpy(), S, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(TT.self_cider_from_kernel(S_t).cpu().numpy(), self_cider_from_kernel(S), rtol=1e-9,
                               atol=1e-12)


@pytest.mark.integration
def test_a_toy_run_with_fast_on_on_cuda(tmp_path, gpu_tiny):
    """train-xe and finetune --fast on, beside --fast off: recorded in the manifests; the XE losses
    within 5 % (on CUDA the fast XE step draws its dropout another way: the same distribution, another
    stream); R-DPP from the same XE model samples with the same generator: losses within 1e-3."""
    import pandas as pd

    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    kw = dict(preset="small", epochs=2, batch_size=8, val_images=4, lr=2e-3, device="cuda", seed=1)
    xe = {f: train_xe(gpu_tiny.path, out=tmp_path / f"xe-{f}", fast=f, **kw) for f in ("off", "on")}
    ft = {f: finetune(xe["off"].path, data=gpu_tiny.path, out=tmp_path / f"dpp-{f}", reward="dpp", m=3, epochs=1,
                      batch_size=8, val_images=4, device="cuda", seed=2, fast=f) for f in ("off", "on")}
    assert xe["on"].manifest["config"]["fast"] == "on" and ft["on"].manifest["config"]["fast"] == "on"
    assert xe["on"].manifest["summary"]["fast_cuda_graphs"] == "used"  # torch did not skip the graphs
    lx = {f: pd.read_csv(a.path / "metrics.csv")["loss"].to_numpy() for f, a in xe.items()}
    lf = {f: pd.read_csv(a.path / "metrics.csv")["loss"].to_numpy() for f, a in ft.items()}
    assert abs(lx["on"][0] / lx["off"][0] - 1) < 0.05
    assert abs(lf["on"][0] / lf["off"][0] - 1) < 1e-3
