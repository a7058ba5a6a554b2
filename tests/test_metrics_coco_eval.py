"""The coco-caption wrapper: the PTB tokenizer and the known pycocoevalcap traps (README of
tests/data/coco-val2014-1k). The full 1k-image reproduction is in test_score.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from rdpp_cli.errors import RdppError
from rdpp_cli.metrics import coco_eval

BREAKS = ["\r", "\u2028", "\u2029", "\x0b", "\x0c"]


@pytest.mark.integration
def test_ptb_tokenizer_equals_pycocoevalcaps_and_writes_nothing_into_the_package():
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    caps = ["A man, riding a horse.", "Two dogs -- playing (outside)!", "", "Café au lait é?", "It's a DOG's toy"]
    folder = coco_eval.tokenizer_jar().parent
    before = sorted(os.listdir(folder))
    ours = coco_eval.ptb_tokenize(caps)
    assert sorted(os.listdir(folder)) == before  # the temp file lives in our own temp folder
    theirs = PTBTokenizer().tokenize({k: [{"caption": c}] for k, c in enumerate(caps)})
    assert ours == [theirs[k][0] for k in range(len(caps))]
    assert ours[0] == "a man riding a horse" and ours[2] == ""


@pytest.mark.integration
def test_line_breaks_cannot_shift_captions_onto_other_images():
    caps = [f"first{ch}caption number {k}" for k, ch in enumerate(BREAKS)] + ["the last caption"]
    toks = coco_eval.ptb_tokenize(caps)
    assert toks == [f"first caption number {k}" for k in range(len(BREAKS))] + ["the last caption"]
    # unsanitized, the tokenizer really returns more lines; the count check says so in one line
    with pytest.raises(RdppError, match=r"returned \d+ lines for 6 captions") as e:
        coco_eval.run_ptb(caps)
    assert "\n" not in str(e.value)


@pytest.mark.unit
def test_missing_java_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.delenv("RDPP_JAVA", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RdppError, match="java not found") as e:
        coco_eval.java()
    assert "\n" not in str(e.value)


@pytest.mark.integration
def test_meteor_error_is_one_line_and_the_process_exits(tmp_path):
    """pycocoevalcap's Meteor keeps its lock after an error and hangs at exit; ours must not.
    A fake java answers like METEOR under a comma-decimal locale ("0,19")."""
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\nwhile read line; do echo '0,19'; done\n")
    fake.chmod(0o755)
    code = textwrap.dedent("""
        from rdpp_cli.errors import RdppError
        from rdpp_cli.metrics.coco_eval import meteor
        try:
            meteor(["a man riding a horse"], [["a man on a horse"]])
        except RdppError as e:
            print("ERROR", e)
            raise SystemExit(3)
    """)
    env = dict(os.environ, RDPP_JAVA=str(fake))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "METEOR answered '0,19' instead of a number" in lines[0]


@pytest.mark.unit
def test_spice_is_skipped_with_a_note_and_never_downloads(capsys):
    lib = coco_eval.spice_models()[0].parent
    before = sorted(os.listdir(lib))
    if coco_eval.spice_available():
        pytest.skip("the Stanford CoreNLP models for SPICE are installed here")
    ev = coco_eval.evaluate([["a man riding a horse"], ["a dog"]], [["a man on a horse"], ["a black dog"]],
                            metrics=("CIDEr", "SPICE"), tokenize=False)
    assert "SPICE" in ev.skipped and "SPICE" not in ev.corpus
    assert "SPICE skipped" in capsys.readouterr().err
    assert sorted(os.listdir(lib)) == before
    assert np.isfinite(ev.corpus["CIDEr"])


@pytest.mark.unit
def test_evaluate_gives_per_caption_scores_for_every_metric_without_java():
    caps = [["a man riding a horse", "a man", "a horse on a beach"], ["a dog"]]
    refs = [["a man riding a horse on a beach", "a person on a horse"], ["a black dog", "a dog running"]]
    ev = coco_eval.evaluate(caps, refs, metrics=("Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"), tokenize=False)
    for m in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr"):
        assert [len(x) for x in ev.per_caption[m]] == [3, 1]
    assert ev.per_caption["Bleu_1"][0][0] == pytest.approx(1.0)  # every word of caption 0 is in a reference
    assert abs(ev.corpus["CIDEr"] - np.mean(np.concatenate(ev.per_caption["CIDEr"]))) < 1e-12
    with pytest.raises(ValueError):
        coco_eval.evaluate([[]], [["a"]], metrics=("CIDEr",), tokenize=False)


@pytest.mark.integration
def test_blank_captions_anywhere_keep_every_caption_on_its_image():
    from rdpp_cli.metrics.coco_eval import ptb_tokenize

    caps = ["", "A dog, running.", "", "two cats", "", ""]
    assert ptb_tokenize(caps) == ["", "a dog running", "", "two cats", "", ""]
