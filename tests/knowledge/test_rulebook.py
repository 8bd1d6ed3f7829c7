"""The rules as knowledge runs them (knowledge/rulebook.py): matching's loader with the named
checks, and the built-in rules parsed once per process."""

from __future__ import annotations

from vllm_doctor.knowledge import rulebook
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching import loader


def test_a_kind_of_the_builtin_rules_is_a_filter_of_the_one_load(monkeypatch):
    monkeypatch.setattr(rulebook, "_BUILTIN", {})
    calls = []
    real = loader.load
    monkeypatch.setattr(loader, "load", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    everything = rulebook.builtin()
    logs = rulebook.builtin(rulebook.LOG_KINDS)
    assert rulebook.builtin() is everything and rulebook.builtin(rulebook.LOG_KINDS) is logs
    assert len(calls) == 1  # serve's preflight, watch and incident share it
    assert logs == real(checks=CHECKS, kinds=set(rulebook.LOG_KINDS))  # the same rules, in the same order
    assert {r.kind for r in everything} > {r.kind for r in logs}


def test_a_rule_naming_a_check_that_is_not_declared_is_refused(tmp_path):
    import pytest

    from vllm_doctor.matching.problems import RuleError

    (tmp_path / "my-rule.toml").write_text(
        'id = "my-rule"\ntitle = "t"\nexplanation = "e"\ncategory = "cache-oom"\nseverity = "info"\n'
        'confidence = "low"\nsummary = "s"\nanchors = ["happened"]\nchecks = ["no_such_check"]\n'
        '[[patterns]]\nregex = "it happened"\n'
    )
    with pytest.raises(RuleError, match="no_such_check"):
        rulebook.load([tmp_path], kinds=rulebook.LOG_KINDS)
    assert loader.load([tmp_path], builtin=False, checks={"no_such_check": CHECKS["kv_fit"]})
