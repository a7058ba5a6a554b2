"""The data artifact a model artifact was trained on: found from the model's lineage, or checked
against the one the user names.

Fine-tuning and sampling both need it (and must refuse data the model was not trained on); it
lives here so that neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

from rdpp_cli.artifacts.manifest import Artifact, read_artifact
from rdpp_cli.artifacts.workspace import resolve_input
from rdpp_cli.console import info
from rdpp_cli.errors import RdppError


def same_artifact(ref: dict, art: Artifact) -> bool:
    """Whether a manifest's input entry ``ref`` names artifact ``art`` (same manifest bytes)."""
    sha = ref.get("manifest_sha256")
    if sha:
        return sha == art.manifest_sha256
    return Path(ref.get("path", "")).resolve() == art.path.resolve()


def resolve_data_for(model_art: Artifact, data: str | Path | None, workspace: Path | str | None,
                     quiet: bool = False) -> Artifact:
    """The data artifact: ``data`` if given, else the one the XE model was trained on; it must be
    the model's training data (same manifest)."""
    trained_on = model_art.input_of_kind("rdpp.data")
    if trained_on is None:
        raise RdppError(f"model artifact {model_art.path} records no data artifact among its inputs; "
                        "retrain it with `rdpp train-xe`")
    if data is None and Path(trained_on.get("path", "")).is_dir():
        art = read_artifact(trained_on["path"], "rdpp.data")
        if not quiet:
            info(f"using data artifact: [bold]{art.path}[/bold] (the XE model's training data; --data to pick another)")
    else:
        art = resolve_input(data, workspace=workspace, groups=("data",), kind="rdpp.data", what="data artifact",
                            make_with="rdpp prepro toy` or `rdpp prepro coco", quiet=quiet)
    if not same_artifact(trained_on, art):
        raise RdppError(f"model artifact {model_art.path} was XE-trained on {trained_on.get('path')}, not on data "
                        f"artifact {art.path}; pass --data {trained_on.get('path')} or train an XE model on "
                        f"{art.path} with `rdpp train-xe --data {art.path}`")
    return art
