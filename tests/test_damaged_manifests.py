"""A damaged manifest (a field of another type than rdpp writes) or a loop of links in the workspace is
reported for that folder, and `rdpp ls` / `rdpp verify` go on with every other artifact; a stage given
the damaged artifact refuses it in one line."""

from __future__ import annotations

import json
import os

import pytest

from rdpp_cli.artifacts import read_artifact

from helpers import error_line, model_artifact, rdpp, write_tiny_data

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged") / "ws"
    data = read_artifact(write_tiny_data(root / "data" / "tiny-v1", n_train=8, n_val=2, n_test=2))
    return root, model_artifact(root, data), model_artifact(root, data, seed=1)


@pytest.mark.parametrize("field, value, said", [
    ("config", None, "'config' is null, not a mapping"),
    ("inputs", "x", "'inputs' is the text 'x', not a list"),
    ("files", [], "'files' is a list, not a mapping"),
    ("inputs", [3], "inputs[0] is a number, not a mapping"),
    ("summary", [1], "'summary' is a list, not a mapping"),
    ("files", {"checkpoints/best.pt": {"sha256": "ab"}}, "files['checkpoints/best.pt'].bytes is null, not a size"),
    ("files", {"../../x": {"sha256": "ab", "bytes": 1}}, "files lists '../../x', which is not a file inside"),
])
def test_a_damaged_manifest_is_reported_and_the_rest_still_listed_and_verified(ws, field, value, said):
    root, good, bad = ws
    path = bad.path / "manifest.json"
    kept = path.read_text()
    manifest = json.loads(kept)
    manifest[field] = value
    path.write_text(json.dumps(manifest))
    try:
        r = rdpp("ls", "--workspace", root)
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        assert f"xe/{good.name}" in r.output and f"xe/{bad.name} (" in r.output and said in r.output, r.output
        r = rdpp("verify", "--workspace", root)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output  # the verdict, not a crash
        assert "3 artifact(s) checked" in r.output and "1 with problems" in r.output and said in r.output, r.output
        line = error_line(rdpp("sample", bad.path, "--n", "1", "--method", "greedy", "--device", "cpu",
                               "--workspace", root))
        assert str(path) in line and said in line and "the manifest is damaged" in line, line
    finally:
        path.write_text(kept)


def test_a_loop_of_links_is_a_problem_of_its_own_not_a_crash(ws):
    root, good, bad = ws
    links = [root / "xe" / "loop", root / "xe" / "a", root / "xe" / "b"]
    os.symlink("loop", links[0])
    os.symlink("b", links[1])
    os.symlink("a", links[2])
    try:
        r = rdpp("verify", "--workspace", root)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
        assert "6 artifact(s) checked" in r.output and "3 with problems" in r.output, r.output
        assert r.output.count("in a loop of links") == 3, r.output
        r = rdpp("ls", "--workspace", root)
        assert r.exit_code == 0 and "xe/loop (a link to loop in a loop of links" in r.output, r.output
    finally:
        for link in links:
            link.unlink()
