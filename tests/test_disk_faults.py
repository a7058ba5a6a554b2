"""A disk that fills, a workspace that is read-only: one `error:` line naming the file and what to do,
never a traceback (``RDPP_DEBUG=1`` shows it), and nothing on disk lost.

The faults are real: a small tmpfs that fills (ENOSPC) and a read-only bind mount (EROFS). Mounting
needs root (or a user namespace); where it is not allowed the tests skip and say so.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from rdpp_cli.artifacts import is_complete
from rdpp_cli.data.dataset import DataArtifact

from helpers import error_line, model_artifact, rdpp, write_tiny_data

pytestmark = pytest.mark.integration


def _mount(*args: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mounting is not allowed here ({(r.stderr or r.stdout).strip()[:100]})")


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A ``size`` tmpfs mounted at ``path`` for the block (skip where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` bind-mounted over itself read-only for the block."""
    _mount("--bind", str(path), str(path))
    try:
        r = subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"remounting read-only is not allowed here ({r.stderr.strip()[:100]})")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def one_failure_line(result, *fragments: str) -> str:
    """Exit 1 (a disk, not the input) and one `error:` line, the last printed, with ``fragments``."""
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert [ln for ln in lines if ln.startswith("error:")] == lines[-1:], result.output
    assert "Traceback" not in result.output
    for f in fragments:
        assert f in lines[-1], lines[-1]
    return lines[-1]


@pytest.fixture
def ws(tmp_path):
    data = write_tiny_data(tmp_path / "ws" / "data" / "tiny-v1", n_train=16, n_val=6, n_test=2)
    return tmp_path / "ws", data


def test_read_only_workspace_is_said_before_any_work(ws, tmp_path):
    root, data = ws
    from rdpp_cli.artifacts import read_artifact

    model_artifact(root, read_artifact(data))
    ids = [int(i) for i in DataArtifact(read_artifact(data)).image_ids[-2:]]  # the test split
    caps = tmp_path / "caps.json"
    caps.write_text(json.dumps([{"image_id": i, "captions": ["a red circle"]} for i in ids]))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    with read_only(root):
        for args in (["score", caps, "--data", data, "--metrics", "CIDEr"],
                     ["sample", "--n", "1", "--method", "greedy", "--device", "cpu"]):
            line = error_line(rdpp(*args, "--workspace", root))
            assert f"{root}" in line and "is read-only" in line and "pass --out DIR" in line, line
        # --out on a writable disk: the same command runs
        r = rdpp("score", caps, "--data", data, "--metrics", "CIDEr", "--workspace", root, "--out", tmp_path / "s")
        assert r.exit_code == 0, r.output
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    assert is_complete(tmp_path / "s")


def test_full_disk_while_training_is_one_line_naming_the_checkpoint(ws, tmp_path):
    root, data = ws
    args = ("train-xe", "--data", data, "--workspace", root, "--preset", "small", "--epochs", "1", "--batch-size", "8",
            "--device", "cpu")
    with tmpfs(tmp_path / "small", "64k") as small:
        r = rdpp(*args, "--out", small / "m")
        one_failure_line(r, f"no space left writing {small / 'm' / 'checkpoints'}", "MiB free there",
                         "rerun the same command")
        assert not is_complete(small / "m")  # unfinished, never looking complete
        r = rdpp(*args, "--out", small / "m2", env={"RDPP_DEBUG": "1"})  # a developer sees where it broke
        assert r.exit_code != 0 and isinstance(r.exception, OSError) and r.exception.errno == 28


def test_full_disk_while_making_data_is_one_line(tmp_path):
    with tmpfs(tmp_path / "small", "1m") as small:
        r = rdpp("prepro", "toy", "--images", "300", "--workspace", small)
        one_failure_line(r, "no space left writing", str(small / "data" / "toy-v1"))
        assert not is_complete(small / "data" / "toy-v1")
