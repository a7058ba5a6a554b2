"""Artifacts (versioned, manifest-checked stage outputs) and the workspace that holds them."""

from rdpp_cli.artifacts.manifest import (
    MANIFEST,
    SCHEMA,
    SCHEMAS,
    Artifact,
    atomic_write_bytes,
    atomic_write_json,
    is_complete,
    read_artifact,
    sha256_file,
    write_manifest,
)
from rdpp_cli.artifacts.workspace import (
    GROUPS,
    find_reusable,
    finish,
    list_artifacts,
    prepare_output,
    resolve_input,
    workspace_dir,
)

__all__ = [
    "MANIFEST", "SCHEMA", "SCHEMAS", "Artifact", "atomic_write_bytes", "atomic_write_json", "is_complete",
    "read_artifact", "sha256_file", "write_manifest", "GROUPS", "find_reusable", "finish", "list_artifacts",
    "prepare_output", "resolve_input", "workspace_dir",
]
