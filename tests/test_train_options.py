"""The training stages' options declared once (rdpp_cli.training.options) and the training recipe's
extension points (rdpp_cli.training.loop): every field is a flag, a --config key and an rdpp.yaml
key; bad values are refused before any folder is made; the resume identity keeps its keys; loggers
see what metrics.csv holds; an interrupt handler can read the run's position."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.options import hints, option_fields
from rdpp_cli.training import loggers, loop
from rdpp_cli.errors import RdppError
from rdpp_cli.models.registry import model_spec
from rdpp_cli.training.options import FinetuneOptions, TrainLoopOptions, XEOptions
from rdpp_cli.training.xe import xe_loss

from helpers import att2in_for, error_line, listing, rdpp, write_tiny_data

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")

# a valid value other than the default for every field of the two stages (a new option adds a line)
VALUES = {
    "epochs": 7, "batch_size": 9, "lr": 0.002, "grad_clip": 0.25, "grad_clip_mode": "norm", "lr_decay_every": 4,
    "lr_decay_rate": 0.5, "val_images": 3, "val_batch_size": 11, "save_every_steps": 2, "seed": 5, "device": "cpu",
    "precision": "bf16", "workers": 1, "resident": "off", "resume": False, "seq_per_img": 3, "data": "tiny-v1", "preset": None,
    "init_from": "xe/att2in-small-v1", "out": None, "force": True, "workspace": None, "model": "xe/a-v1",
    "reward": "scst", "m": 3, "baseline": "mean", "lam": 2.5, "sample_mode": "eval", "checkpoint": "last",
    "fast": "on", "ss_start": 2, "ss_every": 3, "ss_step": 0.1, "ss_max": 0.5, "label_smoothing": 0.1,
    "lr_schedule": "noam", "warmup": 100, "adam_beta2": 0.98, "adam_eps": 1e-9, "hf_model": "captioner-dir",
}
PRESET = {XEOptions: "small", FinetuneOptions: "paper"}
OWN = {XEOptions: {"model": "transformer"}, FinetuneOptions: {"lr_schedule": "plateau"}}  # a field name both
# stages have, with values of its own
STAGES = [("train-xe", XEOptions, "rdpp_cli.training.xe", "train_xe"),
          ("finetune", FinetuneOptions, "rdpp_cli.training.finetune", "finetune")]


def _record(monkeypatch, module: str, name: str) -> list:
    """The stage function replaced by one that keeps the options it gets."""
    __import__(module)
    calls: list = []
    monkeypatch.setattr(sys.modules[module], name, lambda opts: calls.append(opts))
    return calls


def _flag(f: dataclasses.Field, value) -> list[str]:
    """The command-line words that set field ``f`` to ``value``."""
    if f.metadata.get("argument"):
        return [str(value)]
    flags = f.metadata["flags"] or ("--" + f.name.replace("_", "-"),)
    if isinstance(f.default, bool):  # a switch: --force, --resume/--no-resume
        return [flags[0].split("/")[int(f.default)]]
    return [flags[0], str(value)]


@pytest.mark.integration
@pytest.mark.parametrize("command, cls, module, name", STAGES)
def test_every_field_is_a_flag_a_config_key_and_an_rdpp_yaml_key(tmp_path, monkeypatch, command, cls, module, name):
    calls = _record(monkeypatch, module, name)
    ws = tmp_path / "ws"
    ws.mkdir()
    assert set(cls.field_names()) <= set(VALUES), "give every new option a test value in VALUES"
    values = {**VALUES, **OWN.get(cls, {}), "preset": PRESET[cls], "out": tmp_path / "o", "workspace": ws}
    for f in option_fields(cls):
        want = values[f.name]
        assert want != f.default, f.name  # the value shows that the key was read
        cfg = tmp_path / f"{f.name}.json"
        cfg.write_text(json.dumps({f.name: str(want) if isinstance(want, Path) else want}))
        r = rdpp(command, "--config", cfg)
        assert r.exit_code == 0, (f.name, r.output)
        assert calls[-1] == cls(**{f.name: want}), f.name
        if f.name != "workspace":
            r = rdpp(command, *_flag(f, want), "--workspace", ws)
            assert r.exit_code == 0, (f.name, r.output)
            assert calls[-1] == cls(**{f.name: want, "workspace": ws}), f.name
    # <workspace>/rdpp.yaml's section, under a flag typed on the command line
    (ws / "rdpp.yaml").write_text(f"{cls.section}:\n  lr: 0.003\n  seed: 9\n")
    r = rdpp(command, "--workspace", ws, "--seed", "4")
    assert r.exit_code == 0, r.output
    assert (calls[-1].lr, calls[-1].seed) == (0.003, 4)


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["train-xe", "--grad-clip-mode", "l3"], "--grad-clip-mode 'l3' is not a clipping mode; use one of value, norm"),
    (["train-xe", "--lr-decay-rate", "0"], "--lr-decay-rate must be in (0, 1] (got 0.0)"),
    (["train-xe", "--val-images", "-1"], "--val-images must be at least 0 (got -1)"),
    (["train-xe", "--workers", "-2"], "--workers must be at least 0 (got -2)"),
    (["train-xe", "--grad-clip", "inf"], "--grad-clip must be a finite number (got inf)"),
    (["train-xe", "--preset", "huge"], "--preset 'huge' is not a preset; use one of paper, small"),
    (["train-xe", "--precision", "half"], "--precision 'half' is not a precision; use one of fp32, tf32, bf16, fp16, auto"),
        # an option that cannot act in the combination (issue 36): refused when given, not when a recipe sets it
        (["train-xe", "--preset", "small", "--warmup", "10"], "--warmup is the noam schedule's warm-up, which "
         "--lr-schedule step has not"),
        (["train-xe", "--preset", "small", "--ss-every", "3"], "--ss-every shapes scheduled sampling, which is off"),
        (["train-xe", "--model", "transformer", "--lr-decay-every", "3"], "--lr-decay-every sets the step "
         "schedule's decay, which --lr-schedule noam does not use"),
    (["finetune", "--reward", "ppo"], "--reward 'ppo' is not a reward; use one of dpp, scst, scst-mean, xe-cider"),
    (["finetune", "--sample-mode", "greedy"], "--sample-mode 'greedy' is not a sample mode; use one of train, eval"),
    (["finetune", "--checkpoint", "first"], "--checkpoint 'first' is not a checkpoint; use one of best, last"),
    (["finetune", "--preset", "coco"], "--preset 'coco' is not a preset; use one of paper, small, toy"),
    (["finetune", "--lam", "nan"], "--lam must be a finite number (got nan)"),  # even with --reward dpp
    (["finetune", "--reward", "scst-mean", "--m", "1"], "--m 1 with --reward scst-mean"),
    (["finetune", "--epochs", "0"], "--epochs must be at least 1 (got 0)"),
])
def test_bad_values_are_refused_before_any_folder_is_made(tmp_path, args, message):
    ws = tmp_path / "ws"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2)
    before = listing(ws)
    line = error_line(rdpp(*args, "--device", "cpu", "--workspace", ws))
    assert message in line, line
    assert listing(ws) == before
    # the same value from a config file is refused the same way
    flag, value = args[1], args[2]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"{flag[2:]}: '{value}'\n" if flag != "--lam" else "lam: .nan\n")
    line = error_line(rdpp(args[0], *args[3:], "--config", cfg, "--device", "cpu", "--workspace", ws))
    assert message in line, line
    assert listing(ws) == before


@pytest.mark.unit
def test_the_stage_functions_take_the_fields_with_their_types():
    from rdpp_cli.scoring.score import score
    from rdpp_cli.training.finetune import finetune
    from rdpp_cli.training.xe import train_xe

    for fn in (train_xe, finetune, score):
        types = hints(fn.options)
        params = inspect.signature(fn).parameters
        assert {n: p.annotation for n, p in params.items() if n in types} == {n: types[n] for n in fn.options.field_names()}
    assert list(inspect.signature(train_xe).parameters)[-1] == "after_step"


@pytest.mark.unit
def test_finetune_presets_fill_only_what_was_not_given():
    opts = FinetuneOptions(preset="paper", epochs=2, lr=1e-3).with_preset("att2in")
    assert (opts.epochs, opts.lr) == (2, 1e-3)
    assert (opts.batch_size, opts.lr_decay_every, opts.lr_decay_rate) == (128, 15, 0.8)
    small = model_spec("att2in").recipe("finetune", "small")
    assert small.pop("lr_schedule") == "step"  # left out of the identity: runs from before it still resume
    assert FinetuneOptions().with_preset("att2in").identity() == {
        **small, "grad_clip": 0.1, "grad_clip_mode": "value", "val_images": None,
        "val_batch_size": 100, "seed": 123, "precision": "fp32", "reward": "dpp", "m": 5, "baseline": "none",
        "lam": 5.0, "preset": "toy", "sample_mode": "train", "checkpoint": "best"}
    assert FinetuneOptions(reward="xe-cider").seq_per_img == 5 and FinetuneOptions().seq_per_img == 1


@pytest.mark.unit
def test_finetune_small_keeps_the_identity_it_had_as_toy():
    """`toy` is accepted as `small`'s old name; either way the identity says `toy`, as runs made
    before the rename recorded it, so that they resume."""
    toy, small = (FinetuneOptions(preset=p).with_preset("att2in") for p in ("toy", "small"))
    assert toy.identity() == small.identity() and small.identity()["preset"] == "toy"
    assert small.recipe_record()["preset"] == toy.recipe_record()["preset"] == "small"


@pytest.mark.unit
def test_the_recipe_is_a_field_that_replace_keeps():
    """The recipe filled in from the checkpoint's architecture travels with the options: a later
    ``replace`` keeps it (the manifest records it), and it is no option (no flag, no config key)."""
    opts = FinetuneOptions(preset="paper", epochs=2).with_preset("att2in")
    want = {"model": "att2in", "stage": "finetune", "preset": "paper",
            "values": {"batch_size": 128, "lr": 5e-4, "lr_decay_every": 15, "lr_decay_rate": 0.8,
                       "lr_schedule": "step"}}
    assert opts.recipe_record() == want
    later = opts.replace(device="cpu", seed=7)
    assert later.recipe_record() == want and later.with_preset("updown") is later  # resolved once
    _, config = loop.run_settings("finetune", later, "fp32", identity={}, recorded={})
    assert config["recipe"] == want
    assert "recipe" not in FinetuneOptions.field_names() and "recipe" not in later.identity()


@pytest.mark.unit
def test_the_combination_is_checked_once_every_value_is_known_and_again_after_replace():
    """Checks across fields run on the values the run uses: not on the None of a value the recipe has
    yet to fill (a plateau recipe with --val-images 0 is let through until then), and again on a
    ``replace`` of resolved options, which no longer lets a bad combination through."""
    waiting = FinetuneOptions(preset="paper", val_images=0)  # lr_schedule None: the recipe's, not yet known
    assert waiting.lr_schedule is None and waiting.recipe_record() is None
    with pytest.raises(RdppError, match="--val-images 0 turns validation off"):
        waiting.with_preset("transformer")  # the transformer's fine-tuning recipe: plateau
    plateau = FinetuneOptions(preset="paper").with_preset("transformer")
    with pytest.raises(RdppError, match="--val-images 0 turns validation off"):
        plateau.replace(val_images=0)
    noam = XEOptions(model="transformer").with_preset()
    assert noam.lr_schedule == "noam" and noam.lr_decay_every is not None  # from the recipe: silent
    with pytest.raises(RdppError, match="--lr-decay-every sets the step schedule's decay, which --lr-schedule noam"):
        noam.replace(lr_decay_every=2)  # given after the fill-in: it cannot act
    step = XEOptions(preset="small").with_preset()
    with pytest.raises(RdppError, match="--warmup is the noam schedule's warm-up"):
        step.replace(warmup=10)


@pytest.mark.unit
def test_each_stage_owns_its_refusals_of_unused_options():
    """The step decay's refusal is the loop's (both stages have it); the warm-up's and the scheduled-
    sampling shape's are train-xe's alone: fine-tuning has neither option, and no message for them."""
    ft = FinetuneOptions(preset="paper").with_preset("transformer")
    assert ft.why_unused("lr_decay_rate").startswith("--lr-decay-rate sets the step schedule's decay, which "
                                                     "--lr-schedule plateau does not use")
    for name in ("warmup", "ss_every"):
        with pytest.raises(KeyError):
            ft.why_unused(name)
    xe = XEOptions(preset="small").with_preset()
    assert xe.why_unused("ss_every").startswith("--ss-every shapes scheduled sampling, which is off")
    assert xe.why_unused("warmup").startswith("--warmup is the noam schedule's warm-up")


# -- the resume identity and the manifest's config keep their keys (an old unfinished run resumes) --

XE_IDENTITY = {"stage", "data_sha256", "preset", "init_sha256", "epochs", "batch_size", "seq_per_img", "lr",
               "grad_clip", "grad_clip_mode", "lr_decay_every", "lr_decay_rate", "val_images", "val_batch_size",
               "seed", "precision"}
FT_IDENTITY = {"stage", "reward", "m", "baseline", "lam", "preset", "sample_mode", "train_reward", "model_sha256",
               "checkpoint", "data_sha256", "epochs", "batch_size", "lr", "grad_clip", "grad_clip_mode",
               "lr_decay_every", "lr_decay_rate", "val_images", "val_batch_size", "seed", "precision"}
NOT_IDENTITY = {"device", "precision_option", "fast", "fast_option", "workers", "resident", "save_every_steps",
                "processes"}


@pytest.mark.unit
def test_run_settings_keep_the_identity_and_config_keys():
    small = XEOptions(device="cpu", precision="auto", preset="small").with_preset()  # att2in as it always trained
    ident, config = loop.run_settings("xe", small, "bf16",
                                      identity={"data_sha256": "d", "preset": "paper", "init_sha256": None},
                                      recorded={"data": "data/toy-v1", "init_from": None})
    assert set(ident) == XE_IDENTITY and ident["precision"] == "bf16"
    assert set(config) == XE_IDENTITY | NOT_IDENTITY | {"data", "init_from", "recipe"}
    # a setting that changes the run is part of its identity: the model, scheduled sampling (with its
    # schedule), the Noam schedule (with its warm-up), Adam's constants
    paper = XEOptions(model="transformer", preset="paper", ss_start=1).with_preset()
    extra = set(paper.identity()) - XE_IDENTITY
    assert extra == {"model", "ss_start", "ss_every", "ss_step", "ss_max", "lr_schedule", "warmup", "adam_beta2",
                     "adam_eps"}, extra
    assert set(paper.recorded()) - set(small.recorded()) == extra
    assert (config["precision"], config["precision_option"], config["device"]) == ("bf16", "auto", "cpu")
    assert (config["fast"], config["fast_option"]) == ("off", "auto")  # --fast auto: off on this CPU
    opts = FinetuneOptions(reward="dpp", lam=2.0).with_preset("att2in")
    ident, config = loop.run_settings("finetune", opts, "fp32",
                                      identity={"lam": None, "train_reward": "t", "model_sha256": "m",
                                                "data_sha256": "d"},
                                      recorded={"model": "xe/a-v1", "data": "data/toy-v1", "val_samples": 5})
    assert set(ident) == FT_IDENTITY and ident["lam"] is None and config["lam"] == 2.0
    assert set(config) == FT_IDENTITY | NOT_IDENTITY | {"model", "data", "val_samples", "recipe", "lr_schedule"}


@pytest.mark.unit
def test_a_manifest_records_only_settings_that_acted():
    """Issue 36: the Noam schedule ignores the step decay, so a Transformer run's manifest does not record
    it (its identity keeps it: a run from before still resumes); the plateau schedule likewise."""
    noam = XEOptions(model="transformer", preset="small", device="cpu").with_preset()
    ident, config = loop.run_settings("xe", noam, "fp32", identity={"data_sha256": "d", "preset": "small",
                                                                     "init_sha256": None}, recorded={})
    assert "lr_decay_every" not in config and "lr_decay_rate" not in config and config["lr_schedule"] == "noam"
    assert (ident["lr_decay_every"], ident["lr_decay_rate"]) == (3, 0.8)  # as runs before this recorded them
    assert config["recipe"] == {"model": "transformer", "stage": "train-xe", "preset": "small",
                                "values": {k: v for k, v in model_spec("transformer").recipe("train-xe", "small")
                                           .items() if not k.startswith("lr_decay")}}  # nor the unused ss shape
    step = XEOptions(preset="small", device="cpu").with_preset()
    _, config = loop.run_settings("xe", step, "fp32", identity={}, recorded={})
    assert (config["lr_decay_every"], config["lr_decay_rate"]) == (3, 0.8) and "warmup" not in config
    plateau = FinetuneOptions(preset="paper", device="cpu").with_preset("transformer")
    ident, config = loop.run_settings("finetune", plateau, "fp32", identity={}, recorded={})
    assert config["lr_schedule"] == "plateau" and config["lr"] == 1e-5 and config["batch_size"] == 10
    assert not {"lr_decay_every", "lr_decay_rate"} & (set(config) | set(ident))


@pytest.mark.unit
def test_an_option_that_cannot_act_is_refused_only_when_given():
    """From a recipe the step decay of a Noam run or the scheduled-sampling shape of a run without it are
    silent; given explicitly (command line, --config, rdpp.yaml) they are refused in one line."""
    XEOptions(model="transformer").with_preset()  # the recipe's decay settings: fine
    XEOptions(preset="small").with_preset()  # ss settings' defaults with scheduled sampling off: fine
    cases = [(XEOptions(model="transformer", lr_decay_rate=0.5), "--lr-decay-rate sets the step schedule's decay"),
             (XEOptions(preset="small", ss_max=0.3), "--ss-max shapes scheduled sampling, which is off"),
             (XEOptions(preset="small", ss_step=0.1), "--ss-step shapes scheduled sampling"),
             (XEOptions(preset="small", lr_schedule="step", warmup=5), "--warmup is the noam schedule's"),
             (XEOptions(model="transformer", lr_schedule="step", warmup=5), "--warmup is the noam schedule's")]
    for opts, message in cases:
        with pytest.raises(RdppError, match=message):
            opts.with_preset()
    assert XEOptions(preset="small", ss_start=0, ss_max=0.3).with_preset().ss_max == 0.3
    with pytest.raises(RdppError, match="--lr-decay-every sets the step schedule's decay, which --lr-schedule "
                                        "plateau does not use"):
        FinetuneOptions(preset="paper", lr_decay_every=2).with_preset("transformer")
    assert FinetuneOptions(preset="paper", lr_decay_every=2).with_preset("updown").lr_decay_every == 2
    with pytest.raises(RdppError, match="--val-images 0 turns validation off"):
        FinetuneOptions(preset="paper", val_images=0).with_preset("transformer")


# -- the recipe: loggers, position, the loss in one place -------------------------------------------

class Recorder(loggers.Logger):
    def __init__(self):
        self.steps, self.epochs, self.started, self.closed, self.positions = [], [], None, False, []

    def start(self, history):
        self.started = list(history)

    def log_step(self, step, logs):
        self.steps.append((step, logs["loss"]))
        self.positions.append(str(loop.current_position()))

    def log_epoch(self, row, history):
        self.epochs.append(dict(row))

    def close(self):
        self.closed = True


@pytest.mark.integration
def test_loggers_see_every_step_and_the_rows_of_metrics_csv(tmp_path):
    d = DataArtifact.open(write_tiny_data(tmp_path / "d", n_train=8, n_val=2, n_test=0))
    torch.manual_seed(0)
    model = att2in_for(d, 16)
    rec = Recorder()
    seen = []
    recipe = loop.TrainingRecipe(
        stage="xe", model=model, data=d, out_dir=tmp_path / "out",
        opts=TrainLoopOptions(epochs=2, batch_size=4, lr=1e-2, val_images=2, device="cpu", seed=0),
        step_fn=xe_loss, inputs=[d.artifact], manifest_config={}, loggers=[rec],
        after_step=lambda step: seen.append((step, str(loop.current_position()))))
    art = recipe.run()
    m = pd.read_csv(art.path / "metrics.csv")
    assert rec.started == [] and rec.closed and loop.current_position() is None
    assert [s for s, _ in rec.steps] == [1, 2, 3, 4]
    pd.testing.assert_frame_equal(pd.DataFrame(rec.epochs), m, check_dtype=False)
    # the epoch's loss is the mean of its steps' (equal batches)
    assert m["loss"].tolist() == pytest.approx([(rec.steps[0][1] + rec.steps[1][1]) / 2,
                                                (rec.steps[2][1] + rec.steps[3][1]) / 2], rel=1e-12)
    # an interrupt handler reads "epoch E, step S" from the run in progress
    assert seen == [(1, "epoch 1, step 1"), (2, "epoch 1, step 2"), (3, "epoch 2, step 3"), (4, "epoch 2, step 4")]
    assert rec.positions == [p for _, p in seen]
    assert recipe.position == loop.Position(epoch=2, batch=0, step=4)


@pytest.mark.unit
def test_workers_default_to_what_the_device_wants():
    """Issue 34: --workers not given reads ahead with 4 threads on CUDA and none on a CPU (as before);
    the manifest records the number used."""
    assert [XEOptions().loader_workers(d) for d in ("cuda", "cpu")] == [4, 0]
    assert FinetuneOptions(workers=2).loader_workers("cuda") == 2 and XEOptions(workers=0).loader_workers("cuda") == 0
    _, config = loop.run_settings("xe", XEOptions(device="cpu", preset="small").with_preset(), "fp32", identity={},
                                  recorded={})
    assert config["workers"] == 0


@pytest.mark.unit
def test_the_plateau_schedule_halves_the_lr_after_three_epochs_without_a_better_val_cider():
    """self-critical.pytorch's --reduce_on_plateau (factor 0.5, patience 3) on the validation CIDEr-D,
    higher being better: the Transformer's finetune --preset paper."""
    import torch

    opts = FinetuneOptions(preset="paper").with_preset("transformer")
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(net.parameters(), lr=opts.lr)
    sched = loop.lr_schedule(opt, opts, net)
    lrs = []
    for cider in (0.5, 0.6, 0.6, 0.55, 0.6, 0.59, 0.7):
        sched.step(cider)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == [1e-5] * 5 + [5e-6, 5e-6]  # best 0.6 at epoch 2; halved after the 4th epoch no better (> 3)
