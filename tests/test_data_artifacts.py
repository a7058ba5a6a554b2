"""The artifact layer on a real data artifact: manifest round-trip, tamper detection, wrong kind,
newer schema, incomplete folders."""

import json
import shutil

import h5py
import pytest
from typer.testing import CliRunner

from rdpp_cli.artifacts import read_artifact, sha256_file
from rdpp_cli.cli.app import app
from rdpp_cli.data.dataset import DataArtifact
from rdpp_cli.errors import RdppError

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy") / "toy"
    r = CliRunner().invoke(app, ["prepro", "toy", "--out", str(out), "--images", "20"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def copy(toy, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(toy, dst)
    return dst


def flip_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_manifest_round_trip(toy):
    art = read_artifact(toy, "rdpp.data")
    on_disk = json.loads((toy / "manifest.json").read_text())
    assert art.manifest == on_disk
    assert on_disk["kind"] == "rdpp.data" and on_disk["schema"] == 2 and on_disk["inputs"] == []
    assert on_disk["config"]["images"] == 20 and on_disk["config"]["source"] == "toy"
    files = on_disk["files"]
    for name in ("vocab.json", "captions.h5", "features.h5", "cider_df.h5", "source/dataset_toy.json",
                 "source/images/000001.png"):
        assert files[name]["bytes"] == (toy / name).stat().st_size
    assert not any(name.startswith(".") or "/." in name for name in files)  # partial marker, temp files
    assert files["vocab.json"]["sha256"] == sha256_file(toy / "vocab.json")
    assert files["features.h5"]["hash_of"].startswith("h5rows:fc,att,image_ids;block=")
    assert not (toy / ".rdpp-partial.json").exists()
    art.verify()


def test_changed_byte_in_a_small_file_fails_verify(copy):
    flip_byte(copy / "vocab.json", 15)
    art = read_artifact(copy, "rdpp.data")
    with pytest.raises(RdppError, match=r"vocab\.json changed after its artifact was written: same size"):
        art.file("vocab.json")  # the size is the manifest's, the sha256 is not
    with pytest.raises(RdppError, match=r"vocab\.json: sha256 .* does not match the manifest"):
        art.verify()


def test_changed_feature_value_fails_verify(toy, copy):
    with h5py.File(copy / "features.h5", "r") as f:
        offset = f["att"].id.get_chunk_info(3).byte_offset  # image 3's row
    flip_byte(copy / "features.h5", offset + 5)
    with h5py.File(copy / "features.h5", "r") as f, h5py.File(toy / "features.h5", "r") as g:
        assert (f["att"][3] != g["att"][3]).sum() == 1 and (f["att"][4] == g["att"][4]).all()
    with pytest.raises(RdppError, match=r"features\.h5 changed after its artifact was written: same size"):
        read_artifact(copy, "rdpp.data").file("features.h5")  # checked by its row blocks
    with pytest.raises(RdppError, match=r"features\.h5: sha256 .* does not match"):
        read_artifact(copy, "rdpp.data").verify()


def test_changed_size_is_caught_on_open(copy):
    with open(copy / "captions.h5", "ab") as f:
        f.write(b"\0")
    with pytest.raises(RdppError, match=r"captions\.h5 has \d+ bytes but its manifest says"):
        DataArtifact.open(copy)


def test_wrong_kind(toy, copy):
    with pytest.raises(RdppError, match=r"is a rdpp\.data artifact; expected an artifact of kind rdpp\.model"):
        read_artifact(toy, "rdpp.model")
    m = json.loads((copy / "manifest.json").read_text())
    m["kind"] = "rdpp.samples"
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RdppError, match=r"copy is a rdpp\.samples artifact; expected an artifact of kind rdpp\.data"):
        DataArtifact.open(copy)


def test_newer_schema(copy):
    m = json.loads((copy / "manifest.json").read_text())
    m["schema"] = 3
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(RdppError, match=r"manifest\.json has schema 3, newer than this rdpp .* \(schema 2\); upgrade rdpp"):
        read_artifact(copy, "rdpp.data")


def test_folder_without_manifest_is_not_an_artifact(copy):
    (copy / "manifest.json").unlink()
    with pytest.raises(RdppError, match="has no manifest.json"):
        read_artifact(copy, "rdpp.data")
