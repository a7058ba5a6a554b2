"""Options declared once (rdpp_cli.options): the command, --config keys, the function's arguments and
the recorded settings all come from one dataclass."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rdpp_cli.cli.common import command_for
from rdpp_cli.errors import RdppError
from rdpp_cli.options import Options, argument, at_least, build, one_of, option, takes
from rdpp_cli.scoring.options import ScoreOptions


@dataclasses.dataclass
class Toy(Options):
    section = "toy_stage"

    parent: str | None = argument("The parent artifact.", from_alias=True)
    n: int = option(3, "Captions per image.", check=at_least(1))
    method: str = option("random", "greedy or random.", check=one_of("greedy", "random"))
    device: str = option("cpu", "Where to run.", identity=False)
    out: Path | None = option(None, "Folder to write.", identity=False, record=False)
    workspace: Path | None = option(None, "Workspace.", identity=False, record=False)

    def validate(self) -> None:
        if self.method == "greedy" and self.n != 1:
            raise RdppError(f"--method greedy decodes one caption per image; pass --n 1 (got {self.n})")


CALLS: list = []


@takes(Toy)
def toy_stage(opts: Toy, *, hook=None) -> Toy:
    CALLS.append((opts, hook))
    return opts


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("toy")(command_for(Toy, f"{__name__}:toy_stage", "A toy stage."))
    app.command("other")(lambda: None)  # two commands, so that Typer keeps the command's name
    return app


@pytest.mark.unit
def test_field_checks_and_cross_field_checks_raise_one_line():
    with pytest.raises(RdppError, match=r"^--n must be at least 1 \(got 0\)$"):
        Toy(n=0)
    with pytest.raises(RdppError, match="--method 'beam' is not one of: greedy, random"):
        Toy(method="beam")
    with pytest.raises(RdppError, match="--method greedy decodes one caption"):
        Toy(method="greedy", n=3)
    assert Toy(method="greedy", n=1).n == 1


@pytest.mark.unit
def test_identity_and_recorded_settings_come_from_the_declaration():
    t = Toy("p", n=5, device="cuda", out=Path("x"))
    assert t.identity() == {"n": 5, "method": "random"}  # arguments default to neither
    assert t.recorded() == {"n": 5, "method": "random", "device": "cuda"}


@pytest.mark.unit
def test_the_function_takes_fields_as_arguments_or_an_options_object():
    CALLS.clear()
    a = toy_stage("p", n=4, hook=1)
    b = toy_stage(Toy("p", n=4))
    c = toy_stage(Toy("p"), n=4)
    assert a == b == c == Toy(parent="p", n=4)
    assert [h for _, h in CALLS] == [1, None, None]
    with pytest.raises(RdppError, match="--n must be at least 1"):
        toy_stage(n=0)
    opts, extra = build(Toy, ("p",), {"method": "random", "hook": 2})
    assert opts.parent == "p" and extra == {"hook": 2}


@pytest.mark.integration
def test_the_command_has_one_option_per_field_and_calls_the_function(tmp_path):
    CALLS.clear()
    runner = CliRunner()
    r = runner.invoke(_app(), ["toy", "P", "--n", "2", "--device", "cuda"])
    assert r.exit_code == 0, r.output
    opts, hook = CALLS[-1]
    assert (opts, hook) == (Toy("P", n=2, device="cuda"), None)
    r = runner.invoke(_app(), ["toy", "--from", "Q"])
    assert r.exit_code == 0 and CALLS[-1][0].parent == "Q"
    r = runner.invoke(_app(), ["toy", "P", "--from", "Q"])
    assert r.exit_code == 2 and "PARENT P and --from Q name different" in r.output
    r = runner.invoke(_app(), ["toy", "--n", "0"])
    assert r.exit_code == 2 and "--n must be at least 1 (got 0)" in r.output
    help_ = runner.invoke(_app(), ["toy", "--help"], env={"COLUMNS": "200"}).output
    for flag in ("--n", "--method", "--device", "--out", "--workspace", "--from", "--config"):
        assert flag in help_


@pytest.mark.integration
def test_config_file_and_workspace_yaml_use_the_field_names(tmp_path):
    CALLS.clear()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "rdpp.yaml").write_text("toy_stage:\n  n: 7\n  device: cuda\n")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"n": 2}))
    runner = CliRunner()
    r = runner.invoke(_app(), ["toy", "--workspace", str(ws)])
    assert r.exit_code == 0, r.output
    assert (CALLS[-1][0].n, CALLS[-1][0].device) == (7, "cuda")
    r = runner.invoke(_app(), ["toy", "--workspace", str(ws), "--config", str(cfg), "--device", "cpu"])
    assert (CALLS[-1][0].n, CALLS[-1][0].device) == (2, "cpu")  # config over rdpp.yaml, flags over both
    cfg.write_text(json.dumps({"beams": 2}))
    r = runner.invoke(_app(), ["toy", "--config", str(cfg)])
    assert r.exit_code == 2 and "unknown option 'beams'" in r.output


@pytest.mark.unit
def test_every_command_built_from_options_shows_every_field_with_help():
    from rdpp_cli.cli.app import app

    built = []
    for name, cmd in typer.main.get_command(app).commands.items():
        cls = getattr(cmd.callback, "options", None)
        if cls is None:
            continue
        built.append(name)
        shown = {p.name for p in cmd.params}
        assert set(cls.field_names()) <= shown, name
        assert all(p.help for p in cmd.params if p.name in cls.field_names()), name
    assert "score" in built


@pytest.mark.unit
def test_score_options_refuse_bad_values_before_any_work():
    with pytest.raises(RdppError, match="--self-cider-variant 'svd' is not one of"):
        ScoreOptions(self_cider_variant="svd")
    with pytest.raises(RdppError, match="unknown metric"):
        ScoreOptions(metrics="CIDEr,BLEU")
    with pytest.raises(RdppError, match="--refs .* or --data, not both"):
        ScoreOptions(refs=Path("a.json"), data="toy-v1")
