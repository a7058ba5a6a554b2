"""A rerun of a training command whose settings are left to `auto` resumes the unfinished run in what
that run recorded (precision, fast path), even where `auto` resolves otherwise now (the precision
cache deleted, another machine state), and says so; before, the same command started a new version
in the other precision and the first run was never resumed."""

from __future__ import annotations

import os
import shutil

import pytest

from rdpp_cli import precision as L  # the leaf: autocast, dtypes, native bf16
from rdpp_cli import precision_probe as P  # --precision auto: the probe and its cache
from rdpp_cli.training import fast as fast_mod
from rdpp_cli.training.xe import train_xe

from helpers import Crash, tiny_workspace

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


def _crash_at(n: int):
    def hook(step: int) -> None:
        if step == n:
            raise Crash("killed")
    return hook


def test_a_rerun_under_auto_resumes_the_unfinished_run_as_recorded(tmp_path, monkeypatch, capsys):
    ws = tiny_workspace(tmp_path / "ws")
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    monkeypatch.setattr(P, "probe_cpu_bf16", lambda shape: {"fp32_s": 2.0, "bf16_s": 1.0})  # bf16 measured faster
    kw = dict(workspace=ws, preset="small", epochs=1, batch_size=4, val_images=2, lr=2e-3, device="cpu", seed=1,
              precision="auto", fast="auto", save_every_steps=2)
    with pytest.raises(Crash):
        train_xe(ws / "data" / "tiny-v1", after_step=_crash_at(3), **kw)
    first = ws / "xe" / "att2in-small-v1"
    assert (first / "checkpoints" / "last_state.pt").is_file()  # a resume state at step 2
    # the rerun: the cache is gone and the probe now answers fp32; --fast auto now answers on
    shutil.rmtree(cache)
    monkeypatch.setattr(P, "probe_cpu_bf16", lambda shape: {"fp32_s": 1.0, "bf16_s": 1.0})
    monkeypatch.setattr(fast_mod, "resolve_fast", lambda option, device, model=None: "on" if option == "auto" else option)
    capsys.readouterr()
    art = train_xe(ws / "data" / "tiny-v1", **kw)
    err = capsys.readouterr().err
    assert art.path == first and not (ws / "xe" / "att2in-small-v2").exists()
    config = art.manifest["config"]
    assert (config["precision"], config["precision_option"], config["fast"], config["fast_option"]) == \
        ("bf16", "auto", "off", "auto")
    assert "fast_ran" not in config  # one fast path throughout
    assert "as it was recorded: precision bf16 (--precision auto now gives fp32), fast off (--fast auto now " \
        "gives on)" in " ".join(err.split())
    assert "resuming" in err and "at epoch 1" in " ".join(err.split())


def test_a_run_resumed_with_another_fast_path_records_both(tmp_path, monkeypatch):
    """A fast run killed and resumed with --fast off ran partly compiled: its manifest says "mixed" and
    lists the parts in order, not the rerun's "off". (The compiled path with torch.compile's aot_eager
    backend, which compiles in seconds on a CPU; the record does not depend on the backend.)"""
    import torch

    monkeypatch.setitem(fast_mod.SETTINGS, "cpu", fast_mod.FastSettings(backend="aot_eager", log_every=2))
    ws = tiny_workspace(tmp_path / "ws")
    kw = dict(out=tmp_path / "run", preset="small", epochs=1, batch_size=4, val_images=2, lr=2e-3, device="cpu",
              seed=1, save_every_steps=2)
    torch._dynamo.reset()
    try:
        with pytest.raises(Crash):
            train_xe(ws / "data" / "tiny-v1", fast="on", after_step=_crash_at(3), **kw)
        art = train_xe(ws / "data" / "tiny-v1", fast="off", **kw)
    finally:
        torch._dynamo.reset()
    config = art.manifest["config"]
    assert (config["fast"], config["fast_ran"], config["fast_option"]) == ("mixed", ["on", "off"], "off")


def test_a_finetune_rerun_under_auto_resumes_in_the_recorded_precision(tmp_path, monkeypatch):
    """The same for `rdpp finetune`, into an --out folder."""
    from rdpp_cli.training.finetune import finetune

    ws = tiny_workspace(tmp_path / "ws", xe_epochs=1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(L, "_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    monkeypatch.setattr(P, "probe_cpu_bf16", lambda shape: {"fp32_s": 2.0, "bf16_s": 1.0})
    kw = dict(out=tmp_path / "ft", workspace=ws, reward="dpp", m=2, epochs=1, batch_size=4, lr=1e-3, val_images=2,
              save_every_steps=1, device="cpu", seed=7, precision="auto")
    model = ws / "xe" / "att2in-small-v1"
    with pytest.raises(Crash):
        finetune(model, after_step=_crash_at(2), **kw)
    shutil.rmtree(tmp_path / "cache")
    monkeypatch.setattr(P, "probe_cpu_bf16", lambda shape: {"fp32_s": 1.0, "bf16_s": 1.0})
    art = finetune(model, **kw)
    assert art.path == tmp_path / "ft" and art.manifest["config"]["precision"] == "bf16"
