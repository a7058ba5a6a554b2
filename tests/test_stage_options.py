"""The stages built from their options classes here: `rdpp sample`, `rdpp caption`, `rdpp plot`,
`rdpp ls`, `rdpp prepro coco|toy`, `rdpp verify`. Every field is an option with help; ``--config`` and ``<workspace>/rdpp.yaml`` keys are the
field names; a bad value is one line before any folder is made; the decoding options are declared
once and are the decoder's config."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rdpp_cli.artifacts.options import LsOptions, VerifyOptions
from rdpp_cli.captioning.options import CaptionOptions
from rdpp_cli.cli.app import app
from rdpp_cli.data.options import PreproCocoOptions, PreproToyOptions
from rdpp_cli.decoding.config import DecodeConfig, DecodingOptions
from rdpp_cli.decoding.options import SampleOptions
from rdpp_cli.errors import RdppError
from rdpp_cli.scoring.options import PlotOptions

# command -> (options class, "module:function" it runs)
STAGES = {
    "sample": (SampleOptions, "rdpp_cli.decoding.sample:sample"),
    "caption": (CaptionOptions, "rdpp_cli.captioning.caption:caption"),
    "plot": (PlotOptions, "rdpp_cli.scoring.plot:plot"),
    "ls": (LsOptions, "rdpp_cli.artifacts.listing:show"),
    "prepro coco": (PreproCocoOptions, "rdpp_cli.data.prepro:prepro_coco"),
    "prepro toy": (PreproToyOptions, "rdpp_cli.data.toy:prepro_toy"),
    "verify": (VerifyOptions, "rdpp_cli.artifacts.verify:verify"),
}


def _command(name: str):
    """The Click command of ``name`` ("sample", or "prepro coco" inside the prepro group)."""
    cmd = typer.main.get_command(app)
    for word in name.split():
        cmd = cmd.commands[word]
    return cmd


def _run(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200", "RDPP_NO_PROGRESS": "1"})


def _error_lines(result) -> list[str]:
    return [ln for ln in result.output.splitlines() if ln.strip()]


@pytest.fixture
def received(monkeypatch):
    """Each stage function replaced by one that records the options object the command built."""
    import importlib

    got: dict[str, object] = {}
    for name, (_, target) in STAGES.items():
        module, fn = target.split(":")
        # returns no verdicts: `rdpp verify` reads the result to choose its exit code
        monkeypatch.setattr(importlib.import_module(module), fn, lambda opts, _n=name: got.__setitem__(_n, opts) or [])
    return got


@pytest.mark.unit
def test_each_stage_command_shows_every_field_with_help():
    for name, (cls, _) in STAGES.items():
        cmd = _command(name)
        assert cmd.callback.options is cls, name
        shown = {p.name: p for p in cmd.params}
        assert set(cls.field_names()) <= set(shown), name
        assert all(shown[f].help for f in cls.field_names()), name
        assert "config" in shown and "workspace" in shown, name


@pytest.mark.integration
def test_config_file_and_workspace_yaml_keys_are_the_field_names(tmp_path, received):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "rdpp.yaml").write_text("sample:\n  method: beam\n  n: 3\ncaption:\n  top_k: 7\nplot:\n  labels: a,b\n")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"n": 4, "candidates": 9, "select": "mbr", "diversity_lambda": 0.25}))
    assert _run("sample", "--workspace", ws, "--config", cfg, "--seed", "5").exit_code == 0
    s = received["sample"]
    # rdpp.yaml < --config < flags
    assert (s.method, s.n, s.candidates, s.select, s.diversity_lambda, s.seed) == ("beam", 4, 9, "mbr", 0.25, 5)
    cfg.write_text(json.dumps({"model": "dpp-m5-v1", "n": 2, "allow_unk": True, "max_len": 9}))
    assert _run("caption", "photo.jpg", "--workspace", ws, "--config", cfg).exit_code == 0
    c = received["caption"]
    assert (c.paths, c.model, c.n, c.allow_unk, c.max_len, c.top_k, c.method) == \
        ([Path("photo.jpg")], "dpp-m5-v1", 2, True, 9, 7, "beam")
    assert _run("plot", "x", "y", "--workspace", ws).exit_code == 0
    assert received["plot"].label_list() == ["a", "b"]
    cfg.write_text(json.dumps({"workspace": str(ws)}))
    assert _run("ls", "--config", cfg).exit_code == 0
    assert received["ls"].workspace == ws
    cfg.write_text(json.dumps({"beams": 3}))
    r = _run("sample", "--config", cfg, "--workspace", ws)
    assert r.exit_code == 2 and "unknown option 'beams'" in r.output


@pytest.mark.integration
@pytest.mark.parametrize("args, message", [
    (["sample", "--n", "0"], "--n must be at least 1 (got 0)"),
    (["sample", "--method", "beam", "--beam", "2", "--n", "3"], "--n 3 is more than the 2 beams of --method beam"),
    (["sample", "--method", "sampling"], "unknown decoding method 'sampling'"),
    (["sample", "--temperature", "nan"], "--temperature must be a finite number"),
    (["sample", "--temperature", "1e-39"], "--temperature 1e-39 is below 1e-37, where the log-probs divided"),
    (["caption", "a.jpg", "--method", "topk", "--temperature", "1e-38"], "--temperature 1e-38 is below 1e-37"),
    (["sample", "--select", "dpp", "--candidates", "4", "--n", "5"], "--candidates 4 must be at least --n 5"),
    (["sample", "--precision", "fp8"], "--precision 'fp8' is not a precision"),
    (["sample", "--max-len", "0"], "--max-len must be at least 1 (got 0)"),
    (["caption", "a.jpg", "--method", "topk", "--top-k", "0"], "--method topk needs --top-k ≥ 1"),
    (["caption", "a.jpg", "--workers", "-1"], "--workers must be at least 0 (got -1)"),
    (["caption", "a.jpg", "--seed", "-3"], "--seed must be an integer from 0 to 2**63-1"),
    (["plot", "a", "b", "--labels", "one"], "1 labels for 2 scores artifacts"),
    (["prepro", "coco", "--max-length", "0"], "--max-length must be at least 1 (got 0)"),
    (["prepro", "coco", "--workers", "-1"], "--workers must be at least 0 (got -1)"),
    (["prepro", "coco", "--word-count-threshold", "many"], "--word-count-threshold 'many' is neither a count nor"),
    (["prepro", "coco", "--dtype", "float8"], "Invalid value for '--dtype'"),
    (["prepro", "toy", "--images", "3"], "--images 3 is too few; use at least 10"),
    (["prepro", "toy", "--seed", "-1"], "--seed must be an integer from 0 to 2**63-1"),
    (["prepro", "toy", "--batch-size", "0"], "--batch-size must be at least 1 (got 0)"),
    (["verify", "nope"], "artifact 'nope' not found"),
])
def test_a_bad_value_is_one_line_before_any_folder(tmp_path, args, message):
    ws = tmp_path / "ws"
    r = _run(*args, "--workspace", ws)
    assert r.exit_code == 2, r.output
    lines = _error_lines(r)
    assert len(lines) == 1 and message in lines[0], r.output
    assert not ws.exists()  # refused before the workspace (or anything in it) was made


@pytest.mark.integration
def test_prepro_and_verify_read_rdpp_yaml_and_config_by_field_name(tmp_path, received):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "rdpp.yaml").write_text("prepro_coco:\n  captions: [a.csv, b.jsonl]\n  restval_to_train: false\n"
                                  "  dtype: float32\n  word_count_threshold: 3\nprepro_toy:\n  images: 50\n"
                                  "  seed: 2\nverify:\n  quick: true\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_length: 9\npretrained: false\nbatch_size: 7\n")
    assert _run("prepro", "coco", "--workspace", ws, "--config", cfg, "--batch-size", "4").exit_code == 0
    c = received["prepro coco"]
    # rdpp.yaml < --config < flags
    assert (c.captions, c.restval_to_train, c.dtype, c.word_count_threshold, c.max_length, c.pretrained,
            c.batch_size) == ([Path("a.csv"), Path("b.jsonl")], False, "float32", "3", 9, False, 4)
    assert type(c.dtype) is str  # the choice arrives as the plain value the stage records
    # typed flags win: --captions repeated, the --restval-to-train switch, a --dtype choice
    r = _run("prepro", "coco", "--workspace", ws, "--captions", "x.csv", "--captions", "y.csv",
             "--restval-to-train", "--dtype", "float16", "--karpathy-json", "k.json")
    c = received["prepro coco"]
    assert r.exit_code == 0 and (c.captions, c.restval_to_train, c.dtype, c.karpathy_json) == \
        ([Path("x.csv"), Path("y.csv")], True, "float16", Path("k.json"))
    assert _run("prepro", "toy", "--workspace", ws, "--batch-size", "10").exit_code == 0
    t = received["prepro toy"]
    assert (t.images, t.seed, t.batch_size, t.backbone) == (50, 2, 10, "pixstats")
    assert _run("verify", "data/a", "b", "--workspace", ws).exit_code == 0
    assert (received["verify"].artifacts, received["verify"].quick) == (["data/a", "b"], True)
    cfg.write_text("quick: false\n")
    assert _run("verify", "--workspace", ws, "--config", cfg).exit_code == 0
    assert not received["verify"].artifacts and received["verify"].quick is False  # every artifact, hashed
    cfg.write_text("dtypes: float32\n")
    r = _run("prepro", "coco", "--config", cfg, "--workspace", ws)
    assert r.exit_code == 2 and "unknown option 'dtypes' for `rdpp prepro coco`" in r.output


@pytest.mark.integration
@pytest.mark.parametrize("command, config, message", [
    (["prepro", "coco"], {"dtype": "float8"}, "bad value for 'dtype'"),
    (["prepro", "coco"], {"max_length": 0}, "--max-length must be at least 1 (got 0)"),
    (["prepro", "toy"], {"images": "many"}, "bad value for 'images'"),
    (["verify"], {"quick": "maybe"}, "bad value for 'quick'"),
])
def test_a_bad_value_in_a_config_file_is_one_line_before_any_folder(tmp_path, command, config, message):
    ws = tmp_path / "ws"
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(config))
    r = _run(*command, "--config", cfg, "--workspace", ws)
    assert r.exit_code == 2, r.output
    lines = _error_lines(r)
    assert len(lines) == 1 and message in lines[0], r.output
    assert not ws.exists()


@pytest.mark.integration
def test_verify_exits_1_when_an_artifact_has_a_problem(tmp_path):
    from rdpp_cli.artifacts.verify import verify

    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    r = _run("verify", "--workspace", ws)
    assert r.exit_code == 0 and "0 artifact(s) checked" in r.output, r.output
    (ws / "data" / "toy-v1").mkdir()  # a folder without a manifest: a problem
    r = _run("verify", "--workspace", ws)
    assert r.exit_code == 1 and "1 artifact(s) checked" in r.output and "1 with problems" in r.output, r.output
    # the plain function: the fields as keyword arguments or an options object, plus its own show=
    for checked in (verify(workspace=ws, show=False), verify(VerifyOptions(workspace=ws, quick=True), show=False)):
        assert [(c.path.name, c.ok) for c in checked] == [("toy-v1", False)]
        assert "no manifest.json" in checked[0].problems[0]


@pytest.mark.unit
def test_prepro_takes_its_fields_as_arguments_and_shows_its_choices(tmp_path):
    from rdpp_cli.data import prepro, toy
    from rdpp_cli.options import build

    assert prepro.prepro_coco.options is PreproCocoOptions and toy.prepro_toy.options is PreproToyOptions
    # prepro_coco(karpathy_json, images_root, out, ...) and prepro_toy(out, ...), as before the options class
    coco, _ = build(PreproCocoOptions, ("k.json", "images", "out"), {"word_count_threshold": 1})
    assert (coco.karpathy_json, coco.images_root, coco.out, coco.word_count_threshold) == \
        ("k.json", "images", "out", 1)
    assert build(PreproToyOptions, ("out",), {"images": 20})[0].out == "out"
    with pytest.raises(RdppError, match=r"--dtype 'float8' is not one of: float16, float32"):
        PreproCocoOptions(dtype="float8")
    with pytest.raises(RdppError, match="--images 3 is too few"):
        toy.prepro_toy(images=3, workspace=tmp_path / "ws")
    assert not (tmp_path / "ws").exists()
    text = " ".join(_run("prepro", "coco", "--help").output.split())
    assert all(w in text for w in ("<float16|float32>", "--no-restval-to-train", "--no-pretrained", "FILE"))


@pytest.mark.unit
def test_the_decoding_options_are_declared_once_and_are_the_decoders_config():
    decoding = [f.name for f in dataclasses.fields(DecodingOptions)]
    assert decoding == ["method", "temperature", "top_k", "top_p", "beam", "groups", "diversity_lambda",
                        "length_norm", "max_len", "allow_unk"]
    for cls in (DecodeConfig, SampleOptions, CaptionOptions):
        assert issubclass(cls, DecodingOptions)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for f in dataclasses.fields(DecodingOptions):
            if f.name != "method":  # each stage has its own default method, with the same help
                assert fields[f.name] is f or fields[f.name].metadata == f.metadata, (cls, f.name)
            assert fields[f.name].metadata["help"] == f.metadata["help"], (cls, f.name)
    assert (SampleOptions().method, CaptionOptions(paths=[Path("a.jpg")]).method, DecodeConfig().method) == \
        ("random", "beam", "greedy")
    commands = typer.main.get_command(app).commands
    helps = [{p.name: p.help for p in commands[c].params if p.name in decoding} for c in ("sample", "caption")]
    assert helps[0] == helps[1] and len(helps[0]) == len(decoding)


@pytest.mark.unit
def test_the_decoders_config_comes_from_the_options_in_one_step():
    opts = SampleOptions(method="dbs", n=4, diversity_lambda=0.3, allow_unk=False)
    cfg = opts.decode_config(opts.decoded_per_image, max_len=12, unk_id=7)
    assert (cfg.method, cfg.n, cfg.max_len, cfg.unk_id, cfg.diversity_lambda) == ("dbs", 4, 12, 7, 0.3)
    assert (cfg.groups, cfg.beam) == (4, 1)  # the method's defaults, filled in for n = 4
    assert SampleOptions(max_len=5).decode_config(20, max_len=12).max_len == 5  # given: the option wins
    assert SampleOptions(allow_unk=True).decode_config(20, unk_id=7).unk_id is None
    assert "allow_unk" not in cfg.to_dict() and cfg.to_dict()["unk_id"] == 7  # recorded as the word it suppresses


@pytest.mark.unit
def test_candidates_keep_their_own_name():
    """With --select the decoder makes ``candidates`` captions per image; ``n`` stays the captions kept."""
    plain = SampleOptions(n=5)
    chosen = SampleOptions(n=5, select="mbr", candidates=30)
    assert (plain.decoded_per_image, chosen.decoded_per_image) == (5, 30)
    assert chosen.decode_config(chosen.decoded_per_image).n == 30 and chosen.n == 5
    sel = chosen.selection()
    assert (sel.method, sel.candidates, sel.quality) == ("mbr", 30, "consensus")
    assert plain.selection() is None
    with pytest.raises(RdppError, match="--keep-candidates keeps the candidates of --select"):
        SampleOptions(keep_candidates=True)


@pytest.mark.unit
def test_sample_and_caption_take_their_fields_as_keyword_arguments():
    from rdpp_cli.captioning import caption as caption_module
    from rdpp_cli.decoding import sample as sample_module
    from rdpp_cli.options import takes

    # the real functions, decorated: keyword calls build and check the options object
    assert sample_module.sample.options is SampleOptions and caption_module.caption.options is CaptionOptions
    seen = []
    stage = takes(SampleOptions)(lambda opts: seen.append(opts))
    stage("dpp-m5-v1", method="beam", n=2, beam=4)
    assert (seen[0].model, seen[0].method, seen[0].n, seen[0].beam) == ("dpp-m5-v1", "beam", 2, 4)
    with pytest.raises(RdppError, match="no photos given"):
        CaptionOptions()
