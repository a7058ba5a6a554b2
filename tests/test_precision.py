"""--precision fp32|bf16|fp16|auto: autocast of the model only (weights, optimizer state, checkpoints,
rewards and metrics stay float32/float64), the numerics of a bf16 step against fp32 on the same batch,
the on-policy replay under bf16, exact resume (with fp16's loss scaler), and the manifests."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.loader import Batch, CaptionBatches
from rdpp_cli.errors import RdppError
from rdpp_cli.metrics.train_cider import TrainCider
from rdpp_cli.models.att2in import Att2in
from rdpp_cli import precision as L  # the leaf: autocast, dtypes, native bf16
from rdpp_cli import precision_probe as P  # --precision auto: the probe and its cache
from rdpp_cli.training.finetune import RewardStep, finetune
from rdpp_cli.training.xe import train_xe, xe_loss

from helpers import Crash, att2in_for, state_dict, tiny_workspace


os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    return tiny_workspace(tmp_path_factory.mktemp("ws"))


@pytest.fixture(scope="module")
def tiny(ws) -> DataArtifact:
    return DataArtifact.open(ws / "data" / "tiny-v1")


def _model(d: DataArtifact, size: int = 64, dropout: float = 0.0, seed: int = 0) -> Att2in:
    torch.manual_seed(seed)
    return att2in_for(d, size, dropout)


def _batch(d: DataArtifact, seq_per_img: int = 5):
    """The first training batch, on the CPU with float32 features (the loader keeps the file's float16)."""
    return next(iter(CaptionBatches(d, "train", batch_size=8, seq_per_img=seq_per_img, seed=0).epoch(0))).to("cpu")


# -- choosing the precision ------------------------------------------------------------------------------

@pytest.mark.unit
def test_auto_is_bf16_only_where_the_hardware_computes_it(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(P, "probe_cpu_bf16", lambda shape: {"fp32_s": 2.41, "bf16_s": 1.39})  # the EPYC's XE step
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert P.resolve_precision("auto", "cpu") == "bf16"
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"amx_bf16", "amx_tile"}))
    assert P.resolve_precision("auto", "cpu") == "bf16"
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512bw"}))  # no native bf16
    assert P.resolve_precision("auto", "cpu") == "fp32"
    # an explicit choice is kept whatever the hardware; tf32 is a GPU's alone
    assert [P.resolve_precision(p, "cpu") for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]
    with pytest.raises(RdppError, match="--precision 'half' is not a precision; use one of fp32, tf32, bf16, fp16, "):
        P.resolve_precision("half", "cpu")
    with pytest.raises(RdppError, match="--precision tf32 is a CUDA GPU's TensorFloat-32 matrix arithmetic; on cpu"):
        P.resolve_precision("tf32", "cpu")
    assert P.resolve_precision("tf32", "cuda") == "tf32"
    # the options classes repeat the default (they cannot import torch): the two must agree
    from rdpp_cli.training.options import XEOptions

    assert XEOptions.__dataclass_fields__["precision"].default == L.DEFAULT_PRECISION == "fp32"


@pytest.mark.unit
def test_auto_on_cuda_measures_the_runs_step_and_is_fp32_until_measured(monkeypatch, tmp_path):
    """Issue 34: not bf16 from the compute capability alone. A GPU with bf16 units (8.0+) times the
    run's own step (model, batch, fast path) once per kind of run and caches the choice; before 8.0 it
    is fp32 without timing. Only the timings are faked here."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    calls = []
    timings = iter([{"fp32_s": 0.0414, "bf16_s": 0.0442}, {"fp32_s": 0.050, "bf16_s": 0.040}])  # the H200's XE step
    monkeypatch.setattr(P, "probe_bf16", lambda shape, device: calls.append((shape, str(device))) or next(timings))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))  # V100
    assert P.resolve_precision("auto", "cuda") == "fp32" and calls == []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # H100/H200
    run = P.ProbeShape(model="updown", preset="small", images=50, fast="on")
    assert P.resolve_precision("auto", "cuda", run) == "fp32"  # bf16 measured slower: fp32
    assert P.resolve_precision("auto", "cuda", run) == "fp32" and calls == [(run, "cuda")]  # cached
    key = P.probe_key(run, "cuda")
    assert key.startswith("NVIDIA H200 (cuda) | ") and "updown small" in key and "batch 50x5x8" in key
    assert "fast on" in key and json.loads(P.cache_path().read_text())[key]["choice"] == "fp32"
    other = P.ProbeShape(model="updown", preset="small", images=10, fast="on")  # another batch: measured anew
    assert P.resolve_precision("auto", "cuda", other) == "bf16" and len(calls) == 2


@pytest.mark.unit
def test_the_probe_builds_the_runs_model_from_the_registry(tiny):
    """``ProbeShape.of`` a model built for a run names its registry line and config, and the probe
    builds that very model (another class, other sizes than Att2in's paper preset)."""
    from rdpp_cli.models.registry import build

    net = build("transformer", "small", vocab_size=tiny.vocab_size, att_feat_size=tiny.att_dim, seq_length=5)
    shape = P.ProbeShape.of(net, images=3, seq_per_img=2, regions=8, steps=5)
    probe = P.probe_model(shape)
    assert type(probe) is type(net) and probe.config == net.config and probe.training
    assert (shape.model, shape.images, shape.seq_per_img) == ("transformer", 3, 2)
    g = torch.Generator().manual_seed(0)
    att = torch.randn(3, 8, tiny.att_dim, generator=g)
    words = torch.randint(1, tiny.vocab_size + 1, (3, 2, 5), generator=g)
    loss = P.probe_step(probe, att, words, torch.optim.Adam(probe.parameters(), lr=1e-3), "fp32")
    assert 0 < loss < 2 * math.log(tiny.vocab_size + 1)


@pytest.mark.unit
def test_auto_on_a_cpu_chooses_bf16_only_when_measurably_faster():
    """The decision from timings alone: bf16 needs a speed-up of BF16_MIN_SPEEDUP (1.10) or more."""
    assert P.BF16_MIN_SPEEDUP == 1.10
    assert P.choose_precision(2.41, 1.39) == "bf16"  # AMD EPYC with AVX-512 BF16: 1.73x
    assert P.choose_precision(2.97, 2.42) == "bf16"  # Intel Xeon with AMX: 1.23x
    assert P.choose_precision(1.12, 1.0) == "bf16"
    assert P.choose_precision(1.08, 1.0) == "fp32"  # 8 %: within a shared machine's noise
    assert P.choose_precision(1.0, 1.3) == "fp32"  # bf16 slower
    assert P.choose_precision(1.0, None) == "fp32"  # bf16 abandoned (over 3x fp32's time)
    assert P.choose_precision(1.0, 0.8, min_speedup=1.3) == "fp32"


@pytest.mark.unit
def test_auto_on_a_cpu_measures_once_and_caches_per_machine_and_widths(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    calls = []

    def probe(timings):
        return lambda shape: calls.append(shape) or dict(timings)

    monkeypatch.setattr(P, "probe_cpu_bf16", probe({"fp32_s": 2.97, "bf16_s": 2.42}))
    assert P.resolve_precision("auto", "cpu") == "bf16"
    assert P.resolve_precision("auto", "cpu") == "bf16"
    assert calls == [P.ProbeShape()]  # measured once: the second run read the cache
    path = tmp_path / "rdpp" / "precision.json"
    assert P.cache_path() == path
    entry = json.loads(path.read_text())[P.cpu_key(P.ProbeShape())]
    assert (entry["fp32_s"], entry["bf16_s"], entry["choice"], entry["min_speedup"]) == (2.97, 2.42, "bf16", 1.10)
    key = P.cpu_key(P.ProbeShape())
    assert f"torch {torch.__version__}" in key and f"{torch.get_num_threads()} threads" in key

    # other widths are another entry, measured anew; the first one stays
    monkeypatch.setattr(P, "probe_cpu_bf16", probe({"fp32_s": 1.0, "bf16_s": 0.97}))
    toy = P.ProbeShape(rnn_size=256, att_feat_size=22, regions=64, vocab_size=42)
    assert P.resolve_precision("auto", "cpu", toy) == "fp32"
    assert len(calls) == 2 and len(json.loads(path.read_text())) == 2
    assert json.loads(path.read_text())[P.cpu_key(toy)]["choice"] == "fp32"

    # an unreadable cache is measured again and rewritten
    path.write_text("{not json")
    assert P.resolve_precision("auto", "cpu") == "fp32"
    assert len(calls) == 3 and json.loads(path.read_text())[key]["choice"] == "fp32"

    # a CPU without bf16 arithmetic is fp32 without measuring
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert P.resolve_precision("auto", "cpu", P.ProbeShape(rnn_size=128)) == "fp32"
    assert len(calls) == 3


@pytest.mark.unit
def test_a_cache_that_cannot_be_written_is_said_so_and_leaves_no_file(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    calls = []
    monkeypatch.setattr(P, "probe_cpu_bf16", lambda shape: calls.append(shape) or {"fp32_s": 2.0, "bf16_s": 1.0})
    (tmp_path / "rdpp" / "precision.json").mkdir(parents=True)  # a folder where the cache file goes
    for run in (1, 2):
        assert P.resolve_precision("auto", "cpu") == "bf16" and len(calls) == run  # measured again
        err = capsys.readouterr().err
        assert "not cached" in err and "cannot be written" in err and "cached in" not in err
        assert [p.name for p in (tmp_path / "rdpp").iterdir()] == ["precision.json"]  # no temporary file
    shutil.rmtree(tmp_path / "rdpp" / "precision.json")
    assert P.resolve_precision("auto", "cpu") == "bf16" and "cached in" in capsys.readouterr().err


@pytest.mark.unit
def test_the_cache_key_holds_a_hash_of_a_large_model_config(monkeypatch, tmp_path):
    """A Hugging Face model's config holds its whole config and tokenizer files (megabytes for GPT-2's):
    the key and the entry hold their hash, and another tokenizer is another key."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    monkeypatch.setattr(P, "probe_cpu_bf16", lambda shape: {"fp32_s": 2.0, "bf16_s": 1.9})

    def hf(vocab: str) -> P.ProbeShape:
        return P.ProbeShape(model="hf", config=(("hf_config", {"n_embd": 768, "architectures": ["X"] * 1000}),
                                                ("tokenizer_files", {"vocab.json": vocab * 1_000_000})))
    big, other = hf("a"), hf("b")
    assert len(P.cpu_key(big)) < 300 and P.cpu_key(big) != P.cpu_key(other)
    assert P.model_hash(big) in P.cpu_key(big) and P.cpu_key(big) == P.cpu_key(hf("a"))
    assert P.resolve_precision("auto", "cpu", big) == "fp32"
    path = tmp_path / "rdpp" / "precision.json"
    assert path.stat().st_size < 2000 and json.loads(path.read_text())[P.cpu_key(big)]["shape"]["config"] == P.model_hash(big)


@pytest.mark.unit
def test_auto_resolves_to_fp32_or_bf16_on_this_machine(monkeypatch, tmp_path):
    """The real probe, at small widths (no timing is asserted): a choice, and where the CPU has bf16
    arithmetic, the cached timings it was made from."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    small = P.ProbeShape(rnn_size=64, att_feat_size=64, regions=16, vocab_size=100, images=2, steps=4)
    choice = P.resolve_precision("auto", "cpu", small)
    assert choice in ("fp32", "bf16")
    if L.native_bf16("cpu"):
        entry = json.loads((tmp_path / "rdpp" / "precision.json").read_text())[P.cpu_key(small)]
        assert entry["fp32_s"] > 0 and entry["choice"] == choice == P.choose_precision(entry["fp32_s"], entry["bf16_s"])


@pytest.mark.unit
def test_the_auto_probe_times_the_models_own_xe_step(tiny):
    """``probe_step`` is a training step of rdpp's Att2in (not a replica of its arithmetic): on the
    same weights, captions and dropout draws it computes ``xe_loss``'s loss and ends at the weights
    an XE step with the same Adam ends at; ``probe_model`` leaves the caller's random state alone."""
    shape = P.ProbeShape(rnn_size=32, att_feat_size=tiny.att_dim, regions=8, vocab_size=tiny.vocab_size,
                         images=3, seq_per_img=2, steps=5)
    torch.manual_seed(11)
    before = torch.random.get_rng_state()
    model = P.probe_model(shape)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert isinstance(model, Att2in) and model.training and model.config.rnn_size == 32
    twin = P.probe_model(shape)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    g = torch.Generator().manual_seed(0)
    att = torch.randn(3, 8, tiny.att_dim, generator=g).relu_()
    words = torch.randint(1, tiny.vocab_size + 1, (3, 2, 5), generator=g)
    batch = Batch(index=np.arange(3), fc=att.mean(1), att=att, att_mask=None, labels=words, epoch=0, batch=0,
                  global_images=3)
    opt_a, opt_b = (torch.optim.Adam(m.parameters(), lr=1e-2) for m in (model, twin))
    torch.manual_seed(5)
    got = P.probe_step(model, att, words, opt_a, "fp32")
    torch.manual_seed(5)
    want = xe_loss(twin, batch)
    want.backward()
    opt_b.step()
    assert got == float(want.detach()) and got > 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
    start = P.probe_model(shape)
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), start.parameters()))  # a step was taken


# -- numerics ---------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_a_bf16_xe_step_is_within_tolerance_of_fp32_on_the_same_batch(tiny):
    """Stated tolerance: the bf16 loss within 1e-2 relative of fp32's, every parameter's gradient
    within 1e-1 in relative L2 norm, on the same weights and batch (bf16 keeps 8 significant bits:
    4e-3 relative rounding of each product's inputs and of the logits). At the paper's shapes
    benchmarks/models_speed.py --what numerics measures the same quantities."""
    model = _model(tiny)
    with torch.no_grad():  # a peaked, trained-like output layer: logits of order 10
        model.logit.weight.mul_(20.0)
    batch = _batch(tiny)
    out = {}
    for prec in ("fp32", "bf16"):
        model.zero_grad()
        with L.autocast(prec, "cpu"):
            loss = xe_loss(model, batch)
        loss.backward()
        assert loss.dtype == torch.float32
        out[prec] = float(loss.detach()), {k: p.grad.clone() for k, p in model.named_parameters()}
    (l32, g32), (l16, g16) = out["fp32"], out["bf16"]
    assert l16 != l32  # autocast really ran in bf16
    assert abs(l16 - l32) / l32 < 1e-2
    for k in g32:
        if k == "alpha_net.bias":  # softmax ignores a shift: its gradient is rounding noise around 0
            continue
        assert g16[k].dtype == torch.float32
        rel = float((g16[k] - g32[k]).norm() / g32[k].norm())
        assert rel < 1e-1, (k, rel)


@pytest.mark.unit
def test_bf16_sampling_and_its_replay_give_the_same_log_probs(tiny):
    """On-policy under autocast: the step-by-step sampling pass and the batched teacher-forced pass
    that replays its dropout run in the same precision. Stated tolerance 1e-5 per token (on this CPU
    they agree exactly, as in fp32: each row's products do not depend on the batch's shape); they
    differ from the fp32 log-probs of the same captions by bf16 rounding."""
    model = _model(tiny, dropout=0.5).train()
    batch = _batch(tiny, seq_per_img=1)
    step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward="dpp", m=4, max_len=tiny.seq_length)
    with L.autocast("bf16", "cpu"):
        d = step.sample(model, batch)
        token_logp, mask = step.policy_logprobs(model, batch, d)
    on = mask.bool()
    drawn = d.logprobs.reshape(token_logp.shape)
    assert on.sum() > 40 and token_logp.dtype == drawn.dtype == torch.float32
    assert torch.allclose(token_logp[on], drawn[on], atol=1e-5, rtol=0)
    fp32, _ = step.policy_logprobs(model, batch, d)  # the same captions and masks, no autocast
    gap = (fp32[on] - drawn[on]).abs().max()
    assert 1e-4 < gap < 0.5


@pytest.mark.unit
def test_the_reward_of_a_bf16_step_is_computed_in_full_precision(ws, tiny):
    """A whole R-DPP step under bf16 autocast: its weights and logged rewards equal those computed
    without autocast from the same captions (CIDEr-D in float64 numpy, the DPP algebra in float64)."""
    model = _model(tiny, dropout=0.5).train()
    batch = _batch(tiny, seq_per_img=1)
    step = RewardStep(data=tiny, cider=TrainCider.for_data(tiny), reward="dpp", m=4, max_len=tiny.seq_length)
    with L.autocast("bf16", "cpu"):
        loss, logs = step(model, batch)
        d = step.draw(model, batch)  # the same captions again (the step's generator is seeded by position)
    w, plain = step.weights(d.samples.numpy(), None, tiny.references_ids(batch.index))
    assert logs["reward"] == plain["reward"] and logs["sample_cider"] == plain["sample_cider"]
    assert logs["self_cider"] == plain["self_cider"]
    assert loss.dtype == torch.float32 and np.isfinite(float(loss.detach()))


@pytest.mark.unit
def test_a_float64_model_stays_float64(tiny):
    """The float32 casts that keep log-probs float32 under autocast must not demote a float64 model
    (tests/test_cuda.py compares the GPU with the CPU in float64)."""
    model = _model(tiny).double().eval()
    batch = _batch(tiny)
    att, labels = batch.att.double(), batch.labels
    token_logp, mask = model.token_logprobs(att, labels)
    assert token_logp.dtype == torch.float64
    full = model(att, labels)
    assert full.dtype == torch.float64
    from rdpp_cli.models.att2in import sequence_logprobs

    want, _ = sequence_logprobs(full, labels)
    assert torch.allclose(token_logp, want, atol=1e-12, rtol=0)


# -- runs: manifests, float32 checkpoints, exact resume -----------------------------------------------------

@pytest.mark.integration
def test_a_bf16_xe_run_keeps_float32_weights_and_resumes_exactly(ws, tmp_path):
    data = ws / "data" / "tiny-v1"
    kw = dict(preset="small", epochs=2, batch_size=6, save_every_steps=2, val_images=3, device="cpu", seed=5,
              precision="bf16")
    ref = train_xe(data, out=tmp_path / "ref", **kw)
    cfg = ref.manifest["config"]
    assert cfg["precision"] == "bf16" and cfg["precision_option"] == "bf16"
    a = state_dict(ref.path / "checkpoints" / "last.pt")
    assert all(v.dtype == torch.float32 for v in a.values())
    st = torch.load(ref.path / "checkpoints" / "last_state.pt", weights_only=True)
    exp_avg = [s["exp_avg"] for s in st["optimizer"]["state"].values()]
    assert exp_avg and all(t.dtype == torch.float32 for t in exp_avg)  # Adam's state too

    def crash(step):
        if step == 5:
            raise Crash("killed")

    with pytest.raises(Crash):
        train_xe(data, out=tmp_path / "run", after_step=crash, **kw)
    again = train_xe(data, out=tmp_path / "run", **kw)
    b = state_dict(again.path / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the same run in fp32 ends elsewhere (bf16 was used), and a bf16 rerun does not resume an fp32 run
    fp32 = train_xe(data, out=tmp_path / "fp32", **{**kw, "precision": "fp32"})
    c = state_dict(fp32.path / "checkpoints" / "last.pt")
    assert fp32.manifest["config"]["precision"] == "fp32"
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.integration
def test_a_run_trains_in_the_precision_its_identity_records(ws, tmp_path, monkeypatch):
    """`auto` is resolved once, by the stage: a second measurement (here answering differently)
    must not make the run train in another precision than its identity and manifest say."""
    import rdpp_cli.training.loop as loop_mod
    import rdpp_cli.training.xe as xe_mod

    answers = iter(["fp32", "bf16", "bf16"])
    monkeypatch.setattr(xe_mod, "resolve_precision", lambda p, d, *shape: next(answers))
    monkeypatch.setattr(loop_mod, "resolve_precision", lambda p, d, *shape: next(answers))
    art = train_xe(ws / "data" / "tiny-v1", out=tmp_path / "xe", preset="small", epochs=1, batch_size=8,
                   val_images=3, device="cpu", seed=5, precision="auto")
    assert art.manifest["config"]["precision"] == "fp32"  # the recipe's own precision, written at the end


@pytest.mark.integration
def test_fp16_scales_the_loss_and_resumes_with_the_scalers_state(ws, tmp_path):
    xe = train_xe(ws / "data" / "tiny-v1", out=tmp_path / "xe", preset="small", epochs=1, batch_size=8,
                  val_images=2, lr=2e-3, device="cpu", seed=1)
    kw = dict(reward="dpp", m=2, epochs=2, batch_size=8, lr=1e-3, val_images=2, save_every_steps=1, device="cpu",
              seed=7, precision="fp16")
    ref = finetune(xe.path, out=tmp_path / "ref", **kw)
    assert ref.manifest["config"]["precision"] == "fp16"
    st = torch.load(ref.path / "checkpoints" / "last_state.pt", weights_only=True)
    assert st["scaler"]["scale"] > 1.0  # GradScaler's state is in the resume state
    a = state_dict(ref.path / "checkpoints" / "last.pt")
    assert all(v.dtype == torch.float32 for v in a.values())
    start = state_dict(xe.path / "checkpoints" / "best.pt")
    assert any(not torch.equal(a[k], start[k]) for k in a)  # steps were taken, not all skipped as inf

    def crash(step):
        if step == 3:
            raise Crash("killed")

    with pytest.raises(Crash):
        finetune(xe.path, out=tmp_path / "run", after_step=crash, **kw)
    again = finetune(xe.path, out=tmp_path / "run", **kw)
    b = state_dict(again.path / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.integration
def test_sample_records_its_precision_and_bad_values_are_one_line(ws, tmp_path):
    xe = train_xe(ws / "data" / "tiny-v1", out=tmp_path / "xe", preset="small", epochs=1, batch_size=8,
                  val_images=0, lr=2e-3, device="cpu", seed=1)
    outs = {}
    for prec in ("fp32", "bf16"):
        r = runner.invoke(app, ["sample", str(xe.path), "--n", "3", "--method", "random", "--split", "val",
                                "--precision", prec, "--out", str(tmp_path / prec), "--workspace", str(ws)])
        assert r.exit_code == 0, r.output
        assert json.loads((tmp_path / prec / "manifest.json").read_text())["config"]["precision"] == prec
        outs[prec] = json.loads((tmp_path / prec / "samples.json").read_text())
    lp = {p: np.array([r["logprobs"] for r in outs[p]]) for p in outs}
    assert lp["fp32"].shape == lp["bf16"].shape and not np.array_equal(lp["fp32"], lp["bf16"])
    r = runner.invoke(app, ["train-xe", "--data", str(ws / "data" / "tiny-v1"), "--precision", "half",
                            "--out", str(tmp_path / "bad"), "--workspace", str(ws)])
    assert r.exit_code == 2 and not (tmp_path / "bad").exists()
    assert "--precision 'half' is not a precision; use one of fp32, tf32, bf16, fp16, auto" in r.output
