"""No run ends in a compiler traceback (rdpp_cli/training/fast.py, ``FastPath.fail``).

A compiler that fails is injected as a torch.compile backend that raises (registered here, chosen
through ``$RDPP_COMPILE_BACKEND`` or the fast path's settings). Compiling is lazy, so it fails at the
first call of a compiled function, in the middle of a step or of validation: under ``--fast auto`` the
run notes it once, takes that step (or validation) again uncompiled from the random state it began
with, and ends with the numbers of a run whose compiler worked (dynamo's "eager" backend: the same
functions, captured and run as they are); under ``--fast on`` it is one ``error:`` line, and the run
resumes with ``--fast off``."""

from __future__ import annotations

import dataclasses
import json
import os

import pandas as pd
import pytest
import torch

from rdpp_cli.models.registry import MODELS
from rdpp_cli.training import fast as F
from rdpp_cli.training.finetune import finetune
from rdpp_cli.training.loop import TrainingRecipe
from rdpp_cli.training.options import TrainLoopOptions
from rdpp_cli.training.xe import XELoss, train_xe

from helpers import att2in_for, drawn_xe_dropout, error_line, rdpp, scoring_att2in, state_dict, write_tiny_data

os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")

BROKEN = {"compiles_left": 0}  # graphs the "rdpp_broken" backend compiles (with dynamo's eager) before it fails


@torch._dynamo.register_backend(name="rdpp_broken")
def _broken(gm, example_inputs):
    """A compiler that works ``compiles_left`` times, then fails as inductor did at COCO's vocabulary."""
    if BROKEN["compiles_left"] > 0:
        BROKEN["compiles_left"] -= 1
        return gm.forward
    raise TypeError("list indices must be integers or slices, not NoneType\n  (the rest of a long message)")


WHY = "TypeError: list indices must be integers or slices, not NoneType"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    BROKEN["compiles_left"] = 0
    yield
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_data(tmp_path_factory.mktemp("d") / "tiny", n_train=16, n_val=6, n_test=2)


@pytest.fixture
def auto_on_cpu(monkeypatch):
    """``--fast auto`` on for Att2in on the CPU (as it is on CUDA), so that auto compiles here."""
    monkeypatch.setitem(MODELS, "att2in", dataclasses.replace(MODELS["att2in"], fast_auto=("cpu", "cuda")))


def _metrics(path) -> pd.DataFrame:
    return pd.read_csv(path / "metrics.csv").drop(columns=["time", "images_per_s"])


def _same_run(a, b) -> None:
    """The same steps, the same numbers (float32 rounding) and the same weights to 5e-5, a fortieth
    of one Adam step at lr 2e-3 (Adam scales rounding noise in tiny gradients up; other masks or
    another step would move them by about lr; alpha_net.bias aside: the attention softmax ignores a
    shift, so its gradient is all rounding noise)."""
    pd.testing.assert_frame_equal(_metrics(b.path), _metrics(a.path), rtol=1e-5, atol=1e-7)
    wa, wb = state_dict(a.path / "checkpoints" / "last.pt"), state_dict(b.path / "checkpoints" / "last.pt")
    assert wa.keys() == wb.keys()
    for k in (k for k in wa if k != "alpha_net.bias"):
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=5e-5, msg=k)


XE = dict(preset="small", epochs=1, batch_size=6, val_images=4, lr=2e-3, device="cpu", seed=3)


@pytest.mark.integration
def test_a_failed_compile_under_auto_continues_eagerly_in_both_stages(tiny, tmp_path, monkeypatch, auto_on_cpu,
                                                                       capsys):
    """train-xe and finetune with --fast auto and a compiler that fails at its first graph: one note
    naming the error, the step redone uncompiled from the random state it began with (the same steps
    and numbers as the eager run with the fast step's dropout draws), the manifest says the fast path
    went off and why."""
    with monkeypatch.context() as m:
        drawn_xe_dropout(m)  # the eager XE step with the masks the fast XE step draws
        ok = train_xe(tiny, out=tmp_path / "xe-ok", fast="off", **XE)
    ft_ok = finetune(ok.path, data=tiny, out=tmp_path / "ft-ok", reward="dpp", m=3, epochs=1, batch_size=6,
                     val_images=4, device="cpu", seed=2, fast="off")
    capsys.readouterr()
    monkeypatch.setenv(F.BACKEND_ENV, "rdpp_broken")
    xe = train_xe(tiny, out=tmp_path / "xe", fast="auto", **XE)
    ft = finetune(ok.path, data=tiny, out=tmp_path / "ft", reward="dpp", m=3, epochs=1, batch_size=6,
                  val_images=4, device="cpu", seed=2, fast="auto")
    err = capsys.readouterr().err
    assert err.count(f"note: --fast auto: compiling the fast path failed ({WHY}); the run continues eagerly") == 2
    assert "Traceback" not in err
    for good, fell in ((ok, xe), (ft_ok, ft)):
        assert fell.manifest["config"]["fast_option"] == "auto"
        assert fell.manifest["config"]["fast"] == f"off (compile failed: {WHY})"
        _same_run(good, fell)


@pytest.fixture(scope="module")
def captioner(tiny, tmp_path_factory):
    from rdpp_cli.data.dataset import DataArtifact

    return scoring_att2in(DataArtifact.open(tiny), tmp_path_factory.mktemp("c") / "m")


@pytest.mark.integration
def test_a_compile_failing_first_in_validation_is_validated_again_eagerly(tiny, captioner, tmp_path, capsys):
    """The XE steps compile; validation's greedy pass is the first graph that fails: validation is
    taken again uncompiled, with the CIDEr-D a working compiler gives."""
    from rdpp_cli.data.dataset import DataArtifact

    data = DataArtifact.open(tiny)
    opts = TrainLoopOptions(epochs=1, batch_size=8, lr=1e-4, val_images=4, device="cpu", seed=0)
    runs = {}
    for backend, compiles in (("eager", 0), ("rdpp_broken", 1)):
        torch._dynamo.reset()
        BROKEN["compiles_left"] = compiles  # the teacher-forced pass compiles, validation's first graph fails
        model = att2in_for(data, 32, 0.3).train()
        model.load_state_dict(captioner)
        fast = F.FastPath(torch.device("cpu"), F.FastSettings(backend=backend, log_every=2), option="auto")
        runs[backend] = TrainingRecipe(stage="xe", model=model, data=data, out_dir=tmp_path / backend, opts=opts,
                                       step_fn=XELoss(steps=fast), inputs=[data.artifact],
                                       manifest_config={"fast": "on"}, steps=fast).run()
    err = capsys.readouterr().err
    assert err.count(f"compiling the fast path failed ({WHY})") == 1
    assert runs["rdpp_broken"].manifest["config"]["fast"] == f"off (compile failed: {WHY})"
    assert runs["eager"].manifest["config"]["fast"] == "on"
    assert _metrics(runs["eager"].path)["val_cider"].iloc[-1] > 0.05  # real captions scored
    _same_run(runs["eager"], runs["rdpp_broken"])


@pytest.mark.integration
def test_a_failed_compile_under_on_is_one_error_line_and_resumes_with_fast_off(tiny, tmp_path):
    """--fast on: one error: line (exit 2) naming the error and --fast off, no traceback; the same
    command with --fast off then finishes the run: the eager run's numbers and weights, bitwise."""
    ws, env = tmp_path / "ws", {F.BACKEND_ENV: "rdpp_broken"}
    args = ["train-xe", "--data", tiny, "--workspace", ws, "--preset", "small", "--epochs", "1", "--batch-size", "6",
            "--val-images", "4", "--device", "cpu", "--seed", "3", "--out", tmp_path / "run"]
    result = rdpp(*args, "--fast", "on", env=env)
    line = error_line(result)
    assert line == (f"error: --fast on: compiling the fast path failed ({WHY}); nothing of this step was applied: "
                    "rerun the same command with --fast off (it resumes from the last checkpoint)")
    assert "Traceback" not in result.output and not (tmp_path / "run" / "manifest.json").exists()
    assert rdpp(*args, "--fast", "off", env=env).exit_code == 0
    ref = rdpp(*args[:-1], tmp_path / "ref", "--fast", "off")
    assert ref.exit_code == 0
    pd.testing.assert_frame_equal(_metrics(tmp_path / "run"), _metrics(tmp_path / "ref"))
    a, b = state_dict(tmp_path / "run" / "checkpoints" / "last.pt"), state_dict(tmp_path / "ref" / "checkpoints" / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["fast"] == "off"
    listed = rdpp("ls", "--workspace", ws)
    assert listed.exit_code == 0, listed.output
