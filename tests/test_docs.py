"""The documentation stands on its own, and there is one version number.

- Nothing in the repository names the design note its authors worked from (a file a user's clone
  does not have), and nothing points into the sibling folder ``../shared`` as a source of
  definitions: only its data, weights and peer code may be named (tests and benchmarks use them,
  and skip where they are absent). The definitions live in docs/ (docs/metrics.md,
  docs/rewards.md, docs/workspace.md, docs/data.md).
- Every relative link of README.md, CHANGELOG.md, benchmarks/README.md and docs/*.md leads to a
  file that exists, and every ``#anchor`` to a heading of the page it names.
- CHANGELOG.md's newest release is ``rdpp_cli.__version__``, which pyproject.toml reads, and
  docs/workspace.md's schema table is the one ``artifacts.manifest`` writes and reads.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import rdpp_cli
from rdpp_cli.artifacts import manifest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
# spelled in two parts so that this file does not hold the word it looks for
NOTE = "DES" + "IGN"
SHARED_OK = ("data", "weights", "peers")  # what of ../shared a test or a benchmark may name
SHARED_REF = re.compile(r"\bshared/([A-Za-z0-9_.-]+)")
TEXT = {".py", ".md", ".sh", ".toml", ".txt", ".yaml", ".yml", ".cfg", ".ini"}
SKIP_DIRS = {".git", ".venv", "__pycache__", "runs", "build", "dist", ".pytest_cache"}
PAGES = ["README.md", "CHANGELOG.md", "benchmarks/README.md", *sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


def _text_files() -> list[Path]:
    out = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if p.is_file() and p.suffix in TEXT:
            out.append(p)
    return sorted(out)


def test_the_repository_text_is_found():
    names = {p.relative_to(ROOT).as_posix() for p in _text_files()}
    assert {"README.md", "docs/metrics.md", "rdpp_cli/cli/score.py", "tests/test_docs.py"} <= names


def offending_lines(text: str) -> list[str]:
    """Lines that name the design note, or anything of ../shared but its data, weights and peers."""
    return [line.strip() for line in text.splitlines()
            if NOTE in line or any(m.group(1) not in SHARED_OK for m in SHARED_REF.finditer(line))]


def test_no_file_refers_to_the_design_note_or_into_shared():
    hits = [f"{p.relative_to(ROOT)}: {line}" for p in _text_files()
            for line in offending_lines(p.read_text(encoding="utf-8", errors="replace"))]
    assert not hits, ("../shared is not in a user's clone: point to the docs/ page that defines it "
                      "instead:\n" + "\n".join(hits))


def test_the_check_refuses_what_it_should_and_only_that():
    shared = "../" + "shared/"
    bad = [f"(see {NOTE} §4)", f"{shared}{NOTE}.md", f"{shared}paper/rdpp.tex", f"{shared}notes/x.md"]
    good = [f"{shared}data/coco-real-390", f"{shared}weights/m.pth", f"{shared}peers/sc", "the design"]
    assert offending_lines("\n".join(bad + good)) == bad


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _without_code_blocks(page.read_text()), re.M):
        s = slug(heading)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def links(page: Path) -> list[str]:
    text = _without_code_blocks(page.read_text())
    text = re.sub(r"`[^`\n]*`", "code", text)  # a link's text may be code; a code span is not a link
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


def test_slug_follows_github():
    assert slug("Choosing a set: `--select` (the DPP at inference)") == "choosing-a-set---select-the-dpp-at-inference"
    assert slug("Data artifact (`kind: rdpp.data`)") == "data-artifact-kind-rdppdata"
    assert slug("Real photos (CPU, about 1.5 hours)") == "real-photos-cpu-about-15-hours"


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_leads_somewhere(page):
    src = ROOT / page
    broken = []
    for target in links(src):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (src.parent / path).resolve() if path else src
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page}:\n" + "\n".join(broken)


def test_every_docs_page_named_in_code_tests_and_help_exists_with_its_anchor():
    """Code, tests, benchmarks and examples point to definitions as ``docs/<page>.md#<anchor>``."""
    ref = re.compile(r"\bdocs/([A-Za-z0-9_-]+\.md)(?:#([\w-]+))?")
    broken = []
    for p in _text_files():
        for page, anchor in ref.findall(p.read_text(encoding="utf-8", errors="replace")):
            dest = ROOT / "docs" / page
            if not dest.exists() or (anchor and anchor not in anchors(dest)):
                broken.append(f"{p.relative_to(ROOT)}: docs/{page}" + (f"#{anchor}" if anchor else ""))
    assert not broken, "\n".join(sorted(set(broken)))


def test_the_link_check_finds_a_broken_link_and_a_wrong_anchor(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# A page\n\n## Two words\n\n[ok](#two-words) [`b`](b.md) [x](#three) ![i](img.png)\n"
                    "```\n[not a link](nowhere.md)\n```\n")
    assert links(page) == ["#two-words", "b.md", "#three", "img.png"]
    assert anchors(page) == {"a-page", "two-words"}


def _releases(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", text, re.M)


def test_the_changelog_newest_release_is_the_package_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = _releases(text)
    assert releases and releases[0][0] == rdpp_cli.__version__, (releases[:1], rdpp_cli.__version__)
    numbers = [tuple(map(int, v.split("."))) for v, _ in releases]
    assert numbers == sorted(numbers, reverse=True) and len(set(numbers)) == len(numbers)
    assert [d for _, d in releases] == sorted((d for _, d in releases), reverse=True)
    assert text.index("## [Unreleased]") < text.index(f"## [{releases[0][0]}]")
    # Keep a Changelog: every release says what was added, changed and fixed
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for sec in sections:
        assert all(f"\n### {kind}\n" in sec for kind in ("Added", "Changed", "Fixed")), sec.splitlines()[0]


def test_pyproject_takes_its_version_from_the_package():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in py["project"] and "version" in py["project"]["dynamic"]
    assert py["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rdpp_cli.__version__"}


def test_workspace_doc_lists_the_schemas_the_code_writes_and_reads():
    text = (ROOT / "docs" / "workspace.md").read_text()
    rows = re.findall(r"^\| ((?:`rdpp\.\w+`(?:, )?)+) \| (\d+) \| ([\d, ]+) \|", text, re.M)
    documented = {}
    for kinds, written, read in rows:
        for kind in re.findall(r"`(rdpp\.\w+)`", kinds):
            documented[kind] = (int(written), [int(x) for x in read.split(",")])
    assert documented == {k: (manifest.SCHEMAS[k], list(range(manifest.OLDEST_READ[k], manifest.SCHEMAS[k] + 1)))
                          for k in manifest.SCHEMAS}


# -- the recipe tables of docs/training.md are the registry's (rdpp_cli/models/registry.py) ------------------

def _num(v: float) -> str:
    """A setting as the tables write it: 5e-4, 0.999, 1e-8, 30, 1."""
    if v == int(v) and abs(v) >= 1:
        return str(int(v))
    return re.sub(r"e-0*", "e-", f"{v:.0e}") if abs(v) < 1e-2 else f"{v:g}"


def _schedule(r: dict) -> str:
    if r["lr_schedule"] == "noam":
        return f"noam, {r['warmup']} warm-up steps"
    if r["lr_schedule"] == "plateau":
        return "plateau"
    if r["lr_decay_every"] <= 0:
        return "step, no decay"
    return f"step, ×{_num(r['lr_decay_rate'])} every {r['lr_decay_every']} epochs"


def recipe_cells(stage: str, r: dict) -> list[str]:
    """The checked cells of a recipe row, from the registry's recipe ``r``."""
    cells = [str(r["epochs"]), str(r["batch_size"]), _num(r["lr"]), _schedule(r)]
    if stage == "train-xe":
        ss = r["ss_start"]
        cells += [f"{_num(r['adam_beta2'])}, {_num(r['adam_eps'])}", "off" if ss < 0 else f"from epoch {ss}"]
    return cells


def doc_table(text: str, title: str) -> dict[str, list[str]]:
    """The table that follows the line starting with ``title``: first cell (code marks dropped) -> cells."""
    lines = text[text.index(title):].splitlines()[1:]
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = {}
    for line in lines[first + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_recipe_cells_render_the_registry_as_the_tables_write_it():
    from rdpp_cli.models.registry import model_spec
    assert recipe_cells("train-xe", model_spec("att2in").recipe("train-xe", "paper")) == [
        "30", "128", "5e-4", "step, ×0.8 every 15 epochs", "0.999, 1e-8", "from epoch 0"]
    assert recipe_cells("finetune", model_spec("transformer").recipe("finetune", "paper")) == [
        "35", "10", "1e-5", "plateau"]
    assert _num(2e-5) == "2e-5" and _num(1.0) == "1" and _num(0.98) == "0.98"


@pytest.mark.parametrize("stage,preset", [("train-xe", "paper"), ("finetune", "paper"),
                                          ("train-xe", "small"), ("finetune", "small")])
def test_the_recipe_tables_of_training_md_are_the_registrys(stage, preset):
    """One source for the recipes: every row of the registry is in its table with every value."""
    from rdpp_cli.models.registry import MODELS
    table = doc_table((ROOT / "docs" / "training.md").read_text(), f"**`{stage} --preset {preset}`**")
    assert set(table) == set(MODELS), f"{stage} --preset {preset}: rows {sorted(table)}, models {sorted(MODELS)}"
    for name, spec in MODELS.items():
        want = recipe_cells(stage, spec.recipe(stage, preset))
        assert table[name][:len(want)] == want, (stage, preset, name, table[name][:len(want)], want)


# -- every speed figure of README.md is its source row's in benchmarks/README.md -----------------------------

SPEED = re.compile(r"(\d[\d,]*(?:\.\d+)?) ?(ms|s|×|x)(?![\w])")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
BENCH_LINK = re.compile(r"\]\(benchmarks/README\.md#([\w-]+)\)")


def section(text: str, anchor: str) -> str:
    """The text under the heading whose GitHub anchor is ``anchor``, to the next heading of its level or above."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#{1,6}) +(.+?) *#*$", line)
        if m and slug(m.group(2)) == anchor:
            level = len(m.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(rf"^#{{1,{level}}} ", lines[j])), len(lines))
            return "\n".join(lines[i:end])
    return ""


def _found(figure: str, numbers: list[str]) -> bool:
    """``figure`` is one of ``numbers`` at the precision it is written with (84 is 84.0; 697 is 697.3)."""
    from decimal import ROUND_HALF_UP, Decimal
    want = Decimal(figure.replace(",", ""))
    step = Decimal(1).scaleb(want.as_tuple().exponent)
    return any(Decimal(n.replace(",", "")).quantize(step, rounding=ROUND_HALF_UP) == want for n in numbers)


def unsourced_speed_figures(readme: str, bench: str) -> list[str]:
    """Speed figures (a number then ms, s, × or x) in the tables of README's "How fast" section that are
    not in the benchmarks/README.md section their row links to (or, for a row without a link, the
    section the paragraph above its table links to)."""
    how = readme[readme.index("## How fast"):]
    how = how[:how.find("\n## ", 1)] if "\n## " in how[1:] else how
    bad, paragraph_source = [], None
    for block in re.split(r"\n\s*\n", how):
        rows = [line for line in block.splitlines() if line.startswith("|") and not line.startswith("|---")][1:]
        if not rows:
            links = BENCH_LINK.findall(block)
            paragraph_source = links[-1] if links else paragraph_source
            continue
        for row in rows:
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            sources = BENCH_LINK.findall(row) or ([paragraph_source] if paragraph_source else [])
            numbers = [n for s in sources for n in NUMBER.findall(section(bench, s))]
            for cell in cells[1:]:
                for figure, unit in SPEED.findall(re.sub(r"\[[^\]]*\]\([^)]*\)", "", cell)):
                    if not _found(figure, numbers):
                        bad.append(f"{cells[0]}: {figure} {unit} not in benchmarks/README.md#{' #'.join(sources) or '(no link)'}")
    return bad


def test_the_speed_check_finds_a_figure_its_source_lacks():
    bench = "# B\n\n## Steps\n\n| a | 41.4 | 697.3 | 4.76× |\n\n## Other\n\n13.3 ms\n"
    good = ("## How fast\n\n| step | t | r |\n|---|---|---|\n"
            "| XE | 41.4 ms, 697 ms | 4.76× [s](benchmarks/README.md#steps) |\n")
    assert unsourced_speed_figures(good, bench) == []
    wrong = good.replace("4.76×", "3.1×").replace("41.4 ms", "13.3 ms")  # 13.3 is in another section
    assert unsourced_speed_figures(wrong, bench) == [
        "XE: 13.3 ms not in benchmarks/README.md#steps", "XE: 3.1 × not in benchmarks/README.md#steps"]
    # a row without a link takes the link of the paragraph above its table
    para = "## How fast\n\nSee [b](benchmarks/README.md#steps).\n\n| step | t |\n|---|---|\n| XE | 41.4 ms |\n| SCST | 9 ms |\n"
    assert unsourced_speed_figures(para, bench) == ["SCST: 9 ms not in benchmarks/README.md#steps"]


def test_every_speed_figure_of_the_readme_is_its_benchmark_rows():
    bad = unsourced_speed_figures((ROOT / "README.md").read_text(), (ROOT / "benchmarks" / "README.md").read_text())
    assert not bad, "README.md's speed figures must be those of their source in benchmarks/README.md:\n" + "\n".join(bad)


# -- the capabilities the stages look up on a model by name are documented beside the Protocol ---------------

LOOKUP = re.compile(r"\b(?:getattr|hasattr)\(\s*(?:unwrap\()?(?:model|net|c)\b(?:\.config)?\)?,\s*\"(\w+)\"")
NOT_CAPABILITIES = {"module", "config"}  # DistributedDataParallel's wrapper; the config itself (in the Protocol)


def looked_up_names(text: str) -> set[str]:
    return set(LOOKUP.findall(text)) - NOT_CAPABILITIES


def test_the_lookup_scan_finds_capabilities_and_only_those():
    code = ('a = getattr(unwrap(model), "supports_fast", False)\nb = hasattr(net, "export")\n'
            'c2 = getattr(model.config, "d_model", None)\nd = getattr(model, "module", model)\n'
            'e = getattr(opts, "hf_model")\n')
    assert looked_up_names(code) == {"supports_fast", "export", "d_model"}


def test_every_model_capability_looked_up_by_name_is_documented_in_models_base():
    """models/base.py's docstring lists every method or config field that code outside the model files
    looks up on a model by name (CONTRIBUTING.md, "A new model", points there)."""
    import rdpp_cli.models.base as base

    model_files = {"att2in.py", "updown.py", "transformer.py", "hf.py"}
    hf_models = {"objective_hf.py"}  # looks up a transformers model's own API (get_encoder), not rdpp's
    found = {}
    for p in sorted((ROOT / "rdpp_cli").rglob("*.py")):
        if p.name not in model_files | hf_models:
            for name in looked_up_names(p.read_text()):
                found.setdefault(name, p.relative_to(ROOT).as_posix())
        if ".from_folder(" in p.read_text() and p.name not in model_files:
            found.setdefault("from_folder", p.relative_to(ROOT).as_posix())
    assert len(found) >= 4, found  # the scan sees the lookups (its own test above pins what it matches)
    missing = [f"{name} (looked up in {where})" for name, where in sorted(found.items())
               if f"``{name}" not in base.__doc__ and f"``config.{name}``" not in base.__doc__]
    assert not missing, "document these in rdpp_cli/models/base.py's docstring:\n" + "\n".join(missing)
