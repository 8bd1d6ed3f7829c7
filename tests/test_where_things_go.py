"""CONTRIBUTING.md's "Where things go", held: a new output format is one entry of render's
FORMAT_TABLE (its module, names and suffixes follow), a new check one @check function listed in
CHECKS and used by a rule; forgetting the second half fails here, not in a user's hands."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from conftest import LAB, ROOT
from vllm_doctor import knowledge, render
from vllm_doctor.cli.options import Format
from vllm_doctor.cli.output import resolve
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.knowledge.contract import Check

CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")


def test_the_format_choices_are_the_format_table():
    assert tuple(f.value for f in Format) == render.FORMATS == tuple(render.FORMAT_TABLE)
    assert "`FORMAT_TABLE`" in CONTRIBUTING


@pytest.mark.parametrize("fmt", render.FORMATS)
def test_each_format_has_its_module_its_names_and_its_suffixes(fmt, run):
    module = importlib.import_module(f"vllm_doctor.render.{fmt}")  # render/<format>.py
    assert callable(module.render)
    _, aliases, suffixes = render.FORMAT_TABLE[fmt]
    for name in (fmt, *aliases):
        assert resolve(None, name) == (fmt, None)
    for suffix in suffixes:
        assert resolve(None, f"out/report{suffix.upper()}")[0] == fmt
    assert render.render(run(LAB / "cache-oom.log"), fmt).strip()


def _declared_checks() -> dict[str, Check]:
    out = {}
    for info in pkgutil.iter_modules(knowledge.__path__):
        module = importlib.import_module(f"vllm_doctor.knowledge.{info.name}")
        out.update({v.name: v for v in vars(module).values() if isinstance(v, Check)})
    return out


def test_every_check_is_in_checks_and_every_check_is_used_by_a_rule(rules):
    declared = _declared_checks()
    assert sorted(set(declared) - set(CHECKS)) == [], "a @check function not listed in CHECKS"
    assert all(CHECKS[name] is check for name, check in declared.items())
    used = {c for r in rules for c in r.checks}
    assert sorted(set(CHECKS) - used) == [], "a check no rule names"
