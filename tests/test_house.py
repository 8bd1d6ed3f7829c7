"""The house rules a newcomer relies on: the map in CONTRIBUTING.md is the tree, and modules
and functions stay small enough to read."""

from __future__ import annotations

import ast
import re

import pytest

from conftest import ROOT

PACKAGE = ROOT / "src" / "vllm_doctor"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def _map_entries() -> set[str]:
    """The module paths in CONTRIBUTING.md's folder map (the ```text block under 'The map'):
    `src/vllm_doctor/` first, its modules and folders two spaces in, a folder's modules four."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    block = text.split("## The map", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    entries, folder = set(), ""
    for line in block.splitlines():
        m = re.match(r"^( +)(\w+/|\w+\.py)(?:\s|$)", line)
        if not m:
            continue
        depth, name = len(m.group(1)) // 2, m.group(2)
        if name.endswith("/"):
            folder = name
        elif depth == 1:
            folder = ""
            entries.add(name)
        else:
            entries.add(folder + name)
    return entries


def test_the_folder_map_in_contributing_is_the_tree():
    mapped = _map_entries()
    assert mapped == set(MODULES), (
        f"in the tree, not in CONTRIBUTING.md: {sorted(set(MODULES) - mapped)}; "
        f"in CONTRIBUTING.md, not in the tree: {sorted(mapped - set(MODULES))}"
    )


@pytest.mark.parametrize("module", MODULES)
def test_modules_and_functions_stay_small(module):
    path = PACKAGE / module
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines (split it by job)"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            size = node.end_lineno - node.lineno + 1
            assert size <= MAX_FUNCTION_LINES, f"{module}:{node.lineno} {node.name}() is {size} lines"


def test_every_stage_folder_says_what_it_owns_and_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "import" in doc and len(doc) > 200, f"{init.relative_to(ROOT)}: say what it owns and may import"


MAX_TOP_MODULES = 8


def test_few_modules_sit_at_the_top_of_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the top of the package, a stage's belong in it: {top}"
