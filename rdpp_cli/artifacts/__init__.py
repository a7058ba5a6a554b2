"""Artifacts (versioned, manifest-checked stage outputs) and the workspace that holds them."""

from rdpp_cli.artifacts.lineage import entry_name, find_by_hash, follow_input, open_input, ref_name
from rdpp_cli.artifacts.lock import released_on_error
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
    derived_name,
    find_reusable,
    finish,
    list_artifacts,
    prepare_output,
    resolve_input,
    split_version,
    version_name,
    workspace_dir,
)

__all__ = [
    "MANIFEST", "SCHEMA", "SCHEMAS", "Artifact", "atomic_write_bytes", "atomic_write_json", "is_complete",
    "read_artifact", "sha256_file", "write_manifest", "GROUPS", "find_reusable", "finish", "list_artifacts",
    "prepare_output", "resolve_input", "workspace_dir", "derived_name", "split_version", "version_name",
    "entry_name", "find_by_hash", "follow_input", "open_input", "ref_name", "released_on_error",
]
