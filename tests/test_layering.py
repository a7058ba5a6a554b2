"""The layout docs/architecture.md promises: which package may import which, and a CLI that starts
without torch."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdpp_cli.artifacts import write_manifest
from rdpp_cli.decoding.decode import METHODS

ROOT = Path(__file__).resolve().parents[1] / "rdpp_cli"

# docs/architecture.md, "Layers": which layer each package (a folder) or module (a file of rdpp_cli/) is on.
# A package imports only from its own layer or the ones above it in this list. So the core never imports
# the CLI, decoding never imports training, and the precision leaf (autocast) loads no model.
LAYERS = [
    {"errors", "console", "device", "checks", "options", "artifacts", "metrics",
     "hf_folder",  # a Hugging Face folder, read by data (its vision encoder) and models (its decoder)
     "precision"},  # the leaf: autocast, dtypes, grad scaler, tf32 (decoding and the training loop run it)
    {"data", "models",
     "precision_probe"},  # --precision auto: builds a model from the registry and times a step of it
    {"decoding", "scoring", "captioning", "reporting"},
    {"training"},
    {"demo", "objective", "objective_hf", "objective_trl"},  # objective*: the public API of the finetune objective (docs/api.md)
    {"cli", "__main__"},
]
RANK = {pkg: k for k, layer in enumerate(LAYERS) for pkg in layer}


def layer_of(name: str) -> int:
    """The layer (1 = the bottom one, as docs/architecture.md numbers them) of a package or module."""
    return RANK[name] + 1


def _imports(path: Path) -> set[str]:
    """The rdpp_cli packages a file imports (top level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        out |= {n.split(".")[1] for n in names if n.startswith("rdpp_cli.")}
    return out


@pytest.mark.unit
def test_every_package_imports_only_its_layer_or_lower():
    seen, wrong = set(), []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).parts
        pkg = rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")
        if pkg == "__init__":
            continue
        seen.add(pkg)
        assert pkg in RANK, f"{pkg} is in no layer: add it to LAYERS here and to docs/architecture.md"
        for dep in _imports(path) - {pkg}:
            assert dep in RANK, f"{path} imports rdpp_cli.{dep}, which is in no layer"
            if RANK[dep] > RANK[pkg]:
                wrong.append(f"{path.relative_to(ROOT.parent)} imports rdpp_cli.{dep}")
    assert not wrong, "imports against the layers of docs/architecture.md:\n" + "\n".join(wrong)
    assert {"cli", "decoding", "training", "metrics", "data"} <= seen  # the walk found the packages


@pytest.mark.unit
def test_data_never_imports_models():
    """Within layer 2 the arrow points one way: models read the data's words (the bridge), data
    reads no model; a Hugging Face folder's vision encoder comes from ``hf_folder``, below both."""
    wrong = [str(p.relative_to(ROOT.parent)) for p in sorted((ROOT / "data").rglob("*.py")) if "models" in _imports(p)]
    assert not wrong, f"data imports models: {wrong}"


@pytest.mark.unit
def test_the_layer_rule_catches_decoding_importing_training(tmp_path):
    bad = tmp_path / "sample.py"
    bad.write_text("def f():\n    from rdpp_cli.training.finetune import resolve_data_for\n")
    assert RANK["training"] > RANK["decoding"] and _imports(bad) == {"training"}


@pytest.mark.unit
def test_the_precision_leaf_is_on_the_bottom_layer_and_the_probe_on_the_models():
    """precision.py (autocast, dtypes) imports nothing above layer 1, so a caller that only runs a
    precision loads no model; precision_probe.py, which builds one to time it, is on the models' layer."""
    assert (layer_of("precision"), layer_of("precision_probe")) == (1, layer_of("models")) == (1, 2)
    above = {d for d in _imports(ROOT / "precision.py") if layer_of(d) > 1}
    assert not above, f"the precision leaf imports rdpp_cli.{sorted(above)}: it must stay on layer 1"
    assert "models" in _imports(ROOT / "precision_probe.py")  # the walk sees what the probe builds
    code = ("import sys\nfrom rdpp_cli.precision import autocast, grad_scaler\n"
            "print(sorted(m for m in sys.modules if m.startswith('rdpp_cli.') and m.split('.')[1] not in "
            f"{sorted(LAYERS[0])!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr  # imported for real: no model


@pytest.mark.unit
def test_decoding_runs_precision_through_the_leaf_only():
    """Decoding's modules run a precision with the leaf (autocast); the probe is read by one of them,
    the sample stage, for its own `--precision auto` (it times the model it samples from), and by no
    decoder: decode, select, consensus and the decoding options load no model through precision."""
    readers = {p.name for p in sorted((ROOT / "decoding").rglob("*.py")) if "precision_probe" in _imports(p)}
    assert readers == {"sample.py"}, readers
    assert "precision" in _imports(ROOT / "decoding" / "sample.py")  # its autocast: the leaf

def _env() -> dict:
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env


def _workspace_with_one_artifact(tmp_path: Path) -> Path:
    art = tmp_path / "runs" / "data" / "toy-v1"
    art.mkdir(parents=True)
    (art / "vocab.json").write_text(json.dumps({"words": ["a"]}))
    write_manifest(art, "rdpp.data", {"source": "test", "backbone": "pixstats"}, summary={"images": 3})
    return tmp_path / "runs"


HEAVY = ("torch", "pandas", "matplotlib")  # each takes 0.3-2 s to import


@pytest.mark.integration
def test_help_and_ls_load_no_torch(tmp_path):
    """`rdpp --help`, every command's --help and `rdpp ls` import none of torch, pandas, matplotlib
    (lazy imports in the CLI modules), so they answer at once."""
    ws = _workspace_with_one_artifact(tmp_path)
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from rdpp_cli.cli.app import app\n"
        "run = CliRunner().invoke\n"
        "r = run(app, ['--help']); assert r.exit_code == 0, r.output\n"
        "for cmd in ('prepro', 'train-xe', 'finetune', 'sample', 'score', 'caption', 'plot', 'table', 'demo', 'ls'):\n"
        "    r = run(app, [cmd, '--help']); assert r.exit_code == 0, (cmd, r.output)\n"
        "r = run(app, ['ls', '--workspace', sys.argv[1]]); assert r.exit_code == 0, r.output\n"
        "assert 'data/toy-v1' in r.output, r.output\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(ws)], env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


@pytest.mark.integration
def test_console_script_help_and_ls_import_no_torch(tmp_path):
    """The installed `rdpp` itself: Python's import log (-X importtime) of `rdpp --help` and
    `rdpp ls` names no torch module."""
    ws = _workspace_with_one_artifact(tmp_path)
    rdpp = os.path.join(os.path.dirname(sys.executable), "rdpp")
    for args in (["--help"], ["ls", "--workspace", str(ws)]):
        r = subprocess.run([rdpp, *args], env={**_env(), "PYTHONPROFILEIMPORTTIME": "1"}, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        imported = {ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")}
        assert "typer" in imported  # the log is there
        assert not {m for m in imported if m.split(".")[0] in HEAVY}, args
    assert "toy-v1" in r.stdout


@pytest.mark.unit
def test_sample_method_help_names_exactly_the_decoders_methods():
    """cli/sample.py spells the methods out (importing them would import torch): the list must
    stay the decoder's."""
    import typer

    from rdpp_cli.cli.app import app

    sample = typer.main.get_command(app).commands["sample"]
    help_ = next(p for p in sample.params if p.name == "method").help
    assert help_.removeprefix("One of: ").removesuffix(".").split(", ") == list(METHODS)


@pytest.mark.unit
def test_architecture_doc_lists_every_module_where_it_is():
    """docs/architecture.md's module map names every module of rdpp_cli under its own package (and
    the layer list every package)."""
    import re

    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    start = doc.index("```\nrdpp_cli/")
    tree = doc[start:doc.index("```", start + 3)]
    sections: dict[str, str] = {}  # "data/", "cider/", ...: the text of that entry of the map
    key = None
    for line in tree.splitlines()[2:]:
        m = re.match(r"^ {2,4}([a-z_0-9]+/)", line)
        if m:
            key = m.group(1)
        elif re.match(r"^ {2,4}[a-z_]", line):
            key = None
        if key:
            sections[key] = sections.get(key, "") + line + "\n"
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if path.stem == "__init__" and len(rel.parts) > 1:
            continue
        where = sections.get(rel.parts[-2] + "/", "") if len(rel.parts) > 1 else tree
        if not re.search(rf"\b{path.stem}\b", where):
            missing.append(str(rel))
    assert not missing, f"modules missing from (or misplaced in) docs/architecture.md's map: {missing}"
    assert "### Layers" in doc
    layers = doc[doc.index("### Layers"):]
    assert all(f"`{pkg}`" in layers for pkg in RANK), "a package of LAYERS is missing from the doc's layer list"


# -- no import circle; models and rewards are tables, not branches ---------------------------------

def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The rdpp_cli modules a file imports (top level or inside functions; not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return out & modules


def import_cycles(root: Path) -> list[list[str]]:
    """The import circles among the modules under ``root`` (strongly connected components of the
    graph of explicit imports, with more than one module)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {m: _module_imports(p, set(files)) - {m} for m, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = [stack.pop()]
            while comp[-1] != v:
                comp.append(stack.pop())
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


@pytest.mark.unit
def test_no_import_circle_between_modules():
    assert import_cycles(ROOT) == []


@pytest.mark.unit
def test_the_circle_check_finds_a_circle(tmp_path):
    pkg = tmp_path / "rdpp_cli"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "x.py").write_text("from rdpp_cli.a.y import f\n")
    (pkg / "a" / "y.py").write_text("def f():\n    from rdpp_cli.a import x\n")
    (pkg / "a" / "__init__.py").write_text("")
    assert import_cycles(pkg) == [["rdpp_cli.a.x", "rdpp_cli.a.y"]]  # a function-level import counts too
    (pkg / "a" / "y.py").write_text("def f():\n    pass\n")
    assert import_cycles(pkg) == []


# The words of a --select method, a run's artifact stem or a table's label may equal a reward's name;
# those modules compare them as what they are there
_NOT_REWARDS = {"decoding/select.py", "decoding/options.py", "reporting/selection.py", "reporting/sweeps.py"}


def _branch_words(path: Path) -> set[str]:
    """String constants compared (==, !=, in, not in) in ``path``."""
    words = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            for side in [node.left, *node.comparators]:
                elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                words |= {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return words


@pytest.mark.unit
def test_no_module_outside_the_tables_branches_on_a_model_or_reward_name():
    from rdpp_cli.models.registry import MODELS
    from rdpp_cli.training.reward_table import REWARDS

    models = set(MODELS) | {s.cls.__name__ for s in MODELS.values()}
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel.startswith("models/") or rel == "training/reward_table.py":
            continue
        hits = _branch_words(path) & (models | (set() if rel in _NOT_REWARDS else set(REWARDS)))
        if hits:
            wrong.append(f"{rel}: {sorted(hits)}")
    assert not wrong, "branches on a model or reward name outside models/ and reward_table.py:\n" + "\n".join(wrong)
