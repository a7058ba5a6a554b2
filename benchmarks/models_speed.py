"""The speed of an rdpp model's training and decoding steps against self-critical.pytorch's own
module of that model (``Att2in2Model``, ``UpDownModel``, ``TransformerModel``), same weights and
inputs, same process; rdpp's fast path (``--fast``) against its eager step. Also (``--what``, no peer):
``numerics``, bf16 against fp32 and the on-policy replay against stated tolerances (docs/training.md
"Precision"); ``select``, ``rdpp sample --select`` against drawing the candidates and the batched
greedy MAP step against a per-image numpy loop, checked to choose the same items; ``draw``,
``decode._draw`` against ``torch.multinomial`` (checked to draw alike) and nucleus sampling's two paths.
``--model hf [--hf-kind gpt2|bert|blip|git]``: ``decode,score,replay`` against the same steps written
with ``transformers`` (a ViT + GPT-2 or + BERT VisionEncoderDecoderModel, BLIP, GIT).

Rows (``--what``): ``xe``, ``scst`` and ``dpp`` (timed in their parts), ``decode`` (``--methods``).
Checked first, a failed check stops the script; then ``timing.steps`` (warm-up, FLOPs, peak memory,
``--repeat`` interleaved calls, medians). benchmarks/README.md ("models_speed.py") says what each row
runs on each side and what is checked to which tolerance.

    python benchmarks/models_speed.py --model att2in|updown|transformer [--what xe,scst,dpp,decode|numerics|select|draw]
        [--precision fp32,bf16] [--fast fast,fast-default] [--batch 50] [--repeat 3] [--device cpu|cuda] ...   # --help
    python benchmarks/models_speed.py --model hf [--hf-kind gpt2|bert|blip|git] [--what decode,score,replay] [--batch 16]
        [--repeat 3] [--threads 1]
    python benchmarks/models_speed.py --summary LOG...   # the table cuda_check.sh ends with

Memory: the peer's Transformer repeats the features per caption before its encoder (``--batch`` smaller on a small card).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

if __name__ == "__main__":  # before torch loads OpenMP: idle threads sleep instead of spinning
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer  # noqa: E402
from common import (BATCH, PAPER, QUICK, Shapes, features, make_batch, make_model, make_refs, output_bias,  # noqa: E402
                    parse_words, zipf_p)
from timing import interleaved, machine, machine_info, on_roofline, parser, print_table, steps, sync  # noqa: E402

from rdpp_cli.data.loader import Batch  # noqa: E402
from rdpp_cli.decoding.decode import DecodeConfig, _draw, _nucleus, decode  # noqa: E402
from rdpp_cli.decoding.select import SelectConfig, _cider_terms, greedy_map, select  # noqa: E402
from rdpp_cli.metrics.cider import DocFreq  # noqa: E402
from rdpp_cli.metrics.train_cider import TrainCider, doc_freq_with_eos, eos_id  # noqa: E402
from rdpp_cli.models.base import sequence_logprobs  # noqa: E402
from rdpp_cli.models.registry import model_name, model_spec  # noqa: E402
from rdpp_cli.precision import autocast  # noqa: E402
from rdpp_cli.training import fast as F  # noqa: E402
from rdpp_cli.training.finetune import RewardStep  # noqa: E402
from rdpp_cli.training.rewards import dpp_weights, scst_advantage  # noqa: E402
from rdpp_cli.training.xe import XELoss, fast_xe_loss, xe_loss  # noqa: E402

ALL = ("xe", "scst", "dpp", "decode")
VARIANTS = {"fast": {}, "fast-default": {"train_mode": None}}
M = 5  # samples per image (RL steps, decoding)
PHASES = ("decode", "reward", "backward")


@dataclass
class Bench:
    """What every row group of one run shares."""

    model: str  # the registry name
    s: Shapes
    mods: peer.Modules | None
    device: torch.device
    args: argparse.Namespace

    @property
    def title(self) -> str:
        return model_spec(self.model).title

    @property
    def peer_title(self) -> str:
        return f"self-critical.pytorch {peer.PEER_CLASS[self.model]}"

    def batch(self, words=None) -> Batch:
        return make_batch(self.args.batch, words, self.device, s=self.s)

    def pair(self, words: float, lr: float | None = None):
        """A fresh rdpp model and the peer's module (Adam at ``lr``, else the peer's 4e-4) with the
        same weights, checked to compute the same numbers; (model, None, {}) with ``--no-peer``."""
        ours = make_model(self.model, self.s, words, self.device)
        if self.mods is None:
            return ours, None, {}
        theirs = peer.Peer(self.mods, ours, lr=lr)
        check = same_numbers(ours, theirs, self.batch((8, 16)), self.s.max_len)
        if not (check["logprob"] <= 1e-4 and check["same_greedy_captions"]):
            raise SystemExit(f"rdpp's {self.title} and the peer's {peer.PEER_CLASS[self.model]} disagree: {check}")
        return ours, theirs, check

    def fast_paths(self) -> dict[str, F.FastPath]:
        """``--fast``'s variants (none for a model without a fast path: ``refused`` says so)."""
        if self.args.fast and not getattr(make_model(self.model, QUICK[self.model]), "supports_fast", False):
            return {}
        base = replace(F.SETTINGS.get(self.device.type, F.FastSettings()), backend=self.args.backend)
        return {v: F.FastPath(self.device, replace(base, **VARIANTS[v])) for v in self.args.fast}


# -- the checks ---------------------------------------------------------------------------------------

def same_numbers(model, ref: peer.Peer, batch: Batch, max_len: int, images: int = 4) -> dict:
    """Dropout off, ``images`` images, the EOS bias at 0 (full-length greedy captions): the largest
    difference of the teacher-forced log-probs of the batch's captions, and whether the greedy
    captions are the same."""
    fc, att, labels = batch.fc[:images], batch.att[:images], batch.labels[:images]
    name = output_bias(model)
    ours_b, theirs_b = model.get_parameter(name), ref.model.get_parameter(peer.NAMES[model_name(model)](name))
    saved = ours_b[0].item()
    model.eval(), ref.model.eval()
    try:
        with torch.no_grad():
            ours_b[0] = theirs_b[0] = 0.0
            ours, mask = sequence_logprobs(model(att, labels, fc=fc), labels)
            bos = torch.cat([labels.new_zeros(*labels.shape[:2], 1), labels], 2)
            theirs, _ = sequence_logprobs(ref.model(fc, att, bos), labels)
            dec = decode(model, att, DecodeConfig(method="greedy", max_len=max_len), fc=fc)
            seq, _ = ref.model(fc, att, None, mode="sample", opt={"sample_method": "greedy"})
            ours_b[0] = theirs_b[0] = saved
    finally:
        model.train(), ref.model.train()
    T = dec.tokens.shape[-1]
    same = torch.equal(seq[:, :T], dec.tokens[:, 0]) and not seq[:, T:].any()
    return {"logprob": float((ours - theirs).abs()[mask.bool()].max()), "same_greedy_captions": bool(same)}


def xe_float64(b: Bench, base, batch: Batch, images: int = 4) -> dict:
    """rdpp's XE loss and gradients against the peer's in float64 with dropout off (rounding cannot
    hide a difference): |loss difference| and ``grad_diff`` (parameters whose gradient is at most 1e-9
    of the largest, rounding noise around 0, left out)."""
    ours = copy.deepcopy(base).double().eval()
    small = replace(batch, fc=batch.fc[:images].double(), att=batch.att[:images].double(), labels=batch.labels[:images],
                    index=batch.index[:images])
    ga = grads_of(ours, a := xe_loss(ours, small))
    theirs = peer.Peer(b.mods, ours)
    theirs.lw.eval()
    gc = grads_of(theirs.model, c := theirs.xe_loss(*peer_inputs(small)))
    worst, _ = grad_diff(gc, {peer.NAMES[b.model](k): g for k, g in ga.items()}, floor=1e-9)
    out = {"loss_abs_diff": abs(float(a.detach()) - float(c.detach())), "grad_rel_diff": worst}
    if not (out["loss_abs_diff"] <= 1e-9 and out["grad_rel_diff"] <= 1e-6):
        raise SystemExit(f"rdpp's {b.title} XE step and the peer's disagree in float64: {out}")
    return out


def reward_check(model, ref: peer.Peer, cider: TrainCider, batch: Batch, refs: list, max_len: int) -> dict:
    """The peer's CiderD q, kernel and R-DPP weights (the published way) and its SCST advantages
    against rdpp's, on one set of rdpp's captions (SystemExit beyond 1e-9)."""
    step = RewardStep(data=None, cider=cider, reward="dpp", m=M, max_len=max_len, seed=1)
    d = step.draw(model, batch)
    samples = d.samples.cpu().numpy()
    B, m, T = samples.shape
    q, S = cider.score_and_pairwise(samples, refs)
    w = dpp_weights(torch.from_numpy(q), torch.from_numpy(S)).numpy()
    q_r, S_r, w_r = ref.dpp_weights([np.pad(samples[:, i], ((0, 0), (0, max_len - T))) for i in range(m)], refs)
    greedy = samples[:, 0]
    adv = scst_advantage(torch.from_numpy(q), torch.from_numpy(cider.score(greedy, refs))).numpy()
    adv_r = ref.self_critical_reward(torch.from_numpy(greedy), refs, torch.from_numpy(samples.reshape(B * m, T)))
    out = {"q": float(np.abs(q - q_r).max()), "kernel": float(np.abs(S - S_r).max()),
           "dpp_weights": float(np.abs(w - w_r).max()), "scst_advantage": float(np.abs(adv.reshape(-1) - adv_r[:, 0]).max())}
    if not all(v <= 1e-9 for v in out.values()):
        raise SystemExit(f"rdpp's reward and the peer's CiderD disagree: {out}")
    return out


def grads_of(model, loss) -> dict[str, torch.Tensor]:
    loss.backward()
    g = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return g


def grad_diff(want: dict, got: dict, floor: float = 0.0, norm: bool = False) -> tuple[float, str]:
    """The largest gradient difference relative to the parameter's largest ``want`` entry (``norm``:
    ‖Δg‖ / ‖g‖) and that parameter (a miss says where), leaving out gradients under ``floor`` of the
    largest and ``alpha_net.bias``'s (a softmax ignores a shift: it is rounding noise around 0)."""
    size = (lambda g: g.norm()) if norm else (lambda g: g.abs().max())
    top = max(float(size(g)) for g in want.values())
    return max(((float(size(got[k] - g) / size(g).clamp_min(1e-30)), k) for k, g in want.items()
                if k in got and not k.endswith("alpha_net.bias") and float(size(g)) >= floor * top), default=(0.0, "-"))


def compare(m, want, got) -> dict:
    """``want``, a loss of ``m``, against ``got()``, the same loss computed the other way (after
    ``want``'s gradients are taken; the device waited for): the loss relative difference and
    ``grad_diff``, equal within 1e-5 (loss) and 1e-3 (gradients: float32 through two kernel sets)."""
    ga = grads_of(m, want)
    got = got()
    gb = grads_of(m, got)
    sync(want.device)
    a, b = float(want.detach()), float(got.detach())
    rel = abs(a - b) / max(abs(a), 1e-30)
    worst, name = grad_diff(ga, gb)
    return {"loss_rel_diff": rel, "grad_rel_diff": worst, "worst_param": name, "equal": rel <= 1e-5 and worst <= 1e-3}


def fast_xe_check(base, fast: F.FastPath, batch: Batch) -> dict:
    """The fast XE pass against the eager one on the same dropout masks (the first call compiles)."""
    m = copy.deepcopy(base).train()
    drop = fast.xe_dropout(m, batch.labels, batch.att.shape[1])
    tok, mask = m.token_logprobs(batch.att, batch.labels, drop=drop, fc=batch.fc)
    t = time.perf_counter()

    def fast_loss():
        fast.begin_step()
        tok, mask = fast.token_logprobs(m, batch.att, batch.labels, None, drop, batch.fc)
        return -tok.sum() / mask.sum()

    return {**compare(m, -tok.sum() / mask.sum(), fast_loss), "compile_s": time.perf_counter() - t}


def fast_rl_check(base, eager: RewardStep, fast: RewardStep, batch: Batch, refs: list) -> dict:
    """The fast RL step against the eager one: the captions of the same step (same generator), the
    weights of the same captions (tensors against numpy), the loss and gradients of the same
    captions under fixed non-zero weights (a random model's captions score about 0)."""
    from rdpp_cli.metrics.train_cider_torch import references_tensor

    m, t = copy.deepcopy(base).train(), time.perf_counter()
    fast.steps.begin_step()
    d, d_e = fast.draw(m, batch), eager.draw(m, batch)
    T = d_e.samples.shape[-1]
    same = (d.samples[..., :T] == d_e.samples).all(-1).float().mean().item()
    w_np, _ = eager.weights(d.samples.cpu().numpy(), d.greedy, refs)
    w_t, _ = fast.device_weights(d.samples, d.greedy, *references_tensor(refs, batch.att.device))
    w = torch.linspace(-1.0, 1.0, w_np.numel()).view(w_np.shape)
    out = compare(m, eager.loss(m, batch, d, w)[0], lambda: fast.loss(m, batch, d, w)[0])
    return {**out, "weights_abs_diff": float((w_t.cpu() - w_np).abs().max()),
            "same_captions": same, "compile_s": time.perf_counter() - t}


def guarded(fn, *args) -> dict:
    """``fn(*args)``, or ``{"error": its first line}`` (a fast side that cannot compile, capture or
    is refused is reported, and the others are still timed)."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 -- reported in the table
        return {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}"}


# -- the steps ----------------------------------------------------------------------------------------

def peer_inputs(batch: Batch) -> tuple:
    """The batch as the peer's loader gives it: fc, att, labels with BOS/EOS columns, masks, gts."""
    labels, masks = peer.xe_labels(batch.labels)
    return batch.fc, batch.att, labels, masks, [g for g in batch.labels.cpu().numpy()]


def update(model, opt, loss: torch.Tensor) -> float:
    """Backward, clipping by value 0.1 (rdpp's and the peer's), the Adam step."""
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.1)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def rdpp_rl_step(step: RewardStep, model, opt, batch: Batch, refs: list, precision: str) -> dict[str, float]:
    """rdpp's RL step in its three parts (what ``rdpp finetune`` runs per batch)."""
    t0 = time.perf_counter()
    model.train()
    with autocast(precision, batch.att.device):
        d = step.draw(model, batch)
    samples = d.samples.cpu().numpy()  # (waits for the GPU, if any)
    t1 = time.perf_counter()
    w, _ = step.weights(samples, d.greedy, refs)
    t2 = time.perf_counter()
    with autocast(precision, batch.att.device):
        loss, _ = step.loss(model, batch, d, w)
    update(model, opt, loss)
    sync(batch.att.device)
    return {"decode": t1 - t0, "reward": t2 - t1, "backward": time.perf_counter() - t2,
            "words": peer.mean_words(samples.reshape(-1, samples.shape[-1]))}


def xe_sides(b: Bench) -> tuple[dict, list, dict]:
    """rdpp's XE step per precision (and with scheduled sampling, and fast) against ``Peer.xe_step``."""
    ours, theirs, check = b.pair(words=b.s.max_len)  # XE: the EOS bias plays no part
    batch = b.batch(parse_words(b.args.xe_words))
    if theirs is not None:
        check["float64"] = xe_float64(b, ours, batch)
    if b.args.fast and not b.fast_paths():
        check["fast"] = {"error": f"refused: the {b.title} model has no fast path (--fast on is an error)"}
    sides, pairs, mine = {}, [], f"rdpp {b.title} xe"
    for prec in b.args.precision:
        sides[f"{mine} {prec}"] = stepper(ours, 4e-4, lambda m, p=prec: autocast_loss(xe_loss, m, batch, p))
    if b.args.ss:
        ss = XELoss(ss_prob=lambda epoch: b.args.ss)
        sides[f"{mine} ss={b.args.ss:g}"] = stepper(ours, 4e-4, lambda m: ss(m, batch)[0])
    if theirs is not None:
        inputs, ref = peer_inputs(batch), f"{b.peer_title} xe"
        sides[ref] = lambda: theirs.xe_step(*inputs)
        pairs += [(f"xe {p}", f"{mine} {p}", ref) for p in b.args.precision]
    for v, fast in b.fast_paths().items():
        check[v] = guarded(fast_xe_check, ours, fast, batch)
        if "error" not in check[v]:
            sides[f"{mine} {v}"] = stepper(ours, 4e-4, lambda m, s=fast_xe_loss(fast): s(m, batch), fast)
            pairs.append((f"xe {v} vs eager", f"{mine} {v}", f"{mine} fp32"))
    return sides, pairs, check


def stepper(ours, lr: float, loss, fast: F.FastPath | None = None):
    """A side training its own copy of ``ours``: ``loss(model)``, ``update`` with Adam at ``lr`` (the
    peer's optimizer) or with the fast path's optimizer (its ``begin_step`` first)."""
    m = copy.deepcopy(ours)
    opt = fast.optimizer(m.parameters(), lr) if fast else torch.optim.Adam(m.parameters(), lr=lr)
    return lambda: (fast and fast.begin_step(), update(m, opt, loss(m)))[1]


def autocast_loss(fn, model, batch: Batch, precision: str):
    with autocast(precision, batch.att.device):
        return fn(model, batch)


def rl_sides(b: Bench, rewards: list[str]) -> tuple[dict, list, dict]:
    """rdpp's ``RewardStep`` for each of ``rewards`` at m = 5 (per precision) against the peer's SCST
    step (and, for Att2in, the published R-DPP step); the fast path's, each checked against eager first."""
    rng, L = np.random.default_rng(0), b.s.max_len
    train_refs, refs = make_refs(rng, 400, b.s), make_refs(rng, b.args.batch, b.s)
    E = eos_id(b.s.vocab)
    cider = TrainCider(doc_freq_with_eos([[r[r > 0].tolist() for r in img] for img in train_refs], E), E, L)
    ours, theirs, check = b.pair(b.args.words, lr=1e-6)  # tiny steps: the caption lengths stay put
    batch, opt = b.batch(), torch.optim.Adam(ours.parameters(), lr=1e-6)
    sides, pairs, ref = {}, [], f"{b.peer_title} scst m={M}"
    for reward, m, prec in [(r, m, p) for r in rewards for m in b.args.ms for p in b.args.precision]:
        st, mine = RewardStep(data=None, cider=cider, reward=reward, m=m, max_len=L, seed=0), f"rdpp {b.title} {reward} m={m} {prec}"
        sides[mine] = lambda st=st, p=prec: rdpp_rl_step(st, ours, opt, batch, refs, p)
        if theirs is not None and m == M:
            pairs.append((f"{reward} m={M} {prec}", mine, ref))
    if theirs is not None:
        theirs.init_reward(train_refs)
        check["reward"] = reward_check(ours, theirs, cider, batch, refs, L)
        sides[ref] = lambda: theirs.scst_step(batch.fc, batch.att, refs, lambda: sync(b.device))
        if b.model == "att2in" and "dpp" in rewards:
            pub = f"published dpp m={M}"
            sides[pub] = lambda: theirs.dpp_step(batch.fc, batch.att, refs, M, lambda: sync(b.device))
            pairs.append((f"dpp m={M} vs published", f"rdpp {b.title} dpp m={M} fp32", pub))

    class Refs:  # RewardStep's data: the batch's references, laid out as a DataArtifact's (the fast path's table)
        label_end = np.cumsum([len(r) for r in refs])
        label_start = label_end - [len(r) for r in refs]
        _all_labels = staticmethod(lambda: np.concatenate(refs))
        references_ids = staticmethod(lambda index: [refs[i] for i in index])

    for v, fast in b.fast_paths().items():
        for reward in rewards:
            kw = dict(data=Refs, cider=cider, reward=reward, m=M, max_len=b.s.max_len, seed=1)
            name, step = f"rdpp {b.title} {reward} m={M} {v}", RewardStep(**kw, steps=fast)
            check[name] = guarded(fast_rl_check, ours, RewardStep(**kw), step, batch, refs)
            if "error" in check[name]:
                continue
            sides[name] = stepper(ours, 1e-6, lambda m, st=step: st(m, batch)[0], fast)
            pairs.append((f"{reward} m={M} {v} vs eager", name, f"rdpp {b.title} {reward} m={M} fp32"))
    return sides, pairs, check


def peer_decode_opt(cfg: DecodeConfig) -> dict:
    """The peer's options for one decoding method, as its eval_utils.eval_split_n sets them."""
    if cfg.method in ("beam", "dbs"):
        G = cfg.groups if cfg.method == "dbs" else 1
        o = {"beam_size": cfg.beam * G, "group_size": G, "sample_n": 1}
        return {**o, "diversity_lambda": cfg.diversity_lambda} if G > 1 else o
    method = {"greedy": "greedy", "random": "sample", "topk": f"top{cfg.top_k}", "nucleus": f"top{cfg.top_p}"}
    return {"sample_method": method[cfg.method], "sample_n": cfg.n, "beam_size": 1, "temperature": cfg.temperature}


METHODS = {"greedy": dict(method="greedy", n=1), "random": dict(method="random", n=M),
           "topk": dict(method="topk", n=M, top_k=5), "nucleus": dict(method="nucleus", n=M, top_p=0.9),
           "beam": dict(method="beam", n=3, beam=3), "dbs": dict(method="dbs", n=M, beam=1, groups=M)}


def decode_sides(b: Bench) -> tuple[dict, list, dict]:
    """Each of ``--methods`` in eval mode, no gradients: rdpp's ``decode`` against the peer's call."""
    ours, theirs, check = b.pair(words=b.s.max_len)  # no caption ends early: all 17 steps on both sides
    batch, sides, pairs = b.batch(), {}, []
    ours.eval()
    if theirs is not None:
        theirs.model.eval()
    for method in b.args.methods:
        kw = {**METHODS[method], **({"n": b.args.n} if METHODS[method]["n"] == M else {})}
        kw.update({"n": b.args.n, "groups": b.args.n} if method == "dbs" else {})
        cfg = DecodeConfig(max_len=b.s.max_len, diversity_lambda=0.5, **kw).check()
        mine, ref = f"rdpp {b.title} decode {method} n={cfg.n}", f"{b.peer_title} decode {method} n={cfg.n}"
        sides[mine] = torch.no_grad()(lambda cfg=cfg: decode(ours, batch.att, cfg, fc=batch.fc).tokens)
        if theirs is not None:
            popt = peer_decode_opt(cfg)
            sides[ref] = torch.no_grad()(lambda o=popt: theirs.model(batch.fc, batch.att, None, opt=o, mode="sample")[0])
            pairs.append((f"decode {method} n={cfg.n}", mine, ref))
    return sides, pairs, check


def run(b: Bench):
    """Each asked row group (in the order of ``ALL``) built, checked (SystemExit when rdpp and the
    peer disagree), timed, dropped; yields (group, timed, pairs, checks, rates) as each one ends."""
    rewards = [w for w in ("scst", "dpp") if w in b.args.what]
    build = {"xe": lambda: xe_sides(b), "rl": lambda: rl_sides(b, rewards), "decode": lambda: decode_sides(b)}
    for name in [g for g in build if g in b.args.what or g == "rl" and rewards]:
        sides, p, check = build[name]()
        warm = {k: f for k, f in sides.items() if any(v in k.split() for v in VARIANTS)}
        for k, fn in warm.items():  # the fast sides' extra warm-ups (CUDA graphs record here)
            err = guarded(lambda fn=fn: [fn() for _ in range(b.args.warmup)] and {})
            if err:
                check[k] = err
                del sides[k]
        step = lambda: steps(sides, b.args.repeat, b.device, flops=set(sides) - set(warm))  # noqa: E731
        t, mm = on_roofline(step, b.args.precision, b.device, b.args.matmul_size) if b.args.matmul_size else (step(), {})
        if b.args.profile:
            profile(sides, b.device, 12)
        sides.clear(), warm.clear()  # the group's models go before the next group's are built
        yield name, t, [x for x in p if x[1] in t and x[2] in t], {name: check}, mm


def profile(sides: dict, device: torch.device, rows: int) -> None:
    """One profiled call of each side: its top ops by self time."""
    from torch.profiler import ProfilerActivity, profile as prof_

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name, fn in sides.items():
        with prof_(activities=acts, record_shapes=True) as p:
            fn()
        print(f"\n== torch.profiler: one call of {name} on {device} (top ops by self time) ==")
        print(p.key_averages(group_by_input_shape=True).table(sort_by=key, row_limit=rows))


# -- --what numerics: bf16 against fp32, and the on-policy replay ----------------------------------------

NUMERICS_TOL = {"bf16 XE loss vs fp32 (relative)": 1e-2, "bf16 XE gradients vs fp32 (worst ‖Δg‖/‖g‖)": 1e-1,
                "fp32 replay vs sampling, max per token": 1e-4, "bf16 replay vs sampling, p99 per token": 0.1,
                "bf16 replay vs sampling, mean per token": 0.01}


def peaked_model(b: Bench):
    """The model with its output layer scaled up so that its log-probs are as peaked as a trained
    model's (sampled tokens' mean |log p| ≈ 2.4) and the EOS bias at 15 (captions of ≈ 8.5 words)."""
    model = make_model(b.model, b.s, device=b.device)
    bias = output_bias(model)
    with torch.no_grad():
        model.get_parameter(bias[:-len("bias")] + "weight").mul_(30.0)
        model.get_parameter(bias)[0] = 15.0
    return model


def xe_numerics(model, batch: Batch) -> dict[str, float]:
    """The XE loss and gradients on 5 captions per image the model itself samples (a trained model's
    loss, not that of random words), bf16 against fp32, dropout off; gradients: the largest over the
    parameters of ‖g_bf16 − g_fp32‖ / ‖g_fp32‖ (``grad_diff``)."""
    with torch.no_grad():
        d = decode(model.eval(), batch.att, DecodeConfig(method="random", n=5, max_len=batch.labels.shape[-1]),
                   generator=torch.Generator(device=batch.att.device).manual_seed(1))
    batch, out = replace(batch, labels=d.tokens), {}
    for prec in ("fp32", "bf16"):
        loss = autocast_loss(xe_loss, model, batch, prec)
        out[prec] = float(loss.detach()), grads_of(model, loss)
    model.train()
    (l32, g32), (l16, g16) = out["fp32"], out["bf16"]
    return {"xe_loss_fp32": l32, "xe_loss_bf16": l16, "xe_loss_rel": abs(l16 - l32) / l32,
            "xe_grad_rel": grad_diff(g32, g16, 1e-6, norm=True)[0], "xe_grad_entry_rel": grad_diff(g32, g16, 1e-6)[0]}


def replay(model, batch: Batch, precision: str) -> dict[str, float]:
    """M = 5 captions per image sampled step by step with pre-drawn dropout masks, then the batched
    teacher-forced pass that replays the masks: the differences of the two log-probabilities."""
    step = RewardStep(data=None, cider=None, reward="dpp", m=M, max_len=batch.labels.shape[-1], seed=0)
    img = replace(batch, labels=batch.labels[:, :1])
    with torch.no_grad(), autocast(precision, batch.att.device):
        d = step.sample(model, img)
        tf, mask = step.policy_logprobs(model, img, d)
    on, drawn = mask.bool(), d.logprobs.reshape(tf.shape)
    diff, seq = (tf - drawn)[on].abs().float(), ((tf - drawn) * mask).sum(1).abs()
    return {"tokens": int(on.sum()), "words": float(d.lengths.float().mean()), "mean_abs_logp": float(drawn[on].abs().mean()),
            "max": float(diff.max()), "p99": float(diff.quantile(0.99)), "mean": float(diff.mean()), "seq_max": float(seq.max())}


def numerics(b: Bench) -> bool:
    """How far bf16 is from fp32, and the replay from the sampling pass, against the stated
    tolerances (docs/training.md "Precision"); prints PASS/FAIL per check."""
    from rdpp_cli.precision import native_bf16

    model, batch = peaked_model(b), b.batch()
    res = {"device": str(b.device), "native_bf16": native_bf16(b.device), **xe_numerics(model, batch),
           "replay": {p: replay(model, batch, p) for p in ("fp32", "bf16")}}
    r32, r16 = res["replay"]["fp32"], res["replay"]["bf16"]
    got = dict(zip(NUMERICS_TOL, (res["xe_loss_rel"], res["xe_grad_rel"], r32["max"], r16["p99"], r16["mean"])))
    print(f"precision numerics, {b.title}, on {machine_info()['gpu'] or 'cpu'} (native bf16: {res['native_bf16']}), "
          f"batch {b.args.batch}, XE loss fp32 {res['xe_loss_fp32']:.4f}, bf16 {res['xe_loss_bf16']:.4f}; largest "
          f"gradient entry off by {res['xe_grad_entry_rel']:.1e} of the parameter's largest")
    for p, r in res["replay"].items():
        print(f"  replay {p}: {r['tokens']} tokens ({r['words']:.1f} words per caption, mean |log p| "
              f"{r['mean_abs_logp']:.2f}): |Δ log p| per token max {r['max']:.2e}, p99 {r['p99']:.2e}, "
              f"mean {r['mean']:.2e}; per caption max {r['seq_max']:.2e}")
    print_table("against the stated tolerances", ["check", "measured", "tolerance", ""], [
        [k, f"{v:.2e}", f"{NUMERICS_TOL[k]:.0e}", "PASS" if v <= NUMERICS_TOL[k] else "FAIL"] for k, v in got.items()])
    res["pass"] = all(v <= NUMERICS_TOL[k] for k, v in got.items())
    if b.args.json:
        print(json.dumps({"benchmark": "precision_numerics", "model": b.model, **res}))
    return res["pass"]


# -- --what select, draw: rdpp sample --select against drawing; one draw per row ---------------------------

SELECTIONS = [("dpp", "consensus"), ("dpp", "logprob"), ("mbr", None), ("logprob", None)]


def zipf_df(path: Path, vocab: int, images: int = 20000, seed: int = 0) -> Path:
    """A cider_df.h5 of synthetic references (COCO's size by default): 5 per image, 12 Zipf-distributed words and the EOS."""
    refs = np.random.default_rng(seed).choice(np.arange(1, vocab + 1), p=zipf_p(vocab=vocab), size=(images, 5, 12))
    doc_freq_with_eos([r.tolist() for r in refs], vocab + 1).save_h5(path)
    return path


def ref_greedy_map(L: np.ndarray, k: int) -> list[int]:
    """Chen, Zhang & Zhou's fast greedy MAP for one kernel, a plain numpy loop (the published form)."""
    C = L.shape[0]
    cis = np.zeros((k, C))
    d2 = np.diag(L).copy()
    j = int(np.argmax(d2))
    chosen = [j]
    while len(chosen) < k:
        t = len(chosen) - 1
        e = (L[j, :] - cis[:t, j] @ cis[:t, :]) / np.sqrt(d2[j])
        cis[t, :] = e
        d2 = d2 - e ** 2
        d2[chosen] = -np.inf
        j = int(np.argmax(d2))
        chosen.append(j)
    return chosen


def select_sides(b: Bench, df_path: Path) -> dict:
    """The timed calls: ``draw`` (``--candidates`` random samples per image for ``--select-images``
    images, batches of 50), each selection of ``--keep`` on the drawn captions (what ``rdpp sample
    --select`` runs), the batched greedy MAP step and its per-image reference, checked first to agree."""
    a, device, L, V = b.args, b.device, b.s.max_len, b.s.vocab
    model, C, K = make_model(b.model, b.s, device=device).eval(), a.candidates, a.keep
    att = features(BATCH, torch.Generator().manual_seed(0), b.s).to(device)
    sizes = [min(BATCH, a.select_images - s) for s in range(0, a.select_images, BATCH)]
    cfg, gen, drawn = DecodeConfig(method="random", n=C, max_len=L).check(), torch.Generator(device=device).manual_seed(0), []

    def draw():
        drawn.clear()
        with torch.no_grad():
            drawn.extend(decode(model, att[:n], cfg, generator=gen) for n in sizes)
        sync(device)

    scorer = TrainCider(DocFreq.from_h5(df_path), V + 1, L, L)  # what rdpp sample builds

    def choose(method, quality):
        sel = SelectConfig(method, C, quality).check(K)
        return lambda: [select(d.tokens, d.seq_logprob, d.lengths, K, sel, scorer) for d in drawn]

    draw()  # the captions every selection runs on
    kernels = []
    for d in drawn:
        q, S = _cider_terms(d.tokens.cpu().numpy(), scorer)
        kernels.append(torch.from_numpy(S * q[:, :, None] * q[:, None, :]))
    ours = lambda: [greedy_map(k, K) for k in kernels]  # noqa: E731
    ref = lambda: [[ref_greedy_map(k_b, K) for k_b in k.numpy()] for k in kernels]  # noqa: E731
    if torch.cat(ours()).tolist() != [r for rs in ref() for r in rs]:
        raise SystemExit("batched greedy MAP chose other items than the per-image reference; not timed")
    return {"draw": draw, **{f"{m}-{q}" if q else m: choose(m, q) for m, q in SELECTIONS}, "greedy": ours, "ref": ref}


def selection(b: Bench) -> None:
    """``--what select``: every side once untimed, then ``--repeat`` (at least 3) interleaved; medians, a table."""
    a, images = b.args, b.args.select_images
    with tempfile.TemporaryDirectory(prefix="rdpp-bench-df-") as tmp:
        fns = select_sides(b, zipf_df(Path(tmp) / "cider_df.h5", b.s.vocab, 200 if a.quick else 20000))
        for name, fn in fns.items():
            if name != "draw":
                fn()  # warm-up (draw's was the captions' draw)
        med = {k: t.median for k, t in interleaved(fns, max(a.repeat, 3)).items()}
    C, K, dev = a.candidates, a.keep, b.device.type
    cost = lambda k: [f"{med[k]:.3f}", f"{1e3 * med[k] / images:.3f}", f"{med[k] / med['draw']:.4f}"]  # noqa: E731
    rows = [[dev, f"draw {C} random samples per image (decode)", *cost("draw"), "-", "-"]]
    rows += [[dev, f"select {K} of {C}: {name} (kernel + choice, CPU)", *cost(name), "-", "-"]
             for name in fns if name not in ("draw", "greedy", "ref")]
    rows.append([dev, f"greedy MAP step alone, batched ({K} of {C})", *cost("greedy"), f"{med['ref']:.3f}",
                 f"{med['ref'] / med['greedy']:.1f}x"])
    print_table(f"rdpp sample --select, {b.title}: {K} of {C} per image, {images} images (random weights; medians of "
                f"{max(a.repeat, 3)} interleaved runs, CPU threads {a.threads}; reference: a per-image numpy loop, "
                "Chen et al.)", ["device", "what", "s", "ms/image", "x draw", "reference s", "speedup"], rows,
                width=170, left=2)
    if a.json:
        print(json.dumps({"benchmark": "selection", "threads": a.threads, "machine": machine_info(), "images": images,
                          "seconds": med}))


DRAW_ROWS, DRAW_WORDS = 200, 9488


def draw_rows(peaked: bool, seed: int = 0) -> torch.Tensor:
    """(DRAW_ROWS, DRAW_WORDS + 1) probabilities: softmax of Gaussian logits, scaled up for peaked rows."""
    logits = torch.randn(DRAW_ROWS, DRAW_WORDS + 1, generator=torch.Generator().manual_seed(seed))
    return torch.softmax(logits * (6.0 if peaked else 0.1), -1)


def same_distribution() -> float:
    """Largest |frequency difference| / standard error between _draw and multinomial over 8 outcomes."""
    p = torch.tensor([[0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02]]).repeat(100_000, 1)
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    a = torch.bincount(_draw(p, g1), minlength=8).double() / len(p)
    b = torch.bincount(torch.multinomial(p, 1, generator=g2).squeeze(1), minlength=8).double() / len(p)
    se = (p[0].double() * (1 - p[0].double()) * 2 / len(p)).sqrt()
    return float(((a - b).abs() / se).max())


def draw_costs(repeat: int, threads: int) -> None:
    """``--what draw``: one draw per row against torch.multinomial, and nucleus sampling's two paths."""
    z = same_distribution()
    if z > 4:
        raise SystemExit(f"_draw and torch.multinomial draw from different distributions ({z:.1f} standard errors)")
    g, ms = torch.Generator().manual_seed(0), lambda t: t.ms(2)
    print(f"{DRAW_ROWS} rows x {DRAW_WORDS:,} words + EOS, CPU, {threads} thread(s), {repeat} interleaved runs each; "
          f"distributions agree ({z:.1f} standard errors at most)")
    for name, peaked in (("peaked", True), ("flat", False)):
        probs = draw_rows(peaked)
        t = interleaved({"multinomial": lambda: torch.multinomial(probs, 1, generator=g),
                         "_draw": lambda: _draw(probs, g)}, repeat)
        m, d = t["multinomial"], t["_draw"]
        print(f"(1) one draw per row, {name} rows: torch.multinomial {ms(m)}, _draw {ms(d)}: "
              f"{m.median / d.median:.1f}x cheaper (medians)")
    peaked, flat = draw_rows(True), draw_rows(False)
    assert (peaked.topk(128, -1).values.sum(-1) >= 0.9).all() and (flat.topk(128, -1).values.sum(-1) < 0.9).all()
    t = interleaved({"peaked": lambda: _nucleus(peaked, 0.9, g), "flat": lambda: _nucleus(flat, 0.9, g)}, repeat)
    print(f"(2) nucleus p=0.9: peaked rows (top-128 path) {ms(t['peaked'])}; flat rows (full sort) {ms(t['flat'])} "
          f"per step: {t['flat'].median / t['peaked'].median:.0f}x (medians)")
    print(f"machine: {machine()}")


# -- --model hf: rdpp's HFCaptioner against the same steps written with transformers ---------------------

HF_WHAT = ("decode", "score", "replay")
HF_SIZES = {False: dict(regions=50, width=256, layers=4, vocab=5000), True: dict(regions=5, width=32, layers=1, vocab=100)}
HF_LEN = 20  # at most this many tokens a caption


HF_KINDS = ("gpt2", "bert", "blip", "git")


def hf_pair(quick: bool, folder: Path, kind: str = "gpt2", eos_scale: float = 3.0):
    """A random captioner of ``kind`` (a ViT + GPT-2 or + BERT ``VisionEncoderDecoderModel``, a BLIP,
    a GIT) whose decoder is ``HF_SIZES``' size, the end token's output row raised (captions of ~18
    tokens), and rdpp's ``HFCaptioner`` of it. One token, the last id, starts and ends a caption."""
    import transformers as tf
    from tokenizers import Tokenizer, models

    from rdpp_cli.models.hf import HFCaptioner

    torch.manual_seed(0)
    z = HF_SIZES[quick]
    W, V, L = z["width"], z["vocab"], z["layers"]
    end = V - 1
    vision = dict(hidden_size=W, num_hidden_layers=1, num_attention_heads=4, intermediate_size=2 * W, image_size=32,
                  patch_size=8)
    bert = dict(vocab_size=V, hidden_size=W, num_hidden_layers=L, num_attention_heads=4, intermediate_size=4 * W,
                max_position_embeddings=128, pad_token_id=0, bos_token_id=end, eos_token_id=end)
    if kind in ("gpt2", "bert"):
        dec = (tf.GPT2Config(vocab_size=V, n_positions=128, n_embd=W, n_layer=L, n_head=4, add_cross_attention=True,
                             is_decoder=True, bos_token_id=end, eos_token_id=end) if kind == "gpt2"
               else tf.BertConfig(**bert, is_decoder=True, add_cross_attention=True))
        cfg = tf.VisionEncoderDecoderConfig.from_encoder_decoder_configs(tf.ViTConfig(**vision), dec)
        cfg.decoder_start_token_id = cfg.pad_token_id = cfg.eos_token_id = end
        hf = tf.VisionEncoderDecoderModel(config=cfg)
    elif kind == "blip":
        text = tf.BlipTextConfig(**bert, sep_token_id=end, encoder_hidden_size=W)
        hf = tf.BlipForConditionalGeneration(tf.BlipConfig(text_config=text.to_dict(), vision_config=vision))
    else:
        hf = tf.GitForCausalLM(tf.GitConfig(vision_config=vision, **{k: v for k, v in bert.items()}))
    with torch.no_grad():
        out = hf.text_decoder if kind == "blip" else hf
        out.get_output_embeddings().weight[end] *= eos_scale
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {f"w{i}": i for i in range(end)} | {"<end>": end}, unk_token="<end>")),
        eos_token="<end>", bos_token="<end>", sep_token="<end>", cls_token="<end>")
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return HFCaptioner.from_folder(folder, seq_length=HF_LEN), hf.eval()


def hf_sides(ours, hf, B: int, regions: int) -> tuple[dict, dict]:
    """Each ``--what`` step as (rdpp, transformers) over the same inputs, after the check that rdpp's
    eval-mode log-probs are within 1e-4 of the model's forward (SystemExit otherwise). transformers'
    side is fed the same att features: ``encoder_outputs`` (VisionEncoderDecoderModel), BLIP's
    ``text_decoder`` with ``encoder_hidden_states``, GIT with its image encoder replaced by the
    features (``GivenFeatures``, as rdpp's model)."""
    from transformers.modeling_outputs import BaseModelOutput as Out

    from rdpp_cli.models.hf import GivenFeatures

    kind = ours.config.kind
    if kind == "git":
        hf.git.image_encoder = GivenFeatures()
    att = torch.randn(B, regions, ours.config.att_feat_size, generator=torch.Generator().manual_seed(1))
    start, cfg = ours.config.decoder_start_token_id, DecodeConfig(method="random", n=M, max_len=HF_LEN)
    with torch.no_grad():
        seqs = decode(ours, att, cfg, generator=torch.Generator().manual_seed(2)).tokens.reshape(B * M, -1)
    ids, rows = torch.cat([torch.full((B * M, 1), start), ours.hf_of[seqs]], 1), att.repeat_interleave(M, 0)
    target = torch.cat([ids[:, 1:], torch.full((B * M, 1), ours.config.eos_token_id)], 1)

    def forward(states, inputs):
        if kind == "ved":
            return hf(encoder_outputs=Out(states), decoder_input_ids=inputs).logits
        if kind == "blip":
            return hf.text_decoder(input_ids=inputs, encoder_hidden_states=states).logits
        return hf(pixel_values=states[:, None], input_ids=inputs).logits[:, -inputs.shape[1]:]

    def theirs_logp(grad: bool):
        with torch.set_grad_enabled(grad):
            return torch.log_softmax(forward(rows, ids).float(), -1).gather(2, target.unsqueeze(2)).squeeze(2)

    with torch.no_grad():
        ours_target = torch.cat([seqs, seqs.new_zeros(B * M, 1)], 1)
        diff = (ours(att, seqs).gather(2, ours_target.unsqueeze(2)).squeeze(2) - theirs_logp(False)).abs()
        diff = float(diff[(ours_target == 0).cumsum(1) - (ours_target == 0).int() == 0].max())
    if not diff < 1e-4:
        raise SystemExit(f"rdpp --model hf and transformers' log-probs differ by {diff:.1e}; not timed")
    drop = ours.draw_dropout(B, B * M, HF_LEN + 1, regions, generator=torch.Generator().manual_seed(3))

    def replay(model, loss):  # both sides without dropout, the on-policy rule of docs/model.md
        loss().sum().neg().backward()
        model.zero_grad(set_to_none=True)

    end = ours.config.eos_token_id
    gen = dict(do_sample=True, top_k=0, num_return_sequences=M, max_new_tokens=HF_LEN + 1, eos_token_id=end,
               pad_token_id=end)

    def generate():
        if kind == "ved":
            return hf.generate(encoder_outputs=Out(att), decoder_start_token_id=start, **gen)
        if kind == "blip":
            return hf.text_decoder.generate(input_ids=torch.full((B, 1), start), encoder_hidden_states=att, **gen)
        return hf.generate(pixel_values=att[:, None], **gen)

    no_grad = torch.no_grad()
    sides = {"decode": (no_grad(lambda: decode(ours, att, cfg)), no_grad(generate)),
             "score": (no_grad(lambda: ours.token_logprobs(att, seqs)), lambda: theirs_logp(False)),
             "replay": (lambda: replay(ours, lambda: ours.token_logprobs(att, seqs, drop=drop)[0]),
                        lambda: replay(hf, lambda: theirs_logp(True)))}
    return sides, {"logprob": diff, "tokens": float((seqs > 0).sum(1).float().mean())}


def hf_rows(a: argparse.Namespace) -> None:
    """``--model hf``: each asked step once untimed, then ``--repeat`` interleaved runs a side; medians."""
    z = HF_SIZES[a.quick]
    with tempfile.TemporaryDirectory(prefix="rdpp-bench-hf-") as tmp:
        ours, hf = hf_pair(a.quick, Path(tmp), a.hf_kind)
    sides, check = hf_sides(ours, hf, a.batch, z["regions"])
    rows = []
    for name in a.what:
        fns = dict(zip(("rdpp", "transformers"), sides[name]))
        [f() for f in fns.values()]  # warm-up
        r, h = interleaved(fns, a.repeat).values()
        rows.append([name, r.ms(), h.ms(), f"{h.median / r.median:.2f}x"])
    print_table(f"{machine()}; torch threads {torch.get_num_threads()}; {a.batch} images x {M} captions (mean "
                f"{check['tokens']:.1f} tokens), {z['regions']} x {z['width']} encoder states, {a.hf_kind} {z['layers']} "
                f"layers x {z['width']}, vocabulary {z['vocab']}; log-probs within {check['logprob']:.1e}; medians of "
                f"{a.repeat} interleaved runs", ["step", "rdpp --model hf", "transformers", "ratio"], rows)
    if a.json:
        print(json.dumps({"benchmark": "models_speed hf", "kind": a.hf_kind, "machine": machine_info(), "checks": check,
                          "rows": rows}))


# -- the command line, the report ----------------------------------------------------------------------

def split(s: str) -> list[str]:
    return [w.strip() for w in s.split(",") if w.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    ap = parser(__doc__)
    ap.add_argument("--model", choices=[*sorted(peer.PEER_CLASS), "hf"], help="the rdpp model timed against the "
                    "peer's (hf: against transformers' own model, --what decode,score,replay)")
    ap.add_argument("--hf-kind", choices=HF_KINDS, default="gpt2", help="--model hf: the kind of captioner "
                    "(VisionEncoderDecoderModel with a GPT-2 or BERT decoder, BLIP, GIT)")
    ap.add_argument("--what", type=split, help=f"comma-separated, of {', '.join(ALL)} (against the peer); "
                    "numerics (bf16 against fp32, the on-policy replay; exit 1 on a FAIL); select (rdpp sample --select "
                    "against drawing); draw (_draw against torch.multinomial, nucleus sampling's two paths)")
    ap.add_argument("--precision", type=split, default="fp32",
                    help="rdpp's precisions, comma-separated (fp32, bf16, fp16)")
    ap.add_argument("--fast", type=split, default="", help=f"also rdpp's fast path, comma-separated variants: "
                    f"{', '.join(VARIANTS)}")
    ap.add_argument("--backend", default="inductor", help="the fast path's torch.compile backend (aot_eager: quick)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of each fast side first")
    ap.add_argument("--ss", type=float, default=0.0, help="also the XE step with scheduled sampling at this probability")
    ap.add_argument("--methods", type=split, default="random", help=f"--what decode's methods: {', '.join(METHODS)}")
    ap.add_argument("--xe-words", default="8-16", help="words of the XE captions: N, or MIN-MAX drawn uniformly")
    ap.add_argument("--ms", type=lambda s: [int(m) for m in split(s)], default="5",
                    help="samples per image of rdpp's RL steps, comma-separated (the peer: 5)")
    ap.add_argument("--n", type=int, default=M, help="captions per image of the sampling methods and DBS")
    ap.add_argument("--batch", type=int, default=50, help="images per step in every row")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per side, interleaved (3; draw alone: 21)")
    ap.add_argument("--words", type=float, default=9.0, help="mean sampled caption length of the RL steps' model")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads; 2, draw alone: 1)")
    ap.add_argument("--select-images", type=int, default=5000, help="select: images to draw for and select on")
    ap.add_argument("--candidates", type=int, default=50, help="select: C, samples drawn per image")
    ap.add_argument("--keep", type=int, default=5, help="select: K, captions selected per image")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--matmul-size", type=int, default=0, help="n of the n×n torch.mm roofline (0: not measured)")
    ap.add_argument("--peer-repo", default=None, help="self-critical.pytorch checkout (default: $SCP_REPO, then "
                                                      "the project's copy of 4c48a33)")
    ap.add_argument("--no-peer", action="store_true", help="time rdpp alone (no peer, no check against it)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler's top ops of one call of each side")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, at most 4 images, one repeat: check that it runs")
    ap.add_argument("--summary", nargs="+", metavar="LOG", help="print the summary table of these logs' JSON lines")
    args = ap.parse_args(argv)
    if args.summary:
        return args
    args.what = args.what or list(HF_WHAT if args.model == "hf" else ALL)
    known = HF_WHAT if args.model == "hf" else (*ALL, "numerics", "select", "draw")
    bad = [w for w in args.what if w not in known] + [v for v in args.fast if v not in VARIANTS]
    bad += [m for m in args.methods if m not in METHODS]
    if args.model is None or bad or not args.what or not args.precision:
        ap.error(f"give --model and known --what/--fast/--methods (unknown: {', '.join(bad) or '-'})")
    draw = args.what == ["draw"]
    args.repeat, args.threads = args.repeat or (21 if draw else 3), args.threads or (1 if draw else 2)
    if args.quick:
        args.repeat, args.batch, args.warmup = 1, min(args.batch, 4), min(args.warmup, 1)
    if args.batch < 1 or args.repeat < 1:
        ap.error("--batch and --repeat must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.summary:
        return summary(args.summary)
    torch.set_num_threads(args.threads)
    if args.model == "hf":
        return hf_rows(args)
    timing = [w for w in args.what if w in ALL]
    mods = None if args.no_peer or not timing else peer.modules(peer.find_repo(args.peer_repo))
    b = Bench(args.model, QUICK[args.model] if args.quick else PAPER, mods, torch.device(args.device), args)
    ok = numerics(b) if "numerics" in args.what else True
    if "draw" in args.what:
        draw_costs(args.repeat, args.threads)
    if "select" in args.what:
        selection(b)
    if timing:
        for i, group in enumerate(run(b)):  # each group's rows printed as it ends: a run cut short still reports
            report(b, *group, header=i == 0)
    if not ok:
        sys.exit(1)


def report(b: Bench, group: str, t: dict, pairs: list, checks: dict, rates: dict, header: bool = True) -> None:
    """One row group's table, ratios and checks (``header``: the run's title first), flushed; with
    ``--json`` its JSON line (one per group: ``--summary`` reads them all)."""
    args, m = b.args, machine_info()
    where = m["gpu"] if b.device.type == "cuda" else f"{m['machine']}; {m['threads']} threads"
    if header:
        print(f"{b.title} against {b.peer_title}, {'quick sizes' if args.quick else 'paper preset'}, batch {args.batch} "
              f"images, vocab {b.s.vocab}, {b.s.regions}x{b.s.feat} att, on {where}; seconds, medians of {args.repeat} "
              f"interleaved runs per side")
        print(f"{'step':<58}{'median':>9}{'best':>9}{'images/s':>10}{'GFLOP':>8}{'peak MiB':>10}  decode / reward / backward")
    for name, o in t.items():
        timed_in_parts = o["results"] and isinstance(o["results"][-1], dict)  # the RL steps
        parts = " / ".join(f"{np.median([r[p] for r in o['results']]):.4f}" for p in PHASES) if timed_in_parts else ""
        print(f"{name:<58}{o['median']:>9.4f}{o['best']:>9.4f}{args.batch / o['median']:>10.1f}"
              f"{o['gflop']:>8.0f}{o['peak_mib']:>10,.0f}  {parts}")
    if rates:
        print(f"matmul rate ({group}; torch.mm, median of before and after): "
              + ", ".join(f"{p} {v:.0f} GFLOP/s" for p, v in rates.items()))
    ratios = {label: t[ref]["median"] / t[mine]["median"] for label, mine, ref in pairs}
    if ratios:
        print("ratios of medians (how many times faster rdpp's side is):",
              *(f"  {k}: {v:.2f}" for k, v in ratios.items()), sep="\n")
    for k, c in checks.items():
        print(f"checked first ({k}): {json.dumps(c, default=float)}")
    if args.json:
        rows = {k: {kk: v for kk, v in o.items() if kk != "results"} for k, o in t.items()}
        print(json.dumps({"benchmark": "models_speed", "model": args.model, "title": b.title, "group": group,
                          "batch": args.batch, "quick": args.quick, "device": args.device, "machine": m, "steps": rows,
                          "ratios": ratios, "pairs": pairs, "matmul_gflops": rates, "checks": checks}, default=float))
    sys.stdout.flush()


def fast_compiles(r: dict) -> list[tuple[str, str]]:
    """(side, its compile seconds or error) of every fast side a models_speed line checked."""
    out = []
    for group, checks in r.get("checks", {}).items():
        for name, c in checks.items():
            if not isinstance(c, dict) or not ("compile_s" in c or name in VARIANTS or name.split()[-1] in VARIANTS):
                continue
            side = f"{r['title']} {group} {name}" if name in VARIANTS else name.removeprefix("rdpp ")
            out.append((side, f"{c['compile_s']:.1f} s" if "compile_s" in c else c.get("error", "?")))
    return out


def summary(paths: list[str]) -> None:
    """One table of every figure the logs' JSON lines hold: each model's rows against the peer and
    the fast path, every fast side's compile seconds (or why it has none), the epochs (their warm-ups
    apart) and the recipe's projection (benchmarks/cuda_check.sh ends with it)."""
    lines = [json.loads(ln) for p in paths if Path(p).is_file() for ln in open(p) if ln.startswith("{")]
    epochs = [r for r in lines if r.get("benchmark") == "data_epochs"][-1:]  # the last holds every epoch so far
    lines = [r for r in lines if r.get("benchmark") != "data_epochs"] + epochs
    print(f"{'figure':<64}{'rdpp':>12}{'other side':>12}{'ratio':>8}")
    for r in lines:
        if r.get("benchmark") == "models_speed":
            for label, mine, ref in r["pairs"]:
                x = r["ratios"][label]
                print(f"{r['title'] + ' ' + label:<64}{1e3 * r['steps'][mine]['median']:>10.1f}ms"
                      f"{1e3 * r['steps'][ref]['median']:>10.1f}ms{x:>7.2f}x")
            for side, took in fast_compiles(r):
                print(f"{'compile ' + side:<64}{took:>12}")
        elif r.get("benchmark") == "data_epochs":
            for e in r["xe_epoch"].get("warmup", []):
                print(f"{'warm-up (compiling) ' + e['stage'] + ' batch ' + str(e['batch']) + ' ' + e['precision'] + ' ' + e.get('ss', ''):<64}"
                      f"{e['s']:>10.1f} s")
            for e in r["xe_epoch"]["epochs"]:
                print(f"{'epoch ' + e['stage'] + ' batch ' + str(e['batch']) + ' ' + e['precision'] + ' ' + e.get('ss', ''):<64}"
                      f"{e['images_per_s']:>8,.0f} im/s{'':>12}")
        elif r.get("benchmark") == "recipe_hours":
            for x in r["recipes"]:
                print(f"the recipe: {x['recipe']}\n{'':<64}{x['gpu_hours']:>10.2f} h")
    for p in paths:
        if p.endswith("test_cuda.log") and Path(p).is_file():
            lines = open(p).read().splitlines()
            tail = [ln.strip() for ln in lines if any(w in ln for w in (" passed", " failed", " skipped", " error"))]
            print(f"{'tests/test_cuda.py':<64}{(tail or ['(no result)'])[-1]}")
            for ln in lines:  # -v names each test as it ends: a step stopped at its limit still names its failures
                if ln.startswith("tests/test_cuda.py::") and (" FAILED" in ln or " ERROR" in ln):
                    print(f"{'  failed: ' + ln.split()[0].split('::')[1]:<64}")


if __name__ == "__main__":
    main()
