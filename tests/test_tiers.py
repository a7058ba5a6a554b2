"""Every test carries exactly one tier, ``unit`` or ``integration`` (a module ``pytestmark`` or a
decorator), and no unit test is ``slow``: ``pytest -m unit`` is the quick run of pure code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).parent
TIERS = {"unit", "integration"}


def _marks(node: ast.expr | None) -> set[str]:
    """The names X of every ``pytest.mark.X`` (called or not) in an expression."""
    if node is None:
        return set()
    return {n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def tiers(source: str) -> dict[str, set[str]]:
    """Each test function of a test module's source and the markers it carries (its module's and its own)."""
    tree = ast.parse(source)
    module = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            module |= _marks(node.value)
    tests = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            tests[node.name] = module | set().union(*(_marks(d) for d in node.decorator_list))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            cls = module | set().union(*(_marks(d) for d in node.decorator_list))
            for f in node.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test_"):
                    tests[f"{node.name}::{f.name}"] = cls | set().union(*(_marks(d) for d in f.decorator_list))
    return tests


def test_the_check_sees_module_marks_and_decorators():
    src = '''
import pytest
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

@pytest.mark.slow
@pytest.mark.parametrize("x", [1])
def test_a(x): pass

def helper(): pass
'''
    assert tiers(src) == {"test_a": {"integration", "usefixtures", "slow", "parametrize"}}
    src = "import pytest\n\n@pytest.mark.unit\ndef test_b(): pass\n\ndef test_c(): pass\n"
    assert tiers(src) == {"test_b": {"unit"}, "test_c": set()}


def test_every_test_is_unit_or_integration_and_no_unit_test_is_slow():
    wrong = []
    for path in sorted(TESTS.glob("test_*.py")):
        for name, marks in tiers(path.read_text()).items():
            if len(marks & TIERS) != 1:
                wrong.append(f"{path.name}::{name} carries {sorted(marks & TIERS) or 'no tier'}")
            elif {"unit", "slow"} <= marks:
                wrong.append(f"{path.name}::{name} is unit and slow")
    assert not wrong, "mark each test unit or integration (see pyproject.toml):\n" + "\n".join(wrong)
