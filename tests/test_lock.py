"""The run lock (docs/workspace.md#locks): a run holds its output folder for its whole length; a second
identical run is refused with one line naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rdpp_cli.artifacts import finish, prepare_output
from rdpp_cli.errors import RdppError
from rdpp_cli.training.xe import train_xe

from helpers import write_tiny_data


os.environ["RDPP_NO_PROGRESS"] = "1"
pytestmark = pytest.mark.usefixtures("one_thread")
RDPP = os.path.join(os.path.dirname(sys.executable), "rdpp")
LOCK = ".rdpp-lock"  # rdpp_cli.artifacts.lock.LOCK


@pytest.mark.integration
def test_a_second_identical_run_is_refused_while_the_first_runs(tmp_path):
    ws = tmp_path / "runs"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=2, n_test=2)
    args = ["--preset", "small", "--epochs", "2", "--batch-size", "8", "--val-images", "0", "--seed", "1"]
    second = {}

    def start_the_same_command(step: int) -> None:
        if step == 1:  # the first run is in its first epoch, folder claimed, a checkpoint due later
            env = {**os.environ, "RDPP_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}
            second["run"] = subprocess.run([RDPP, "train-xe", *args, "--device", "cpu", "--workspace", str(ws)],
                                           capture_output=True, text=True, env=env, timeout=300)
            second["folders"] = sorted(p.name for p in (ws / "xe").iterdir())

    art = train_xe("tiny-v1", workspace=ws, preset="small", epochs=2, batch_size=8, val_images=0, seed=1,
                   device="cpu", after_step=start_the_same_command)
    r = second["run"]
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert f"{ws / 'xe' / 'att2in-small-v1'} is being written by another run (pid {os.getpid()} on host " \
           f"{socket.gethostname()}" in errors[0]
    assert second["folders"] == ["att2in-small-v1"]  # the second run made no folder of its own
    # the first run was not disturbed, and its lock is gone with it
    assert art.path == ws / "xe" / "att2in-small-v1" and (art.path / "manifest.json").is_file()
    assert not (art.path / LOCK).exists()
    art.verify()


def _claim(ws: Path, out: Path | None = None) -> Path:
    return prepare_output(out, workspace=ws, group="xe", name="att2in", kind="rdpp.model", config={"lr": 1})


@pytest.mark.integration
def test_the_lock_of_a_dead_run_on_this_host_is_taken_over(tmp_path, capsys):
    ws = tmp_path / "runs"
    # a run that claims its folder and is killed (SIGKILL: no clean-up of any kind)
    code = ("import os, signal; from rdpp_cli.artifacts import prepare_output; "
            f"prepare_output(None, workspace={str(ws)!r}, group='xe', name='att2in', kind='rdpp.model', "
            "config={'lr': 1}); os.kill(os.getpid(), signal.SIGKILL)")
    dead = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    assert dead.wait(timeout=120) == -9, dead.stderr.read()
    folder = ws / "xe" / "att2in-v1"
    left = json.loads((folder / LOCK).read_text())
    assert left["pid"] == dead.pid and left["host"] == socket.gethostname()
    # the same command again: resumes the folder, taking the dead run's lock over
    assert _claim(ws) == folder
    assert f"the run that held it (pid {left['pid']} on host {socket.gethostname()}" in capsys.readouterr().err
    assert json.loads((folder / LOCK).read_text())["pid"] == os.getpid()
    finish(folder)
    assert not (folder / LOCK).exists()


@pytest.mark.unit
def test_a_lock_from_another_host_is_not_taken_over(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    rec = {"pid": 4242, "host": "gpu-node-7", "started": "2026-11-26T10:00:00Z", "command": "rdpp train-xe"}
    (folder / LOCK).write_text(json.dumps(rec))
    with pytest.raises(RdppError, match=r"locked by a run on another machine \(pid 4242 on host gpu-node-7 since "
                                        r"2026-11-26 10:00:00 \(rdpp train-xe\)\); if that run is no longer running, "
                                        r"delete .*\.rdpp-lock and rerun"):
        _claim(tmp_path, out=folder)
    assert json.loads((folder / LOCK).read_text()) == rec  # left as it was


@pytest.mark.unit
def test_a_finished_or_failed_stage_leaves_no_lock(tmp_path):
    path = _claim(tmp_path)
    assert (path / LOCK).is_file()
    finish(path)
    assert not (path / LOCK).exists()
    # an --out folder that is refused keeps no lock file either
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(RdppError, match="not an rdpp artifact"):
        _claim(tmp_path, out=tmp_path / "mine")
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["thesis.tex"]
