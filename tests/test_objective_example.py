"""examples/own_loop.py (docs/api.md) runs end to end: a user's own model and loop, fine-tuned with
rdpp_cli.objective on the CPU. The numbers of its fixed-seed runs move as each reward says they
should: SCST raises the samples' CIDEr-D, R-DPP raises their diversity (self-CIDEr) beyond SCST's."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "own_loop.py"


def test_the_example_fine_tunes_a_tiny_model_with_r_dpp_and_scst(monkeypatch, capsys):
    # as typed, `python examples/own_loop.py --rl-steps 20` (in this process: torch is loaded once)
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--rl-steps", "20"])
    example = runpy.run_path(str(EXAMPLE), run_name="__main__")
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("cross-entropy:") and any(line.startswith("step  19") for line in lines)
    dpp = json.loads(lines[-1])
    scst = example["main"](["--reward", "scst", "--m", "3", "--rl-steps", "20"])
    for run in (dpp, scst):
        assert run["losses_finite"] and run["max_weights_diff"] == 0.0  # ids + decode == the same texts
        assert run["xe_loss"][1] < 0.5 * run["xe_loss"][0]
        assert math.isfinite(run["sample_cider_first"]) and run["sample_cider_first"] > 1.0  # XE learnt the captions
    assert (dpp["reward"], dpp["m"]) == ("dpp", 5)
    assert scst["sample_cider_last"] > scst["sample_cider_first"] + 0.1  # SCST: more accurate samples
    assert dpp["self_cider_last"] > dpp["self_cider_first"] + 0.03  # R-DPP: more diverse samples
    assert dpp["self_cider_last"] > scst["self_cider_last"] + 0.1
    assert all(text.endswith(".") for text in scst["greedy"].values())  # the model's decode made the texts


HF_EXAMPLE = EXAMPLE.with_name("hf_loop.py")


def test_the_hugging_face_example_fine_tunes_a_saved_captioner(tmp_path, monkeypatch, capsys):
    """examples/hf_loop.py on a tiny random ViT + GPT-2 folder (helpers.tiny_hf_captioner, no download),
    first taught the example's references on the example's stand-in images by a few XE steps."""
    transformers = pytest.importorskip("transformers")
    from helpers import tiny_hf_captioner

    refs = runpy.run_path(str(HF_EXAMPLE), run_name="not_main")["REFERENCES"]
    folder = tiny_hf_captioner(tmp_path / "captioner", texts=[c for caps in refs.values() for c in caps],
                               dropout=0.0)
    model = transformers.VisionEncoderDecoderModel.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    size = model.config.encoder.image_size
    pixels = torch.randn(len(refs), 3, size, size, generator=torch.Generator().manual_seed(0))  # the example's
    texts = [(i, c) for i, caps in enumerate(refs.values()) for c in caps]
    tokenizer.pad_token = tokenizer.eos_token
    labels = tokenizer([c + tokenizer.eos_token for _, c in texts], padding=True, return_tensors="pt")
    labels = labels.input_ids.masked_fill(labels.attention_mask == 0, -100)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        loss = model(pixel_values=pixels[[i for i, _ in texts]], labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(folder)
    # as typed, `python examples/hf_loop.py DIR --steps 10 --m 4`
    monkeypatch.setattr(sys, "argv", [str(HF_EXAMPLE), str(folder), "--steps", "10", "--m", "4"])
    runpy.run_path(str(HF_EXAMPLE), run_name="__main__")
    logs = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [x["step"] for x in logs] == list(range(10)) and all(math.isfinite(x["loss"]) for x in logs)
    assert {"loss", "sample_cider", "reward", "self_cider"} <= logs[0].keys()
    assert min(x["sample_cider"] for x in logs) > 0.3  # the samples share words with the references it learnt
    assert len({x["loss"] for x in logs}) == 10  # a new draw and new weights each step
