"""What a check says: findings or why it could not run. A finding's texts are data: the check
computes the numbers and names the rule (rules/preflight/<id>.toml, kind "preflight"), whose
category, severity, title, summary and fixes are rendered from them as a diagnosis rule's are."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from vllm_doctor.data import Rule


class CannotRun(Exception):
    """The check cannot decide here; the message says why in one line and the other checks go on."""


@dataclass
class Fix:
    action: str
    why: str
    flag: str | None = None
    value: str | None = None


@dataclass
class Finding:
    category: str  # explain's category for the failure this start would have (cache-oom, port-in-use, ...)
    severity: str  # blocker | warning | info
    title: str
    summary: str  # the numbers behind it, in a sentence
    numbers: dict[str, Any] = field(default_factory=dict)
    fixes: list[Fix] = field(default_factory=list)
    confidence: str = "high"
    check: str = ""  # the check's name, set by the runner
    priority: int = 40  # when in the start it would fail: the rule's priority, the earliest highest
    rule: str = ""  # the rule it was rendered from


@functools.cache
def rules() -> dict[str, Rule]:
    """The preflight rules by id (the built-in rules' one load: knowledge/rulebook.py)."""
    from vllm_doctor.knowledge.rulebook import builtin

    return {r.id: r for r in builtin() if r.kind == "preflight"}


def found(rule_id: str, numbers: dict[str, Any] | None = None, **words: Any) -> Finding:
    """The finding of rule `rule_id`, rendered from `numbers` (reported) and `words` (texts and
    values only the templates use). A summary that cannot be rendered is a bug of the check."""
    from vllm_doctor.knowledge.diagnose import render_fix  # a diagnosis's fixes, rendered the one way
    from vllm_doctor.matching import expr

    rule = rules()[rule_id]
    values = {**(numbers or {}), **words}
    summary = next((s for s in (expr.render(t, values) for t in rule.summary) if s is not None), None)
    if summary is None:
        raise ValueError(f"rule {rule_id}: no summary renders from {sorted(values)}")
    fixes = []
    for fix in rule.fixes:
        if fix.when and not expr.Condition(fix.when)(values):
            continue
        rendered = render_fix(fix, values)
        if rendered is not None:
            (action, why, value), _ = rendered
            fixes.append(Fix(action, why, fix.flag, value or None))
    return Finding(rule.category or "", rule.severity, rule.title, summary, dict(numbers or {}), fixes,
                   rule.confidence, priority=rule.priority, rule=rule_id)  # fmt: skip
