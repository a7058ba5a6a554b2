"""A disk that fills, a workspace that is read-only: one `error:` line naming the file and what to do,
never a traceback (``RDPP_DEBUG=1`` shows it), and nothing on disk lost.

The faults are real: a small tmpfs that fills (ENOSPC) and a read-only bind mount (EROFS). Mounting
needs root (or a user namespace); where it is not allowed the tests skip and say so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from rdpp_cli.artifacts import content_hash, is_complete, read_artifact
from rdpp_cli.artifacts.manifest import MANIFEST
from rdpp_cli.artifacts.verified import VERIFIED
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.data.features import FeatureWriter

from helpers import error_line, failure_line, model_artifact, rdpp, write_tiny_data

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


@pytest.fixture
def ws(tmp_path):
    data = write_tiny_data(tmp_path / "ws" / "data" / "tiny-v1", n_train=16, n_val=6, n_test=2)
    return tmp_path / "ws", data


def test_read_only_workspace_is_said_before_any_work(ws, tmp_path):
    root, data = ws

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
        failure_line(r, f"no space left writing {small / 'm' / 'checkpoints'}", "MiB free there",
                         "rerun the same command")
        assert not is_complete(small / "m")  # unfinished, never looking complete
        r = rdpp(*args, "--out", small / "m2", env={"RDPP_DEBUG": "1"})  # a developer sees where it broke
        assert r.exit_code != 0 and isinstance(r.exception, OSError) and r.exception.errno == 28


def test_full_disk_while_making_data_is_one_line(tmp_path):
    with tmpfs(tmp_path / "small", "1m") as small:
        r = rdpp("prepro", "toy", "--images", "300", "--workspace", small)
        failure_line(r, "no space left writing", str(small / "data" / "toy-v1"))
        assert not is_complete(small / "data" / "toy-v1")


# ---- a data artifact is complete only when its files on disk are ------------------------------------

TOY = ("prepro", "toy", "--images", "300", "--batch-size", "10")


def rdpp_process(*args):
    """``rdpp ARGS`` in a child process (HDF5 on a full disk must not take the test run down with it),
    as ``rdpp``'s result: ``exit_code`` and ``output``."""
    env = {**os.environ, "COLUMNS": "300", "RDPP_NO_PROGRESS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "rdpp_cli", *map(str, args)], capture_output=True, text=True, env=env)
    return SimpleNamespace(exit_code=r.returncode, output=r.stdout + r.stderr)


def features_of(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {k: f[k][:] for k in f if not k.startswith("_")}


def assert_as_clean_run(ws: Path, clean: Path) -> None:
    """The resumed artifact's features equal the clean run's array for array, byte for byte; the
    manifest's hash of features.h5 is the hash of the file on disk (and the clean run's); both
    `rdpp verify --quick` and `rdpp verify` find nothing wrong."""
    art = ws / "data" / "toy-v1"
    got, want = features_of(art / "features.h5"), features_of(clean / "features.h5")
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes(), k
    entry = read_artifact(art, "rdpp.data").manifest["files"]["features.h5"]
    assert entry["sha256"] == content_hash.recompute(art / "features.h5", entry["hash_of"])
    assert entry["sha256"] == read_artifact(clean, "rdpp.data").manifest["files"]["features.h5"]["sha256"]
    for quick in (["--quick"], []):
        r = rdpp("verify", *quick, "--workspace", ws)
        assert r.exit_code == 0 and "1 artifact(s) checked" in r.output and "0 with problems" in r.output, r.output


def pages(paths) -> int:
    """Bytes a tmpfs charges for ``paths``: whole 4 KiB pages."""
    return sum(-(-p.stat().st_size // 4096) * 4096 for p in paths if p.is_file())


@pytest.fixture(scope="module")
def clean_toy(tmp_path_factory):
    ws = tmp_path_factory.mktemp("clean")
    r = rdpp(*TOY, "--workspace", ws)
    assert r.exit_code == 0, r.output
    return ws


@pytest.mark.parametrize("fills_at", ["features.h5", "captions.h5"])
def test_full_disk_while_making_data_then_rerun_equals_a_clean_run(clean_toy, tmp_path, fills_at):
    """A tmpfs with room for everything written before ``fills_at`` and half of it: one line naming
    the file, the free space and the space needed; an unfinished folder; the disk grown, the same
    command resumes and ends with the clean run's features, checked from the disk."""
    clean = clean_toy / "data" / "toy-v1"
    order = ["captions.h5", "cider_df.h5", "features.h5", MANIFEST, VERIFIED]  # as prepro writes them
    before = [p for p in clean_toy.rglob("*") if p.name not in order[order.index(fills_at):]]
    size = pages(before) + pages([clean / fills_at]) // 2 + 4 * 4096  # + the partial marker and the lock
    with tmpfs(tmp_path / "small", f"{size // 1024}k") as small:
        r = rdpp_process(*TOY, "--workspace", small)
        line = failure_line(r, f"no space left writing {small / 'data' / 'toy-v1' / fills_at}", "MiB free there")
        assert "\n" not in line and ("MiB more needed" in line) == (fills_at == "features.h5")
        assert not is_complete(small / "data" / "toy-v1")  # unfinished, never looking complete
        _mount("-o", f"remount,size={4 * size // 1024}k", str(small))
        r = rdpp(*TOY, "--workspace", small)
        assert r.exit_code == 0 and "resuming unfinished" in r.output, r.output
        assert_as_clean_run(small, clean)


def test_full_disk_while_laying_out_features_h5_is_one_line_and_the_rerun_resumes(clean_toy, tmp_path):
    """Room for everything written before features.h5 and 8 KiB of it: HDF5's first flush of the empty
    layout fails (h5py raises that as a RuntimeError, not an OSError): still one line naming the file,
    never a traceback; the disk grown, the same command ends with the clean run's features."""
    clean = clean_toy / "data" / "toy-v1"
    order = ["features.h5", MANIFEST, VERIFIED]
    before = [p for p in clean_toy.rglob("*") if p.name not in order]
    size = pages(before) + 4 * 4096 + 2 * 4096  # + the partial marker and the lock, then two pages
    with tmpfs(tmp_path / "small", f"{size // 1024}k") as small:
        r = rdpp_process(*TOY, "--workspace", small)
        line = failure_line(r, f"no space left writing {small / 'data' / 'toy-v1' / 'features.h5'}", "MiB free there")
        assert "Traceback" not in r.output and "RuntimeError" not in r.output, r.output
        assert not is_complete(small / "data" / "toy-v1")
        _mount("-o", f"remount,size={4 * size // 1024}k", str(small))
        r = rdpp(*TOY, "--workspace", small)
        assert r.exit_code == 0 and "resuming unfinished" in r.output, r.output
        assert_as_clean_run(small, clean)


def lose_rows(monkeypatch, block: int, rows: int, *, flush_fails: bool) -> None:
    """HDF5 on a full disk: the writes of ``fc`` and ``att`` rows ``block:block+rows`` never reach the
    file and raise nothing (HDF5 printed and ignored its error); with ``flush_fails`` the next flush
    of the file raises ENOSPC."""
    real_set, real_flush = h5py.Dataset.__setitem__, h5py.File.flush
    lost = []

    def setitem(ds, key, value):
        if ds.name in ("/fc", "/att") and isinstance(key, slice) and key.start == block and len(lost) < 2:
            lost.append(ds.name)
            return None
        return real_set(ds, key, value)

    def flush(f):
        if flush_fails and len(lost) == 2:
            lost.append("flush")
            raise OSError(errno.ENOSPC, "Can't write data (file write failed)\n, errno = 28, ...")
        return real_flush(f)

    monkeypatch.setattr(h5py.Dataset, "__setitem__", setitem)
    monkeypatch.setattr(h5py.File, "flush", flush)


@pytest.mark.parametrize("flush_fails", [True, False], ids=["flush-raises-ENOSPC", "write-lost-silently"])
def test_rows_that_never_reached_the_disk_are_found_and_written_again(clean_toy, tmp_path, monkeypatch,
                                                                       flush_fails):
    ws = tmp_path / "ws"
    with monkeypatch.context() as m:
        lose_rows(m, 40, 10, flush_fails=flush_fails)
        r = rdpp(*TOY, "--workspace", ws)
    folder = ws / "data" / "toy-v1"
    fragments = ([f"no space left writing {folder / 'features.h5'}", "MiB more needed"] if flush_fails else
                 [f"{folder / 'features.h5'}: rows 40 to 49 of fc are not on the disk after writing them"])
    line = failure_line(r, *fragments)
    assert "\n" not in line and "Traceback" not in r.output
    assert not is_complete(folder)
    r = rdpp(*TOY, "--workspace", ws)
    assert r.exit_code == 0 and "resuming feature extraction at image 40 of 300" in r.output, r.output
    assert_as_clean_run(ws, clean_toy / "data" / "toy-v1")


def test_a_block_changed_between_runs_is_extracted_again(clean_toy, tmp_path, monkeypatch):
    """Rows an earlier run wrote are read back before the file is finished: a block zeroed after an
    interrupted run (as a write HDF5 lost leaves it) is extracted again, not taken as done."""
    ws = tmp_path / "ws"
    real = FeatureWriter.write
    calls = []

    def write(self, *a, **kw):
        if len(calls) == 8:
            raise KeyboardInterrupt
        calls.append(1)
        return real(self, *a, **kw)

    with monkeypatch.context() as m:
        m.setattr(FeatureWriter, "write", write)
        assert rdpp(*TOY, "--workspace", ws).exit_code == 130
    path = ws / "data" / "toy-v1" / "features.h5"
    with h5py.File(path, "r+") as f:
        assert int(f.attrs["_done"]) == 80
        f["att"][30:40] = 0  # a block recorded as written, zeroed on the disk
    r = rdpp(*TOY, "--workspace", ws)
    assert r.exit_code == 0, r.output
    assert "rows 30 to 39 are not on the disk as written" in r.output and "extracting again from image 30" in r.output
    assert "resuming feature extraction at image 30 of 300" in r.output
    assert_as_clean_run(ws, clean_toy / "data" / "toy-v1")


def _fill(folder: Path) -> Path:
    """Write ``folder/filler`` until its disk refuses even one more byte; the file."""
    path = folder / "filler"
    with open(path, "wb", buffering=0) as f:
        for chunk in (4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    return path


def test_full_disk_under_tensorboard_names_its_folder_and_no_thread_prints_a_traceback(tmp_path, capfd):
    """TensorBoard's writers fail on a full disk when they open (in the run's thread) and later in
    their own writer thread, which hands the error to the run's thread at the next event or flush:
    each an OSError naming the events folder (the stage says it in one line), and the writer thread
    prints no traceback of its own."""
    pytest.importorskip("tensorboard")
    from rdpp_cli.training.tensorboard import TensorBoardLogger

    with tmpfs(tmp_path / "small", "256k") as small:
        filler = _fill(small)
        with pytest.raises(OSError) as opened:
            TensorBoardLogger(small / "tb").start([])
        assert opened.value.errno == errno.ENOSPC and opened.value.filename == str(small / "tb" / "step")
        filler.unlink()
        logger = TensorBoardLogger(small / "tb2")
        logger.start([])
        _fill(small)
        with pytest.raises(OSError) as written:
            for step in range(1, 10_000):
                logger.log_step(step, {"loss": 1.0, "reward": 0.5})
                logger.before_save(step)
        assert written.value.errno == errno.ENOSPC
        assert written.value.filename in {str(small / "tb2" / "step"), str(small / "tb2" / "epoch")}
        with contextlib.suppress(OSError):
            logger.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err


def test_a_checkpoint_larger_than_the_free_space_is_a_full_disk_however_much_is_free_after(tmp_path):
    """torch.save says no more than "unexpected pos" when the disk fills; rdpp calls it a full disk by
    the free space, measured before the temp file is removed (after, 3 MiB are free again, which read
    as "check the disk"). The temp file is gone and nothing else is written."""
    import torch

    from rdpp_cli.errors import file_failure
    from rdpp_cli.training.state import atomic_torch_save

    with tmpfs(tmp_path / "small", "3m") as small:
        with pytest.raises(OSError) as e:
            atomic_torch_save({"w": torch.zeros(2_000_000)}, small / "big.pt")  # 8 MB
        assert e.value.errno == errno.ENOSPC and e.value.filename == str(small / "big.pt")
        assert list(small.iterdir()) == []
        assert str(file_failure(e.value)).startswith(f"no space left writing {small / 'big.pt'} (")
