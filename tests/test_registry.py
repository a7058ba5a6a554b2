"""A model is one file plus one registry line (rdpp_cli/models/registry.py; CONTRIBUTING.md, "A new
model"): a fourth model, defined here, trains and fine-tunes from its line alone; the fine-tuning
recipe follows the XE model's architecture and the manifest records it; the registry and the options
load without torch; no module outside rdpp_cli/models/ names a model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.models import registry
from rdpp_cli.models.base import DropoutMasks, sequence_logprobs, stepwise_logprobs
from rdpp_cli.models.checkpoint import load_model
from rdpp_cli.training.finetune import finetune
from rdpp_cli.training.options import FinetuneOptions, XEOptions
from rdpp_cli.training.xe import train_xe

from helpers import tiny_workspace

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1] / "rdpp_cli"


# -- a fourth model: a GRU over the mean region feature, nothing else -----------------------------------

@dataclass
class BagConfig:
    vocab_size: int
    att_feat_size: int
    seq_length: int = 16
    rnn_size: int = 16


class Bag(nn.Module):
    """h_t = GRU(E[w_{t-1}] + W mean_i(att_i), h_{t-1}); p(w_t) = log_softmax(W_o h_t)."""

    uses_fc = False
    supports_fast = False

    def __init__(self, config: BagConfig):
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size + 1, c.rnn_size)
        self.att_embed = nn.Linear(c.att_feat_size, c.rnn_size)
        self.cell = nn.GRUCell(c.rnn_size, c.rnn_size)
        self.logit = nn.Linear(c.rnn_size, c.vocab_size + 1)

    def encode(self, att: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None,
               drop: DropoutMasks | None = None) -> Tensor:
        w = torch.ones(att.shape[:2], device=att.device) if att_mask is None else att_mask.to(att.dtype)
        return self.att_embed((att * w.unsqueeze(2)).sum(1) / w.sum(1, keepdim=True).clamp(min=1))

    def expand(self, enc: Tensor, n: int) -> Tensor:
        return enc.repeat_interleave(n, 0)

    def init_state(self, rows: int) -> tuple[Tensor]:
        return (self.logit.weight.new_zeros(rows, self.config.rnn_size),)

    def step(self, it: Tensor, enc: Tensor, state: tuple, drop=None) -> tuple[Tensor, tuple]:
        h = self.cell(self.embed(it) + enc, state[0])
        return F.log_softmax(self.logit(h), -1), (h,)

    def forward(self, att: Tensor, seqs: Tensor, att_mask: Tensor | None = None, fc: Tensor | None = None) -> Tensor:
        return stepwise_logprobs(self, att, seqs, att_mask, fc)

    def token_logprobs(self, att, seqs, att_mask=None, drop=None, fc=None) -> tuple[Tensor, Tensor]:
        return sequence_logprobs(self(att, seqs, att_mask), seqs.reshape(-1, seqs.shape[-1]))

    def draw_dropout(self, batch, rows, steps, regions, generator=None) -> DropoutMasks:
        return DropoutMasks()  # no dropout


_FT = {"epochs": 1, "batch_size": 4, "lr": 1e-3, "lr_decay_every": 0, "lr_decay_rate": 0.8, "lr_schedule": "step"}
BAG = registry.ModelSpec(
    "bag", f"{__name__}:Bag", f"{__name__}:BagConfig", "Bag", "this test",
    sizes={"paper": {"rnn_size": 64}, "small": {"rnn_size": 12}},
    recipes={"train-xe": {p: {"epochs": 1, "batch_size": 4, "lr": 3e-3, "lr_decay_every": 1, "lr_decay_rate": 0.5,
                              "ss_start": -1, "lr_schedule": "step", "warmup": 0, "adam_beta2": 0.99,
                              "adam_eps": 1e-7} for p in ("paper", "small")},
             "finetune": {"paper": {**_FT, "lr": 7e-5}, "small": _FT}})


@pytest.fixture
def bag(monkeypatch):
    monkeypatch.setitem(registry.MODELS, "bag", BAG)
    return BAG


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    return tiny_workspace(tmp_path_factory.mktemp("ws"))


@pytest.mark.integration
def test_a_fourth_model_trains_and_fine_tunes_from_its_registry_line_alone(bag, ws, tmp_path):
    opts = XEOptions(model="bag", preset="small", device="cpu").with_preset()
    assert (opts.lr, opts.adam_beta2, opts.adam_eps, opts.batch_size) == (3e-3, 0.99, 1e-7, 4)
    art = train_xe(ws / "data" / "tiny-v1", model="bag", preset="small", val_images=2, device="cpu",
                   out=tmp_path / "xe", workspace=ws)
    cfg = art.manifest["config"]
    assert (cfg["model"], cfg["architecture"], cfg["preset"], cfg["lr"]) == ("bag", "bag", "small", 3e-3)
    model, vocab, ckpt = load_model(tmp_path / "xe" / "checkpoints" / "best.pt")
    assert type(model).__name__ == "Bag" and model.config.rnn_size == 12 and ckpt["model"] == "bag"
    ft = finetune(tmp_path / "xe", preset="paper", reward="scst", val_images=2, device="cpu",
                  out=tmp_path / "ft", workspace=ws)
    cfg = read_artifact(ft.path).config
    assert cfg["lr"] == 7e-5 and cfg["recipe"] == {"model": "bag", "stage": "finetune", "preset": "paper",
                                                   "values": {**_FT, "lr": 7e-5}}


@pytest.mark.unit
def test_a_registry_line_is_read_without_importing_its_model():
    """--model's check, --help and the recipes read the line; the class is imported when built."""
    code = ("import sys; from rdpp_cli.training.options import XEOptions, FinetuneOptions\n"
            "o = XEOptions(model='updown').with_preset(); f = FinetuneOptions(preset='paper').with_preset('updown')\n"
            "from rdpp_cli.models.registry import MODELS\n"
            "assert {'Att2in', 'UpDown', 'Transformer', 'HFCaptioner'} <= {s.class_name for s in MODELS.values()}\n"
            "print(o.batch_size, f.lr, 'torch' in sys.modules, 'rdpp_cli.models.updown' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["10", "5e-05", "False", "False"]


@pytest.mark.unit
def test_finetune_paper_follows_the_architecture_of_the_xe_model():
    """self-critical.pytorch's updown_sc.yml (lr 5e-5, no decay, batch 10; 50 - 30 epochs) and
    transformer_sc.yml (lr 1e-5, no Noam, reduce-on-plateau, batch 10; 50 - 15 epochs); Att2in: the
    R-DPP authors' train_dpp.sh."""
    got = {m: FinetuneOptions(preset="paper").with_preset(m) for m in registry.MODELS}
    assert [(o.lr, o.batch_size, o.epochs, o.lr_schedule, o.lr_decay_every) for o in got.values()] == [
        (5e-4, 128, 100, "step", 15), (5e-5, 10, 20, "step", 0), (1e-5, 10, 35, "plateau", 0),
        (1e-5, 16, 6, "step", 0)]  # hf: a pretrained decoder continued at a small lr (no published recipe)
    assert all(o.m == 5 for o in got.values())


@pytest.mark.integration
def test_finetune_paper_from_a_transformer_records_the_peers_lr_and_plateau(ws, tmp_path):
    xe = train_xe(ws / "data" / "tiny-v1", model="transformer", preset="small", epochs=1, batch_size=4,
                  val_images=2, device="cpu", out=tmp_path / "xe", workspace=ws)
    ft = finetune(xe.path, preset="paper", epochs=2, batch_size=4, val_images=2, device="cpu",
                  out=tmp_path / "ft", workspace=ws)
    cfg = read_artifact(ft.path).config
    assert (cfg["lr"], cfg["lr_schedule"], cfg["preset"]) == (1e-5, "plateau", "paper")
    assert cfg["recipe"]["model"] == "transformer" and cfg["recipe"]["values"]["lr"] == 1e-5
    assert "lr_decay_every" not in cfg and "lr_decay_rate" not in cfg


@pytest.mark.unit
def test_no_module_outside_models_names_a_model_class():
    """Help texts, defaults and the precision probe read the registry: only rdpp_cli/models/ names a
    model's class, or att2in at all (the default --model is read from the registry too)."""
    names = "|".join(s.class_name for s in registry.MODELS.values())
    wrong = [str(p.relative_to(ROOT)) for p in sorted(ROOT.rglob("*.py")) if p.parent.name != "models"
             and (re.search(rf"\b({names})\b", p.read_text()) or re.search("att2in", p.read_text(), re.IGNORECASE))]
    assert not wrong, wrong


@pytest.mark.integration
def test_init_from_records_the_sizes_it_ran_with_not_the_presets(ws, tmp_path):
    """Issue 36: with --init-from the sizes are the init model's; a manifest does not say `preset: paper`
    for them. The recipe (lr, batch, ...) still came from --preset paper, and says so."""
    small = train_xe(ws / "data" / "tiny-v1", preset="small", epochs=1, batch_size=4, val_images=2,
                     device="cpu", out=tmp_path / "small", workspace=ws)
    art = train_xe(ws / "data" / "tiny-v1", init_from=str(small.path), preset="paper", epochs=1, batch_size=4,
                   ss_start=-1, val_images=2, device="cpu", out=tmp_path / "init", workspace=ws)
    cfg = art.manifest["config"]
    assert cfg["preset"] is None and cfg["sizes_from"] == str(small.path / "checkpoints" / "best.pt")
    assert cfg["recipe"]["preset"] == "paper" and cfg["lr"] == 5e-4 and cfg["lr_decay_every"] == 15
    assert cfg["model_config"]["rnn_size"] == 256  # the small model's, not the paper's 512
