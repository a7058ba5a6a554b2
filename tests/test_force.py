"""`--force` replaces only what an artifact owns: the files its manifest lists (an unfinished run:
its stage's outputs); a folder that also holds other files (a user's notes, drafts) is refused, in
one line naming them, and nothing is deleted."""

import json

import pytest
from helpers import error_line, rdpp

from rdpp_cli.artifacts import finish, prepare_output, write_manifest
from rdpp_cli.errors import RdppError

pytestmark = pytest.mark.usefixtures("one_thread")


def _samples(out, config):
    """A complete samples artifact at ``out`` (its samples.json and a listed file in a sub-folder)."""
    path = prepare_output(out, workspace=out.parent, group="samples", name="s", kind="rdpp.samples", config=config)
    (path / "samples.json").write_text("[]")
    (path / "extra").mkdir()
    (path / "extra" / "listed.txt").write_text("rdpp's")
    write_manifest(path, "rdpp.samples", config)
    finish(path)
    return path


def _force(out, config):
    return prepare_output(out, workspace=out.parent, group="samples", name="s", kind="rdpp.samples", config=config,
                          force=True)


@pytest.mark.unit
def test_force_over_an_artifact_keeps_the_users_files_by_refusing(tmp_path):
    out = _samples(tmp_path / "out", {"n": 1})
    (out / "notes.txt").write_text("mine")
    (out / "drafts").mkdir()
    (out / "drafts" / "a.txt").write_text("mine too")
    (out / "extra" / "mine.txt").write_text("mine, beside a listed file")
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(RdppError, match=r"holds files that are not its rdpp.samples artifact's \(drafts/, extra/mine.txt, "
                                        r"notes.txt\); move them out of the folder or choose another --out"):
        _force(out, {"n": 2})
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before  # nothing deleted
    assert json.loads((out / "manifest.json").read_text())["config"] == {"n": 1}  # still the complete artifact
    for p in (out / "notes.txt", out / "drafts" / "a.txt", out / "extra" / "mine.txt"):
        p.unlink()
    (out / "drafts").rmdir()
    assert _force(out, {"n": 2}) == out  # only its own files: replaced as before
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == []


@pytest.mark.unit
def test_force_over_an_unfinished_run_keeps_files_its_stage_does_not_write(tmp_path):
    out = tmp_path / "out"
    path = prepare_output(out, workspace=tmp_path, group="samples", name="s", kind="rdpp.samples", config={"n": 1})
    (path / "samples.json").write_text("[")  # what the interrupted run left
    from rdpp_cli.artifacts import lock

    lock.release(path)
    (path / "notes.txt").write_text("mine")
    with pytest.raises(RdppError, match=r"holds files that are not its rdpp.samples artifact's \(notes.txt\)"):
        _force(out, {"n": 2})
    assert (path / "notes.txt").read_text() == "mine" and (path / "samples.json").read_text() == "["
    (path / "notes.txt").unlink()
    assert _force(out, {"n": 2}) == out and not (out / "samples.json").exists()


@pytest.mark.integration
def test_force_on_the_command_line_is_one_line_and_deletes_nothing(tmp_path):
    out = tmp_path / "toy"
    toy = ["prepro", "toy", "--images", "10", "--out", out, "--workspace", tmp_path / "ws"]
    assert rdpp(*toy).exit_code == 0
    manifest = (out / "manifest.json").read_bytes()
    (out / "notes.txt").write_text("mine")
    line = error_line(rdpp(*toy, "--seed", "1", "--force"))
    assert "holds files that are not its rdpp.data artifact's (notes.txt)" in line
    assert (out / "notes.txt").read_text() == "mine" and (out / "manifest.json").read_bytes() == manifest
