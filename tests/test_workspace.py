"""The workspace: versioned names, resume of unfinished runs, newest-artifact resolution, --config."""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rdpp_cli.artifacts import (
    finish,
    list_artifacts,
    prepare_output,
    read_artifact,
    resolve_input,
    write_manifest,
)
from rdpp_cli.cli.app import app
from rdpp_cli.cli.common import resolve_options, stage
from rdpp_cli.errors import RdppError


def _make(ws, group="data", name="toy", kind="rdpp.data", config=None, inputs=()):
    config = config or {"seed": 0}
    path = prepare_output(None, workspace=ws, group=group, name=name, kind=kind, config=config)
    (path / "x.txt").write_text(f"{name} {config}")
    art = write_manifest(path, kind, config, inputs=list(inputs), summary={"images": 3})
    finish(path)
    return art


@pytest.mark.unit
def test_versions_increase_and_never_overwrite(tmp_path):
    a = _make(tmp_path)
    b = _make(tmp_path)
    assert a.path == tmp_path / "data" / "toy-v1"
    assert b.path == tmp_path / "data" / "toy-v2"
    assert (a.path / "x.txt").read_text() == "toy {'seed': 0}"
    assert [x.name for x in list_artifacts(tmp_path)] == ["toy-v1", "toy-v2"]
    assert not (a.path / ".rdpp-partial.json").exists()


@pytest.mark.unit
def test_unfinished_run_with_same_config_is_resumed_other_config_gets_new_version(tmp_path):
    p1 = prepare_output(None, workspace=tmp_path, group="xe", name="att2in", kind="rdpp.model", config={"lr": 1})
    (p1 / "partial.bin").write_bytes(b"123")
    again = prepare_output(None, workspace=tmp_path, group="xe", name="att2in", kind="rdpp.model", config={"lr": 1})
    assert again == p1 and (again / "partial.bin").read_bytes() == b"123"
    other = prepare_output(None, workspace=tmp_path, group="xe", name="att2in", kind="rdpp.model", config={"lr": 2})
    assert other == tmp_path / "xe" / "att2in-v2"


@pytest.mark.unit
def test_explicit_out_refuses_existing_artifact_unless_force(tmp_path):
    a = _make(tmp_path)
    before = (a.path / "manifest.json").read_bytes()
    with pytest.raises(RdppError, match="already holds rdpp.data artifact.*--force"):
        prepare_output(a.path, workspace=tmp_path, group="data", name="toy", kind="rdpp.data", config={"seed": 1})
    assert (a.path / "manifest.json").read_bytes() == before
    p = prepare_output(a.path, workspace=tmp_path, group="data", name="toy", kind="rdpp.data", config={"seed": 1},
                       force=True)
    assert p == a.path and not (p / "manifest.json").exists()  # incomplete from now on
    assert not (p / "x.txt").exists()  # the old files go too: they must not be hashed into the new one


@pytest.mark.unit
def test_explicit_out_refuses_unrelated_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    with pytest.raises(RdppError, match="not an rdpp artifact"):
        prepare_output(out, workspace=tmp_path, group="data", name="toy", kind="rdpp.data", config={})
    assert (out / "thesis.tex").read_text() == "precious"


@pytest.mark.unit
def test_resolve_input_prefers_groups_in_order_and_names(tmp_path):
    data = _make(tmp_path)
    xe = _make(tmp_path, group="xe", name="att2in", kind="rdpp.model", inputs=[data])
    with pytest.raises(RdppError, match="no model in workspace .*make one with `rdpp train-xe`"):
        resolve_input(None, workspace=tmp_path / "empty", groups=("finetune", "xe"), kind="rdpp.model",
                      what="model", make_with="rdpp train-xe")
    got = resolve_input(None, workspace=tmp_path, groups=("finetune", "xe"), kind="rdpp.model", what="model",
                        make_with="rdpp train-xe")
    assert got.path == xe.path
    ft = _make(tmp_path, group="finetune", name="dpp-m5", kind="rdpp.model", inputs=[xe])
    got = resolve_input(None, workspace=tmp_path, groups=("finetune", "xe"), kind="rdpp.model", what="model",
                        make_with="rdpp train-xe")
    assert got.path == ft.path
    by_name = resolve_input("att2in-v1", workspace=tmp_path, groups=("finetune", "xe"), kind="rdpp.model",
                            what="model", make_with="x")
    assert by_name.path == xe.path
    assert ft.inputs[0]["manifest_sha256"] == xe.manifest_sha256
    with pytest.raises(RdppError, match="is a rdpp.data artifact; expected an artifact of kind rdpp.model"):
        resolve_input(str(data.path), workspace=tmp_path, groups=("xe",), kind="rdpp.model", what="model",
                      make_with="x")


@pytest.mark.unit
def test_incomplete_artifact_is_never_listed_or_read(tmp_path):
    p = prepare_output(None, workspace=tmp_path, group="data", name="toy", kind="rdpp.data", config={})
    (p / "captions.h5").write_bytes(b"half")
    assert list_artifacts(tmp_path) == []
    with pytest.raises(RdppError, match="no manifest.json"):
        read_artifact(p)


@pytest.mark.integration
def test_ls_shows_versions_settings_and_lineage(tmp_path):
    data = _make(tmp_path, config={"source": "toy", "images": 30})
    _make(tmp_path, group="xe", name="att2in", kind="rdpp.model", config={"stage": "xe", "preset": "small"},
          inputs=[data])
    result = CliRunner().invoke(app, ["ls", "--workspace", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "data/toy-v1" in out and "xe/att2in-v1" in out
    assert "preset=small" in out and "images=3" in out
    # lineage: the model came from data/toy-v1
    row = next(line for line in out.splitlines() if "xe/att2in-v1" in line)
    assert "data/toy-v1" in row


@pytest.mark.integration
def test_ls_on_empty_workspace_says_what_to_run(tmp_path):
    result = CliRunner().invoke(app, ["ls", "--workspace", str(tmp_path / "none")])
    assert result.exit_code == 0
    assert "rdpp prepro toy" in result.output


# --config: a tiny command built the way every stage is built.
_cmd = typer.Typer()
_seen: dict = {}


@_cmd.command()
@stage
def demo_cmd(ctx: typer.Context, epochs: int = typer.Option(3), lr: float = typer.Option(4e-4),
             out: Path = typer.Option(None), config: Path = typer.Option(None, "--config"),
             workspace: Path = typer.Option(None, "--workspace")) -> None:
    _seen.clear()
    _seen.update(resolve_options(ctx, "demo_cmd"))


@pytest.mark.integration
def test_config_file_sets_options_and_flags_override(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("epochs: 7\nlr: 0.01\nout: some/dir\n")
    r = CliRunner().invoke(_cmd, ["--config", str(cfg), "--lr", "0.5", "--workspace", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert _seen["epochs"] == 7 and _seen["lr"] == 0.5 and _seen["out"] == Path("some/dir")
    cfg_json = tmp_path / "c.json"
    cfg_json.write_text(json.dumps({"epochs": "9"}))
    r = CliRunner().invoke(_cmd, ["--config", str(cfg_json), "--workspace", str(tmp_path)])
    assert _seen["epochs"] == 9 and _seen["lr"] == 4e-4


@pytest.mark.integration
def test_workspace_rdpp_yaml_is_below_config_file(tmp_path):
    (tmp_path / "rdpp.yaml").write_text("demo_cmd:\n  epochs: 11\n  lr: 0.2\n")
    r = CliRunner().invoke(_cmd, ["--workspace", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert _seen["epochs"] == 11 and _seen["lr"] == 0.2
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"epochs": 5}))
    CliRunner().invoke(_cmd, ["--workspace", str(tmp_path), "--config", str(cfg)])
    assert _seen["epochs"] == 5 and _seen["lr"] == 0.2


@pytest.mark.integration
@pytest.mark.parametrize("content, match", [
    ("{not json", "could not be parsed"),
    ('{"epochz": 3}', "unknown option 'epochz'"),
    ('{"epochs": "many"}', "bad value for 'epochs'"),
    ("[1, 2]", "must hold a mapping"),
])
def test_bad_config_is_one_clear_line(tmp_path, content, match):
    cfg = tmp_path / "c.json"
    cfg.write_text(content)
    r = CliRunner().invoke(_cmd, ["--config", str(cfg), "--workspace", str(tmp_path)])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0] or \
        pytest.fail(r.output)


@pytest.mark.integration
def test_yaml_integer_with_a_leading_zero_is_refused(tmp_path):
    """``epochs: 010`` is 8 to YAML 1.1 (octal): refused as ambiguous, naming the line; quoted or
    without the zero it is read as written."""
    (tmp_path / "rdpp.yaml").write_text("demo_cmd:\n  lr: 0.2\n  epochs: 010\n")
    r = CliRunner().invoke(_cmd, ["--workspace", str(tmp_path)])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "rdpp.yaml, line 3: 010 has a leading zero, which YAML reads as an octal number; write 10" in lines[0]
    (tmp_path / "rdpp.yaml").write_text("demo_cmd:\n  epochs: 10\n  lr: 0\n")
    r = CliRunner().invoke(_cmd, ["--workspace", str(tmp_path)])
    assert r.exit_code == 0 and _seen["epochs"] == 10 and _seen["lr"] == 0, r.output


@pytest.mark.unit
def test_find_reusable_matches_settings_and_inputs(tmp_path):
    from rdpp_cli.artifacts import find_reusable

    d1 = _make(tmp_path, config={"images": 30, "seed": 0})
    d2 = _make(tmp_path, config={"images": 30, "seed": 1})
    m1 = _make(tmp_path, group="xe", name="att2in", kind="rdpp.model", config={"epochs": 2, "lr": 0.1}, inputs=[d1])
    assert find_reusable(tmp_path, "data", {"images": 30, "seed": 0}).path == d1.path
    assert find_reusable(tmp_path, "data", {"images": 31}) is None
    assert find_reusable(tmp_path, "xe", {"epochs": 2}, [d1]).path == m1.path
    assert find_reusable(tmp_path, "xe", {"epochs": 2}, [d2]) is None  # other lineage
    assert find_reusable(tmp_path, "xe", {"epochs": 3}, [d1]) is None


@pytest.mark.integration
def test_force_refuses_to_orphan_descendants_unless_told(tmp_path):
    """`--force` over an artifact others were made from would leave them refused as inputs: it is
    refused, listing them, unless --orphan-descendants says so."""
    ws = tmp_path / "ws"
    runner = CliRunner()
    env = {"COLUMNS": "300", "RDPP_NO_PROGRESS": "1"}
    r = runner.invoke(app, ["prepro", "toy", "--images", "20", "--workspace", str(ws)], env=env)
    assert r.exit_code == 0, r.output
    data = read_artifact(ws / "data" / "toy-v1")
    model = _make(ws, group="xe", name="att2in", kind="rdpp.model", inputs=[data])
    _make(ws, group="samples", name="att2in-v1.greedy", kind="rdpp.samples", inputs=[model])
    _make(ws, group="data", name="other", inputs=[])  # not made from toy-v1
    force = ["prepro", "toy", "--images", "20", "--seed", "1", "--out", str(data.path), "--force", "--workspace", str(ws)]
    r = runner.invoke(app, force, env=env)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "has 2 artifact(s) made from it (xe/att2in-v1, samples/att2in-v1.greedy-v1)" in lines[0]
    assert "pass --orphan-descendants with --force" in lines[0]
    assert read_artifact(data.path).manifest_sha256 == data.manifest_sha256  # untouched
    r = runner.invoke(app, force + ["--orphan-descendants"], env=env)
    assert r.exit_code == 0, r.output
    assert read_artifact(data.path).config["seed"] == 1


def _claimed(ws, group, name, kind="rdpp.samples", created=None):
    """A complete artifact claimed in ``ws`` (numbered by the workspace), its manifest's time ``created``."""
    path = prepare_output(None, workspace=ws, group=group, name=name, kind=kind, config={"n": name})
    (path / "x.txt").write_text(name)
    art = write_manifest(path, kind, {"n": name})
    finish(path)
    if created is not None:  # a clock set wrong when it was made
        m = json.loads((path / "manifest.json").read_text())
        (path / "manifest.json").write_text(json.dumps({**m, "created": created}))
    return read_artifact(path)


@pytest.mark.unit
def test_newest_is_the_workspace_order_not_the_clock(tmp_path):
    """An artifact made with the clock a day ahead is still older than one claimed after it."""
    ahead = _claimed(tmp_path, "samples", "greedy", created="2999-01-01T00:00:00+00:00")
    later = _claimed(tmp_path, "samples", "beam")
    assert (ahead.sequence, later.sequence) == (1, 2)
    assert [a.name for a in list_artifacts(tmp_path)] == ["greedy-v1", "beam-v1"]
    chosen = resolve_input(None, workspace=tmp_path, groups=("samples",), kind="rdpp.samples", what="samples",
                           make_with="x", quiet=True)
    assert chosen.path == later.path


@pytest.mark.unit
def test_skipped_newer_folders_are_named_in_the_info_line(tmp_path, capsys):
    old = _claimed(tmp_path, "samples", "greedy")
    bad = _claimed(tmp_path, "samples", "beam")
    (bad.path / "manifest.json").write_text((bad.path / "manifest.json").read_text()[:40])  # truncated
    chosen = resolve_input(None, workspace=tmp_path, groups=("samples",), kind="rdpp.samples", what="samples",
                           make_with="x")
    err = " ".join(capsys.readouterr().err.split())
    assert chosen.path == old.path
    assert "skipped samples/beam-v1 (" in err and "manifest" in err, err
    # an unfinished fine-tune, the only one: the XE model is used, and the line says why
    xe = _claimed(tmp_path, "xe", "att2in", kind="rdpp.model")
    prepare_output(None, workspace=tmp_path, group="finetune", name="dpp", kind="rdpp.model", config={"m": 5})
    chosen = resolve_input(None, workspace=tmp_path, groups=("finetune", "xe"), kind="rdpp.model", what="model",
                           make_with="x")
    err = " ".join(capsys.readouterr().err.split())
    assert chosen.path == xe.path and "skipped finetune/dpp-v1 (unfinished run)" in err, err
    # an unfinished run claimed before the chosen artifact is not news
    assert _claimed(tmp_path, "xe", "att2in", kind="rdpp.model").sequence == 5  # after the fine-tune's 4
    resolve_input(None, workspace=tmp_path, groups=("finetune", "xe"), kind="rdpp.model", what="model", make_with="x")
    assert "; skipped" not in capsys.readouterr().err


@pytest.mark.integration
def test_dangling_artifact_link_is_reported_by_verify_and_ls(tmp_path):
    _claimed(tmp_path, "samples", "greedy")
    gone = _claimed(tmp_path / "elsewhere", "samples", "beam")
    (tmp_path / "samples" / "beam-v1").symlink_to(gone.path)
    import shutil

    shutil.rmtree(gone.path)
    env = {"COLUMNS": "300", "RDPP_NO_PROGRESS": "1"}
    r = CliRunner().invoke(app, ["verify", "--workspace", str(tmp_path)], env=env)
    assert r.exit_code == 1, r.output
    assert "2 artifact(s) checked" in r.output and "1 with problems" in r.output, r.output
    assert "which does not exist" in r.output
    r = CliRunner().invoke(app, ["ls", "--workspace", str(tmp_path)], env=env)
    assert "samples/beam-v1 (a link to" in " ".join(r.output.split()), r.output
