"""NaN or infinity in features: `prepro coco --features-from` refuses an image whose ``fc`` or ``att``
holds one, naming it, and `rdpp verify` reports a data artifact whose features.h5 holds one (made so
by an older rdpp) instead of saying ok."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from rdpp_cli.artifacts import read_artifact, write_manifest

from helpers import error_line, rdpp, write_tiny_data

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).parent / "fixtures" / "karpathy_small.json"
IDS = [11, 22, 33, 44]


@pytest.mark.parametrize("bad", ["fc", "att"])
def test_an_imported_nan_is_refused_naming_the_image_and_the_array(tmp_path, bad):
    rng = np.random.default_rng(0)
    (tmp_path / "src" / "cocobu_att").mkdir(parents=True)
    (tmp_path / "src" / "cocobu_fc").mkdir()
    for i in IDS:
        att, fc = rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=6).astype(np.float32)
        if i == 33:
            (fc if bad == "fc" else att)[1] = np.nan
        np.save(tmp_path / "src" / "cocobu_att" / f"{i}.npy", att)
        np.save(tmp_path / "src" / "cocobu_fc" / f"{i}.npy", fc)
    r = rdpp("prepro", "coco", "--karpathy-json", FIXTURE, "--features-from", tmp_path / "src", "--out",
             tmp_path / "a", "--word-count-threshold", "1", "--batch-size", "2")
    line = error_line(r)
    assert f"the {bad} features of image 33 hold NaN or infinity" in line and str(tmp_path / "src") in line, line


@pytest.mark.parametrize("bad", ["fc", "att"])
def test_verify_reports_features_holding_nan(tmp_path, bad):
    data = write_tiny_data(tmp_path / "ws" / "data" / "tiny-v1", n_train=6, n_val=2, n_test=2)
    r = rdpp("verify", "--workspace", tmp_path / "ws")
    assert r.exit_code == 0 and "0 with problems" in r.output, r.output
    with h5py.File(data / "features.h5", "r+") as f:
        f[bad][7] = np.inf if bad == "att" else np.nan
        image = int(f["image_ids"][7])
    write_manifest(data, "rdpp.data", read_artifact(data).config)  # recorded as an older rdpp would have
    r = rdpp("verify", "--workspace", tmp_path / "ws")
    assert r.exit_code == 1 and "1 with problems" in r.output, r.output
    assert f"the {bad} features of image {image} (row 7) hold NaN" in " ".join(r.output.split()), r.output
