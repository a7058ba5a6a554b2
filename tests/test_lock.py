"""The run lock (docs/workspace.md#locks): a run holds its output folder for its whole length; a second
identical run is refused with one line naming the holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rdpp_cli.artifacts import finish, prepare_output, read_artifact
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


# -- one run per identity, even in the same instant; SIGTERM (docs/workspace.md) ---------------------

# A real `rdpp` command line in a process whose claim of the output folder waits at a barrier until
# the other process gets there too, and whose look at the existing versions takes 0.5 s: the window
# between looking and creating a version is microseconds in real use, where two commands started
# together fall into it only by chance; widened, they fall into it every time.
TOGETHER = """
import os, sys, time
from pathlib import Path
import rdpp_cli.artifacts.workspace as W

barrier, args = Path(sys.argv[1]), sys.argv[2:]
versions, identity = W._versions, W._identity  # prepare_output's first call is _identity

def slow_versions(*a):
    found = versions(*a)
    time.sleep(0.5)
    return found

def together(config):
    if not barrier.joinpath(str(os.getpid())).exists():
        (barrier / str(os.getpid())).touch()
        t = time.time()
        while len(list(barrier.iterdir())) < 2 and time.time() - t < 240:
            time.sleep(0.01)
    return identity(config)

W._versions, W._identity = slow_versions, together
sys.argv = ["rdpp", *args]
from rdpp_cli.cli.app import main
main()
"""


def _env() -> dict:
    return {**os.environ, "RDPP_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1", "COLUMNS": "300"}


@pytest.mark.integration
def test_two_identical_commands_started_together_one_runs_the_other_is_refused(tmp_path):
    ws = tmp_path / "runs"
    write_tiny_data(ws / "data" / "tiny-v1", n_train=16, n_val=2, n_test=2)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    (tmp_path / "together.py").write_text(TOGETHER)
    cmd = [sys.executable, str(tmp_path / "together.py"), str(barrier), "train-xe", "--preset", "small",
           "--epochs", "1", "--batch-size", "8", "--val-images", "0", "--seed", "1", "--device", "cpu",
           "--workspace", str(ws)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for _ in range(2)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert sorted(rc for rc, _, _ in results) == [0, 2], results
    rc, _, err = next(r for r in results if r[0] == 2)
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and f"{ws / 'xe' / 'att2in-small-v1'} is being written by another run (pid " in errors[0]
    # one folder, finished by the run that went on; nothing left of the claim or the lock
    assert sorted(p.name for p in (ws / "xe").iterdir()) == ["att2in-small-v1"]
    read_artifact(ws / "xe" / "att2in-small-v1", "rdpp.model").verify()
    assert not (ws / "xe" / "att2in-small-v1" / LOCK).exists()


def _weights(path: Path) -> dict:
    return torch.load(path, weights_only=True)["state_dict"]


@pytest.mark.integration
def test_sigterm_stops_with_one_line_releases_the_lock_and_the_rerun_resumes_to_the_same_weights(tmp_path):
    data = write_tiny_data(tmp_path / "data" / "tiny-v1", n_train=16, n_val=2, n_test=2)
    args = ["--preset", "small", "--epochs", "3", "--batch-size", "4", "--val-images", "0", "--seed", "3",
            "--save-every-steps", "1", "--device", "cpu"]
    ws = tmp_path / "runs"
    cmd = [RDPP, "train-xe", "--data", str(data), *args, "--workspace", str(ws)]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    folder = ws / "xe" / "att2in-small-v1"
    state = folder / "checkpoints" / "last_state.pt"
    while not state.exists() and run.poll() is None:  # its first saved step (12 steps in all)
        time.sleep(0.005)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 143, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert re.fullmatch(r"interrupted at epoch (\d+), step (\d+); rerun the same command to resume", lines[-1]), err
    assert not any(ln.startswith(("error:", "Traceback")) for ln in lines), err
    assert not (folder / LOCK).exists() and not (folder / "manifest.json").exists()
    assert (folder / ".rdpp-partial.json").exists()
    # the same command again resumes the folder and ends where an uninterrupted run ends
    again = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"resuming {folder} at epoch" in again.stderr and sorted(p.name for p in (ws / "xe").iterdir()) == [
        "att2in-small-v1"]
    ref = train_xe(data, out=tmp_path / "ref", preset="small", epochs=3, batch_size=4, val_images=0, seed=3,
                   save_every_steps=1, device="cpu")
    for name in ("last.pt", "best.pt"):
        a, b = _weights(ref.path / "checkpoints" / name), _weights(folder / "checkpoints" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
