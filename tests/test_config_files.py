"""Config files (``--config FILE``, ``<workspace>/rdpp.yaml``) are strict: a section no command has, a
value of another type than the option's and a key given twice are one line naming the file, the key
and its line; a file that is not UTF-8 is one line too (a UTF-8 byte-order mark is fine); `rdpp ls`
and `rdpp verify` look at a workspace whatever its rdpp.yaml holds."""

from __future__ import annotations

import json

import pytest

from helpers import error_line, rdpp

pytestmark = pytest.mark.integration


@pytest.fixture
def ws(tmp_path):
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


@pytest.mark.parametrize("text, fragments", [
    ("sample:\n  n: 3\nsampel:\n  n: 4\n", ["rdpp.yaml, line 3: unknown section 'sampel'", "sample, score"]),
    ("sample:\n  n: true\n", ["rdpp.yaml, line 2: bad value for 'n': true is a true/false value",
                              "takes a whole number"]),
    ("sample:\n  method: beam\n  n: 2.5\n", ["rdpp.yaml, line 3: bad value for 'n': 2.5", "whole number"]),
    ("sample:\n  allow_unk: 1\n", ["rdpp.yaml, line 2: bad value for 'allow_unk': 1, but it takes true or false"]),
    ("sample:\n  n: 3\n  seed: 1\n  n: 4\n", ["rdpp.yaml, line 4: 'n' is given twice (first on line 2)"]),
    ("sample:\n  n: 3\nscore:\n  n: 1\nsample:\n  seed: 2\n",
     ["rdpp.yaml, line 5: 'sample' is given twice (first on line 1)"]),
    ("sample:\n  batch-size: 3\n  batch_size: 4\n", ["rdpp.yaml, line 3: 'batch_size' is given twice"]),
])
def test_workspace_yaml_is_strict(ws, text, fragments):
    (ws / "rdpp.yaml").write_text(text)
    line = error_line(rdpp("sample", "--workspace", ws, "--device", "cpu"))
    assert str(ws / "rdpp.yaml") in line
    for f in fragments:
        assert f in line, line
    assert sorted(p.name for p in ws.iterdir()) == ["rdpp.yaml"]  # nothing written


@pytest.mark.parametrize("text, fragments", [
    ('{"n": 3,\n "seed": 2,\n "n": 5}', ["c.json, line 3: 'n' is given twice (first on line 1)"]),
    ('{"n": true}', ["c.json, line 1: bad value for 'n': true is a true/false value"]),
    ('{"seed": 1,\n "n": [2, 3]}', ["c.json, line 2: bad value for 'n': a list, not one value"]),
    ('{"seed": 1,\n "sampel": 3}', ["c.json, line 2: unknown option 'sampel'"]),
])
def test_json_config_is_strict(ws, tmp_path, text, fragments):
    cfg = tmp_path / "c.json"
    cfg.write_text(text)
    line = error_line(rdpp("sample", "--workspace", ws, "--config", cfg))
    for f in fragments:
        assert f in line, line


@pytest.mark.parametrize("encoding", ["utf-16", "latin-1"])
def test_a_config_file_not_in_utf8_is_one_line(ws, tmp_path, encoding):
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes("method: beam  # café\nn: 2\n".encode(encoding))
    line = error_line(rdpp("sample", "--workspace", ws, "--config", cfg))
    assert str(cfg) in line and "UTF-8" in line and "save" in line, line
    (ws / "rdpp.yaml").write_bytes("sample:\n  n: 2  # café\n".encode(encoding))
    line = error_line(rdpp("sample", "--workspace", ws))
    assert str(ws / "rdpp.yaml") in line and "UTF-8" in line, line
    for command in ("ls", "verify"):  # they look at the workspace all the same, and say why rdpp.yaml is not read
        r = rdpp(command, "--workspace", ws)
        assert r.exit_code == 0, r.output
        assert "Traceback" not in r.output and f"rdpp.yaml" in r.output and "UTF-8" in r.output, r.output


def test_a_utf8_byte_order_mark_is_read(ws, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_bytes(b"\xef\xbb\xbf" + json.dumps({"n": 0}).encode())
    line = error_line(rdpp("sample", "--workspace", ws, "--config", cfg))
    assert "--n must be at least 1 (got 0)" in line, line  # the file was read: its value was checked
    (ws / "rdpp.yaml").write_bytes(b"\xef\xbb\xbfsample:\n  n: 0\n")
    assert "--n must be at least 1 (got 0)" in error_line(rdpp("sample", "--workspace", ws))
