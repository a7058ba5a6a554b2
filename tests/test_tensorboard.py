"""TensorBoard events beside metrics.csv: read back, they hold every step's logs and every metrics.csv
value; a resumed run shows each step once; without the package nothing is written and one note says so."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rdpp_cli.artifacts import read_artifact
from rdpp_cli.training.finetune import finetune
from rdpp_cli.training.loop import TrainingRecipe
from rdpp_cli.training.xe import train_xe

from helpers import Crash, rdpp

pytest.importorskip("tensorboard", reason="reads the events back with the tensorboard package (the test extra has it)")
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

XE = dict(preset="small", epochs=2, batch_size=6, val_images=3, device="cpu", seed=5)  # 16 images: 3 steps an epoch


@pytest.fixture(scope="module")
def ws(tiny_xe_workspace_copy) -> Path:
    """The tiny data artifact (16/6/2 images) and an XE model trained on it for one epoch (conftest.py)."""
    return tiny_xe_workspace_copy


@pytest.fixture
def step_logs(monkeypatch) -> list[tuple[int, dict[str, float]]]:
    """Every training step's (step, logs) as the recipe computed them, recorded beside the loggers."""
    seen: list[tuple[int, dict[str, float]]] = []
    train_step = TrainingRecipe.train_step

    def recorded(self, batch):
        logs = train_step(self, batch)
        seen.append((self.position.step, dict(logs)))
        return logs

    monkeypatch.setattr(TrainingRecipe, "train_step", recorded)
    return seen


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard run folder as TensorBoard's loader reads it: {tag: [(step, value)]}."""
    acc = event_accumulator.EventAccumulator(str(run), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def raw_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar event in a run's files, in file order, orphans of an interrupted run included."""
    out: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(run.glob("events.out.tfevents.*")):
        for ev in EventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                out.setdefault(v.tag, []).append((ev.step, v.tensor.float_val[0] if v.HasField("tensor")
                                                  else v.simple_value))
    return out


def preempted(raw: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """What TensorBoard's data server keeps of a run: per tag, a value at step s drops every earlier
    value at a step >= s."""
    out = {}
    for tag, values in raw.items():
        kept: list[tuple[int, float]] = []
        for step, value in values:
            kept = [(s, v) for s, v in kept if s < step] + [(step, value)]
        out[tag] = kept
    return out


def f32(x: float) -> float:
    return float(np.float32(x))


def assert_events_are_the_runs_numbers(art_path: Path, steps: list[tuple[int, dict[str, float]]]) -> None:
    """``tensorboard/step`` holds every step's logs (float32 of the very values), ``tensorboard/epoch``
    every metrics.csv column but step at the step that ended its epoch."""
    got = scalars(art_path / "tensorboard" / "step")
    assert set(got) == set(steps[0][1])
    for tag, values in got.items():
        assert values == [(s, f32(logs[tag])) for s, logs in steps], tag
    assert_epoch_run_is_metrics_csv(art_path)
    # closed before the manifest: hashed with the other files, and the artifact verifies
    art = read_artifact(art_path)
    assert any(name.startswith("tensorboard/step/events.out.tfevents.") for name in art.manifest["files"])
    assert any(name.startswith("tensorboard/epoch/events.out.tfevents.") for name in art.manifest["files"])
    assert art.problems() == []


def assert_epoch_run_is_metrics_csv(art_path: Path) -> None:
    m = pd.read_csv(art_path / "metrics.csv")
    epoch = scalars(art_path / "tensorboard" / "epoch")
    assert set(epoch) == set(m.columns) - {"step"}
    for tag, values in epoch.items():
        assert [s for s, _ in values] == m["step"].tolist(), tag
        assert [v for _, v in values] == pytest.approx(m[tag].tolist(), rel=1e-6, abs=1e-12), tag


def trained(run: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """A run's scalars but the clock's (time, images_per_s), which differ between two runs."""
    return {tag: values for tag, values in run.items() if tag not in ("time", "images_per_s")}


def test_train_xe_events_hold_every_step_and_metrics_csv(ws, tmp_path, step_logs):
    out = tmp_path / "xe"
    r = rdpp("train-xe", "--data", ws / "data" / "tiny-v1", "--out", out, "--preset", "small", "--epochs", 2,
             "--batch-size", 6, "--val-images", 3, "--device", "cpu", "--seed", 5)
    assert r.exit_code == 0, r.output
    assert [s for s, _ in step_logs] == [1, 2, 3, 4, 5, 6]
    assert_events_are_the_runs_numbers(out, step_logs)
    m = pd.read_csv(out / "metrics.csv")
    assert {"loss", "val_cider", "lr", "images_per_s"} <= set(m.columns)
    # the epoch's loss is its steps' mean weighted by their images (batches of 6, 6 and 4): the runs agree
    loss = [v for _, v in scalars(out / "tensorboard" / "step")["loss"]]
    w = [6, 6, 4]
    assert m["loss"].tolist() == pytest.approx([np.average(loss[:3], weights=w), np.average(loss[3:], weights=w)],
                                               rel=1e-6)
    # one note how to open them, and the closing table names the folder
    assert r.output.count(f"tensorboard --logdir {out / 'tensorboard'}") == 1
    table = dict(line.strip("│").split("│") for line in r.output.splitlines() if line.count("│") == 3)
    assert {k.strip(): v.strip() for k, v in table.items()}["tensorboard"] == str(out / "tensorboard")


def test_finetune_events_hold_the_rewards_and_the_val_diversity(ws, tmp_path, step_logs):
    art = finetune(ws / "xe" / "att2in-small-v1", out=tmp_path / "ft", workspace=ws, reward="dpp", m=2, epochs=2,
                   batch_size=8, lr=1e-3, val_images=2, device="cpu", seed=7)
    assert [s for s, _ in step_logs] == [1, 2, 3, 4]
    assert {"loss", "reward", "sample_cider", "self_cider"} <= set(step_logs[0][1])
    assert_events_are_the_runs_numbers(art.path, step_logs)
    epoch = scalars(art.path / "tensorboard" / "epoch")
    assert {"reward", "val_cider", "val_sample_cider", "val_self_cider", "lr", "images_per_s"} <= set(epoch)


def test_without_the_package_nothing_is_written_and_one_note_says_so(ws, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` fails as if not installed
    out = tmp_path / "xe"
    r = rdpp("train-xe", "--data", ws / "data" / "tiny-v1", "--out", out, "--preset", "small", "--epochs", 2,
             "--batch-size", 8, "--val-images", 2, "--device", "cpu", "--seed", 1)
    assert r.exit_code == 0, r.output
    assert r.output.count("no TensorBoard events: the tensorboard package is not installed (pip install "
                          "tensorboard)") == 1
    assert "--logdir" not in r.output
    assert not (out / "tensorboard").exists()
    art = read_artifact(out)
    assert not [name for name in art.manifest["files"] if "tensorboard" in name] and art.problems() == []
    assert len(pd.read_csv(out / "metrics.csv")) == 2


def test_a_resumed_run_shows_every_step_once_with_the_uninterrupted_runs_values(ws, tmp_path):
    data = ws / "data" / "tiny-v1"
    ref = train_xe(data, out=tmp_path / "ref", save_every_steps=2, **XE)

    def crash_at(k):
        def hook(step):
            if step == k:
                raise Crash(f"killed after step {k}")
        return hook

    run = tmp_path / "run"
    # resume state at step 4 (mid epoch 2); step 5 was logged, then the run died
    with pytest.raises(Crash):
        train_xe(data, out=run, save_every_steps=2, after_step=crash_at(5), **XE)
    assert [s for s, _ in raw_scalars(run / "tensorboard" / "step")["loss"]] == [1, 2, 3, 4, 5]
    resumed = train_xe(data, out=run, save_every_steps=2, **XE)
    raw = raw_scalars(run / "tensorboard" / "step")
    assert [s for s, _ in raw["loss"]] == [1, 2, 3, 4, 5, 5, 6]  # the orphaned step 5 is still on disk ...
    for name in ("step", "epoch"):  # ... and neither TensorBoard loader shows it
        want = trained(scalars(ref.path / "tensorboard" / name))
        assert trained(scalars(resumed.path / "tensorboard" / name)) == want, name
        assert trained(preempted(raw_scalars(resumed.path / "tensorboard" / name))) == want, name
    assert [s for s, _ in want["loss"]] == [3, 6] and {"val_cider", "lr", "epoch"} <= set(want)
    assert_epoch_run_is_metrics_csv(resumed.path)
    assert resumed.problems() == []

    # died right after an epoch's end (resume state at step 3): the epoch run is metrics.csv again
    with pytest.raises(Crash):
        train_xe(data, out=tmp_path / "run2", after_step=crash_at(4), **XE)
    again = train_xe(data, out=tmp_path / "run2", **XE)
    for name in ("step", "epoch"):
        assert trained(scalars(again.path / "tensorboard" / name)) == trained(scalars(ref.path / "tensorboard" / name))
    assert_epoch_run_is_metrics_csv(again.path)

    # --no-resume starts over: the interrupted run's event files are gone
    with pytest.raises(Crash):
        train_xe(data, out=tmp_path / "run3", after_step=crash_at(5), **XE)
    fresh = train_xe(data, out=tmp_path / "run3", resume=False, **XE)
    assert len(list((fresh.path / "tensorboard" / "step").iterdir())) == 1
    assert [s for s, _ in raw_scalars(fresh.path / "tensorboard" / "step")["loss"]] == [1, 2, 3, 4, 5, 6]


def test_a_resumed_runs_event_files_sort_after_the_interrupted_runs(tmp_path):
    """TensorBoard reads a run's event files in name order, whose first field is the second they were
    made in: a run resumed within the same second waits for the next one, so its files sort last."""
    import time

    from rdpp_cli.training.tensorboard import wait_past_event_files

    now = int(time.time())
    (tmp_path / "step").mkdir()
    (tmp_path / "step" / f"events.out.tfevents.{now}.host.99999.0").write_bytes(b"")
    wait_past_event_files(tmp_path)
    assert int(time.time()) > now


def test_steps_are_flushed_every_few_seconds_and_before_a_resume_state(tmp_path, monkeypatch):
    """Issue 34: no flush per step (a GPU run logs tens of steps a second); the writers flush every
    FLUSH_SECONDS on their own and always before a resume state is written, so the events up to it are
    on disk when a run is killed after it."""
    from rdpp_cli.training import tensorboard as tb

    if tb.summary_writer_class() is None:
        pytest.skip("tensorboard is not installed")
    logger = tb.TensorBoardLogger(tmp_path / "tb")
    logger.start([])
    flushes = []
    real = logger.steps.flush
    monkeypatch.setattr(logger.steps, "flush", lambda: flushes.append(1) or real())
    assert logger.steps.flush_secs == logger.epochs.flush_secs == tb.FLUSH_SECONDS == 30
    for step in range(1, 6):
        logger.log_step(step, {"loss": 1.0 / step})
    assert flushes == []
    logger.before_save(5)
    assert flushes == [1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb" / "step"))
    acc.Reload()
    assert [(e.step, round(e.value, 4)) for e in acc.Scalars("loss")] == [(s, round(1.0 / s, 4)) for s in range(1, 6)]
    logger.close()
