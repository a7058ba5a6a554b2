"""The bad-ending rate of `rdpp score --diversity`: the share of captions that stop mid-phrase (a
last word that cannot end an English sentence), and with a data artifact the share ending in UNK."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from rdpp_cli.cli.app import app
from rdpp_cli.metrics.diversity import BAD_ENDINGS, ending_share


@pytest.mark.unit
def test_ending_share_by_hand():
    caps = [["a man riding a", "a man riding a horse", "a plate of food on a table with", ""],
            ["two dogs playing outside", "a cat and"],
            [""]]
    got = ending_share(caps)
    assert got[0] == 2 / 3 and got[1] == 1 / 2 and np.isnan(got[2])  # empty captions are not counted
    assert ending_share([["a dog near UNK", "UNK"]], {"unk"})[0] == 0.0  # matched as given (lower case)
    assert ending_share([["a dog near unk", "a dog"]], {"unk"})[0] == 0.5
    assert {"a", "the", "of", "with", "on", "and"} <= BAD_ENDINGS and not {"outside", "up", "it"} & BAD_ENDINGS


@pytest.mark.integration
def test_score_reports_the_bad_ending_rate(tmp_path):
    refs = {"images": [{"id": 1}, {"id": 2}],
            "annotations": [{"image_id": i, "id": 10 * i + k, "caption": c} for i, caps in
                            ((1, ["A man riding a horse.", "A man on a horse."]),
                             (2, ["A cat on a table.", "A cat sitting on a table."])) for k, c in enumerate(caps)]}
    results = [{"image_id": 1, "captions": ["a man riding a", "a man riding a horse", "a horse with"]},
               {"image_id": 2, "captions": ["a cat on a table", "a cat on the", "a cat on a table"]}]
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "res.json").write_text(json.dumps(results))
    r = CliRunner().invoke(app, ["score", str(tmp_path / "res.json"), "--refs", str(tmp_path / "refs.json"),
                                 "--diversity", "--metrics", "CIDEr", "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "s" / "scores.json").read_text())
    assert s["diversity"]["bad_ending"] == np.mean([2 / 3, 1 / 3])
    assert s["diversity"]["unk_ending"] is None  # needs a data artifact's vocabulary
    assert "bad_ending" in r.output
