"""benchmarks/models_speed.py, the one benchmark harness, at tiny sizes on a CPU for one repeat: it
checks rdpp against the peer's own module first (when the peer's checkout is here) and reports every
side it was asked for, with a positive time, and ratios of the pairs it timed. Nothing is asserted
about speed (CONTRIBUTING.md: speed is measured in benchmarks/, never asserted in a test). The runs
take about 15-30 s of CPU on 2 cores (most of it importing the peer and building models): slow."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

import peer_loader
from helpers import BENCHMARKS, peer_modules


@pytest.fixture(scope="module")
def models_speed():
    """benchmarks/models_speed.py, loaded from its file (it finds its neighbours in benchmarks/ itself)."""
    if "models_speed" not in sys.modules:
        spec = importlib.util.spec_from_file_location("models_speed", BENCHMARKS / "models_speed.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["models_speed"] = module
        spec.loader.exec_module(module)
    return sys.modules["models_speed"]


@pytest.mark.slow
@pytest.mark.integration
def test_the_harness_checks_against_the_peer_then_times_every_side(models_speed, capsys):
    peer_modules()  # the peer's checkout, or a skip saying what is missing
    models_speed.main(["--model", "att2in", "--quick", "--what", "xe", "--precision", "fp32,bf16", "--json"])
    out = capsys.readouterr().out
    line = json.loads(next(ln for ln in out.splitlines() if ln.startswith('{"benchmark": "models_speed"')))
    assert set(line["steps"]) == {"rdpp Att2in xe fp32", "rdpp Att2in xe bf16", "self-critical.pytorch Att2in2Model xe"}
    assert all(s["median"] > 0 and len(s["times"]) == 1 for s in line["steps"].values())
    assert [p[0] for p in line["pairs"]] == ["xe fp32", "xe bf16"]
    check = line["checks"]["xe"]
    assert check["same_greedy_captions"] and check["logprob"] <= 1e-4
    assert check["float64"]["loss_abs_diff"] <= 1e-9 and check["float64"]["grad_rel_diff"] <= 1e-6


@pytest.mark.slow
@pytest.mark.integration
def test_updowns_fast_path_is_checked_equal_to_its_eager_step_then_timed(models_speed, capsys):
    """UpDown reads fc: the harness's fast-path check passes it to both sides (it was refused before
    UpDown had a fast path)."""
    models_speed.main(["--model", "updown", "--quick", "--what", "xe", "--no-peer", "--fast", "fast", "--json"])
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line["checks"]["xe"]["fast"]["equal"], line["checks"]["xe"]["fast"]


@pytest.mark.slow
@pytest.mark.integration
def test_the_fast_rl_step_is_checked_equal_to_its_eager_step_then_timed(models_speed, capsys):
    """The fast RL check passes the drawn samples and greedy captions to ``device_weights``, and its
    stand-in data gives the references laid out as the fast path's reference table reads them (every
    fast RL row was reported as an error instead of timed: a TypeError, then an AttributeError)."""
    models_speed.main(["--model", "att2in", "--quick", "--what", "scst", "--no-peer", "--fast", "fast",
                       "--backend", "aot_eager", "--json"])
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    check = line["checks"]["rl"]["rdpp Att2in scst m=5 fast"]
    assert check["equal"] and check["weights_abs_diff"] <= 1e-9 and check["same_captions"] == 1.0, check
    assert "rdpp Att2in scst m=5 fast" in line["steps"]


@pytest.mark.slow
@pytest.mark.integration
def test_model_hf_is_checked_against_transformers_then_timed(models_speed, capsys):
    pytest.importorskip("transformers")
    models_speed.main(["--model", "hf", "--quick", "--threads", "1", "--json"])
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line["benchmark"] == "models_speed hf" and line["checks"]["logprob"] <= 1e-4 and line["checks"]["tokens"] > 1
    assert [r[0] for r in line["rows"]] == ["decode", "score", "replay"]


@pytest.mark.unit
def test_model_hf_takes_only_its_own_steps(models_speed, capsys):
    with pytest.raises(SystemExit) as e:
        models_speed.main(["--model", "hf", "--what", "decode,xe"])
    assert e.value.code == 2 and "unknown: xe" in capsys.readouterr().err


@pytest.mark.unit
def test_no_peer_checkout_names_the_option_that_times_rdpp_alone(models_speed, monkeypatch):
    monkeypatch.delenv("SCP_REPO", raising=False)
    monkeypatch.setattr(peer_loader, "DEFAULT_PLACES", ())
    with pytest.raises(SystemExit, match="no self-critical.pytorch checkout found") as e:
        peer_loader.find_repo()
    assert "--no-peer" in str(e.value)  # models_speed.py's option (there is no --no-reference)
    with pytest.raises(SystemExit) as e:
        models_speed.main(["--model", "att2in", "--quick", "--what", "xe", "--no-reference"])
    assert e.value.code == 2


@pytest.mark.unit
def test_the_summary_reads_the_harness_lines(models_speed, tmp_path, capsys):
    log = tmp_path / "models_att2in.log"
    log.write_text(json.dumps({"benchmark": "models_speed", "title": "Att2in", "ratios": {"xe fp32": 2.0},
                               "pairs": [["xe fp32", "a", "b"]], "steps": {"a": {"median": 0.01}, "b": {"median": 0.02}}}))
    models_speed.main(["--summary", str(log)])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("Att2in xe fp32") and "10.0ms" in row and "20.0ms" in row and "2.00x" in row


@pytest.mark.unit
def test_the_summary_has_every_fast_sides_compile_seconds_and_the_last_epochs(models_speed, tmp_path, capsys):
    """A fast side that compiled shows its seconds, one that failed its error; of the epochs' lines (one
    after every epoch, so that a run stopped at its limit still reports) only the last counts."""
    log = tmp_path / "models_att2in.log"
    xe = {"benchmark": "models_speed", "title": "Att2in", "group": "xe", "ratios": {}, "pairs": [], "steps": {},
          "checks": {"xe": {"logprob": 1e-6, "float64": {"loss_abs_diff": 0.0}, "fast": {"equal": True, "compile_s": 47.7}}}}
    rl = {**xe, "group": "rl", "checks": {"rl": {"reward": {"q": 0.0}, "rdpp Att2in dpp m=5 fast": {"error": "InductorError: x"},
                                                 "rdpp Att2in scst m=5 fast": {"equal": True, "compile_s": 61.25}}}}
    log.write_text(json.dumps(xe) + "\n" + json.dumps(rl) + "\n")
    epochs = tmp_path / "epochs.log"
    first = {"stage": "xe", "batch": 128, "precision": "fp32", "ss": "", "images_per_s": 1000.0}
    line = lambda eps: json.dumps({"benchmark": "data_epochs", "xe_epoch": {  # noqa: E731
        "warmup": [{"stage": "xe", "batch": 128, "precision": "fp32", "ss": "", "s": 34.0}], "epochs": eps}})
    epochs.write_text(line([first]) + "\n" + line([first, {**first, "stage": "dpp", "images_per_s": 700.0}]) + "\n")
    models_speed.main(["--summary", str(log), str(epochs)])
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[-2:] for ln in out if ln.startswith("compile ")] == [["47.7", "s"], ["InductorError:", "x"],
                                                                             ["61.2", "s"]]
    assert any(ln.startswith("compile Att2in xe fast") for ln in out)
    assert [ln.split()[1] for ln in out if ln.startswith("epoch ")] == ["xe", "dpp"]  # the last line's, once each
    assert [ln for ln in out if ln.startswith("warm-up (compiling) xe batch 128")][0].split()[-2:] == ["34.0", "s"]


@pytest.mark.unit
def test_the_summary_names_the_cuda_tests_that_failed_before_the_step_was_stopped(models_speed, tmp_path, capsys):
    """Step 1 stopped at its limit prints no pytest summary: the summary still names each failed test from
    the -v lines written as each test ended (an H200 call once reported '......F' and nothing else)."""
    log = tmp_path / "test_cuda.log"
    log.write_text("tests/test_cuda.py::test_a PASSED      [  6%]\n"
                   "tests/test_cuda.py::test_fast_rl_at_paper_shapes FAILED      [ 12%]\n")
    models_speed.main(["--summary", str(log)])
    out = capsys.readouterr().out.splitlines()
    assert out[-2].split()[-2:] == ["(no", "result)"]
    assert out[-1].split() == ["failed:", "test_fast_rl_at_paper_shapes"]


@pytest.mark.unit
def test_cuda_checks_plan_lists_every_step_in_two_eight_minute_parts():
    """``cuda_check.sh --device cpu --plan`` runs nothing: each step with its time limit on CUDA, in two
    parts (``--part 1|2``), each of which fits one 8-minute call; together they hold every step."""
    import re
    import subprocess

    out = subprocess.run(["bash", str(BENCHMARKS / "cuda_check.sh"), "--device", "cpu", "--plan"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    parts = re.split(r"^(?=cuda_check\.sh --device cpu --part )", out, flags=re.M)[1:]
    assert len(parts) == 2, out
    logs = []
    for n, part in enumerate(parts, 1):
        limits = {log: int(s) for s, log in re.findall(r"^\s*(\d+) s\s+(\S+\.log)\s", part, re.M)}
        assert sum(limits.values()) <= 480 and f"part {n} total: {sum(limits.values())} s" in part, part
        assert "summary.log" in limits  # each call ends with its own table
        logs += [log for log in limits if log != "summary.log"]
    assert sorted(logs) == sorted({"test_cuda.log", "models_att2in.log", "models_updown.log", "models_transformer.log",
                                   "epochs.log", "recipe.log"}), out
    alone = subprocess.run(["bash", str(BENCHMARKS / "cuda_check.sh"), "--device", "cpu", "--plan", "--part", "2"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert alone == parts[1]
    bad = subprocess.run(["bash", str(BENCHMARKS / "cuda_check.sh"), "--part", "3"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--part is 1" in bad.stderr
    assert re.search(r"models_updown\.log .*--fast fast", out) and re.search(r"models_transformer\.log .*--fast fast", out)
