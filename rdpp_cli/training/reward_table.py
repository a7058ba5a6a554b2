"""The rewards of `rdpp finetune --reward NAME`, one line each: what the step must compute for it.

A reward turns the step's CIDEr-D numbers into one weight per sampled caption: the sample scores
``q`` (B, m), the greedy captions' scores ``g`` (B,) and the samples' pairwise kernel ``K``
(B, m, m). Its line says which of these it needs (``greedy``: decode the greedy baseline;
``kernel``: score the samples against each other), how the policy-gradient loss is normalised
(``per_slot``: per sample slot, as the published R-DPP code; else over all sampled tokens, as
self-critical.pytorch), whether the references' XE loss is added (``xe_mix``), the least ``m`` it
works with, the options that belong to it alone (recorded in the manifest and the run's identity),
the stem of its artifacts' names, and the weight function: a pure tensor function in
``rdpp_cli.training.rewards`` with the signature ``(q, g, K, baseline) -> (weights, logs)``, named
here as "module:function" and imported on first use (this table, like every option, loads
without torch: ``rdpp --help`` reads it).

A new reward: its function in rewards.py, one line here, its test (CONTRIBUTING.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reward:
    name: str
    help: str  # a few words for --reward's help
    weights: str  # "module:function" of the weight function
    greedy: bool = False  # needs the greedy captions' scores g
    kernel: bool = False  # needs the samples' pairwise CIDEr-D kernel K
    per_slot: bool = False  # pg_loss normalised per sample slot (groups = m)
    xe_mix: bool = False  # the loss is the references' XE + lam x this reward's policy gradient
    min_m: int = 1
    min_m_why: str = ""
    settings: tuple[str, ...] = ()  # finetune options that belong to this reward alone
    stem: Callable[[int, str, float], str] = lambda m, baseline, lam: ""

    def weight_fn(self) -> Callable[..., Any]:
        module, fn = self.weights.split(":")
        return getattr(importlib.import_module(module), fn)

    def run_name(self, m: int, baseline: str, lam: float) -> str:
        """The workspace name stem of a run with this reward."""
        return self.stem(m, baseline, lam)


def _m_suffix(m: int) -> str:
    return "" if m == 5 else f"-m{m}"


_R = "rdpp_cli.training.rewards:"
REWARDS: dict[str, Reward] = {r.name: r for r in (
    Reward("dpp", "R-DPP", _R + "dpp_reward", kernel=True, per_slot=True, min_m=2,
           min_m_why="a DPP over one caption has no diversity term; use --m 2 or more (the paper's default is 5)",
           settings=("baseline",), stem=lambda m, baseline, lam: f"dpp-m{m}" + ("-mean" if baseline == "mean" else "")),
    Reward("scst", "greedy baseline", _R + "scst_reward", greedy=True,
           stem=lambda m, baseline, lam: "scst" + _m_suffix(m)),
    Reward("scst-mean", "leave-one-out mean baseline", _R + "mean_baseline_reward", min_m=2,
           min_m_why="the mean baseline averages the other samples of the image; use --m 2 or more",
           stem=lambda m, baseline, lam: "scst-mean" + _m_suffix(m)),
    Reward("xe-cider", "XE + lam x SCST", _R + "scst_reward", greedy=True, xe_mix=True, settings=("lam",),
           stem=lambda m, baseline, lam: f"xe-cider-l{lam:g}" + _m_suffix(m)),
)}
