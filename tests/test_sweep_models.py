"""examples/sweep.sh models and models-lr at a smoke budget: the artifacts, the compare figure, the tables,
and the learning-rate runs at the models sweep's fine-tuning budget."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def sweep(name: str, ws: Path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "RDPP": f"{sys.executable} -m rdpp_cli", "RDPP_NO_PROGRESS": "1", "WS": str(ws),
           "MODELS": "att2in", "IMAGES": "200", "XE_EPOCHS": "1", "RL_EPOCHS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(["bash", str(ROOT / "examples" / "sweep.sh"), name], cwd=ws.parent, env=env,
                          capture_output=True, text=True, timeout=1800)


@pytest.mark.slow  # ~2.5 min on 2 idle cores
def test_models_then_models_lr_at_the_given_budget(tmp_path):
    ws = tmp_path / "runs-models"
    r = sweep("models", ws)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for run in ("scst-att2in", "dpp-m5-att2in"):
        cfg = json.loads((ws / "finetune" / run / "manifest.json").read_text())["config"]
        assert (cfg["epochs"], cfg["lr"], cfg["recipe"]["preset"]) == (1, 1e-4, "small")
    assert (ws / "compare" / "models-att2in" / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| att2in | R-DPP m=5 |" in r.stdout

    r = sweep("models-lr", ws, RL_LRS="1e-4 3e-4")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not (ws / "finetune" / "scst-att2in-lr1e-4").exists()  # the models sweep's own run is that lr's
    for run in ("scst-att2in-lr3e-4", "dpp-m5-att2in-lr3e-4"):
        cfg = json.loads((ws / "finetune" / run / "manifest.json").read_text())["config"]
        assert (cfg["epochs"], cfg["lr"]) == (1, 3e-4), run  # RL_EPOCHS holds for every learning rate
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| att2in |")]
    assert [ln.split("|")[2].strip() for ln in rows] == ["1e-4", "3e-4"]
    assert all("(1)" in ln and "–" not in ln for ln in rows), rows  # one epoch each, every run found
