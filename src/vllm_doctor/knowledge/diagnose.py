"""Turn matches and facts into ranked diagnoses: the cause first, wrappers as its context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from vllm_doctor.data import SEVERITIES, Diagnosis, Fix, FixOut, Match, Rule
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge import fixcheck
from vllm_doctor.knowledge.checks import CHECKS, CheckInput, CheckResult, Options
from vllm_doctor.knowledge.startask import figures
from vllm_doctor.knowledge.tracebacks import LifePhases
from vllm_doctor.matching import expr

_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


def diagnose(
    rules: list[Rule], matches: dict[str, Match], facts: Facts, options: Options | None = None
) -> list[Diagnosis]:
    options = options or Options()
    base = facts.flat()
    found: list[Diagnosis] = []
    # the fallbacks last, and only where no cause is found: rank() would drop them beside a blocker
    # cause anyway, and naming a failure from vLLM's source (the atlas) loads megabytes
    for fallbacks in (False, True):
        if fallbacks and any(d.severity == "blocker" and not d.wrapper for d in found):
            break
        for rule in rules:
            if rule.kind != "diagnosis" or bool(rule.fallback) != fallbacks:
                continue
            match = matches.get(rule.id)
            if rule.patterns and match is None:
                continue
            d = _build(rule, match, base, facts, options)
            if d is not None:
                found.append(d)
    return reconcile(rank(found))


_OPPOSITE = {"raise": "lower", "lower": "raise"}


def reconcile(diagnoses: list[Diagnosis]) -> list[Diagnosis]:
    """One direction per flag in a report: a fix that lowers what a higher-ranked diagnosis's fix
    raises (or the reverse) is dropped, with the reason, so the report never says both."""
    said: dict[str, tuple[str, str]] = {}  # flag -> (direction, the rule that said it first)
    for d in diagnoses:  # one rule's own fixes are its ordered alternatives (TP 2, or TP 4 with the GPUs)
        kept = []
        for f in d.fixes:
            first = said.get(f.flag or "")
            if first and first[1] != d.rule and f.direction == _OPPOSITE.get(first[0]):
                why = f"{first[1]} ranks first and says {first[0]} {f.flag}: one direction is kept"
                d.dropped.append((f.action, why))
                continue
            kept.append(f)
        for f in kept:
            if f.flag and f.direction in _OPPOSITE:
                said.setdefault(f.flag, (f.direction, d.rule))
        d.fixes = [replace(f, rank=i + 1) for i, f in enumerate(kept)]
    return diagnoses


def _build(rule: Rule, match: Match | None, base: dict, facts: Facts, options: Options) -> Diagnosis | None:
    groups = dict(match.groups) if match else {}
    values: dict[str, Any] = {**base, **groups}
    computed: dict[str, Any] = {}
    evidence = list(match.evidence) if match else []
    confidence = rule.confidence
    for name in rule.checks:
        try:
            result = CHECKS[name](CheckInput(values, facts, match, options))
        except (ArithmeticError, ValueError, TypeError):  # numbers a damaged log made absurd
            result = CheckResult()
        evidence = evidence or result.evidence
        if result.confidence:
            confidence = _lower(confidence, result.confidence)
        computed.update(result.values)
        values.update(result.values)
    if rule.when and not expr.Condition(rule.when)(values):
        return None
    summary = next((s for s in (expr.render(t, values) for t in rule.summary) if s is not None), rule.title)
    severity = rule.severity
    if severity == "blocker" and match is not None and _got_past(match, facts):
        # the lifetime became ready or served after this line: not what ended it, a note of what it means
        severity = "info"
        note = next((s for s in (expr.render(t, values) for t in rule.survived) if s is not None), None)
        summary = note or f"{summary} The server got past it: it became ready or served after line {match.first_line}."
        rule = replace(rule, fixes=[])  # its fixes are for the failure it names, which did not happen
    fixes: list[FixOut] = []
    used: set[str] = set()
    dropped: list[tuple[str, str]] = []

    def held(fix: Fix, action: str, value: str | None) -> bool:  # the one check every rule's fixes pass (fixcheck)
        why = fixcheck.refuse(fix.flag, fix.direction, value, values, category=rule.category or "",
                              shape=options.shape, target_len=options.target_len)  # fmt: skip
        if why:
            dropped.append((action, why))
        return why is None

    for fix in rule.fixes:
        if fix.when and not expr.Condition(fix.when)(values):
            continue
        rendered = render_fix(fix, values, held)
        if rendered is None:
            continue  # no variant of the fix has all its numbers known, or the numbers refuse them
        (action, why, value), names = rendered
        used |= names
        checked = figures(fix.flag, value, values, options.shape)  # the command with it, asked again
        why = f"{why} {checked}" if checked else why
        fixes.append(FixOut(len(fixes) + 1, action, fix.flag, value, why, fix.direction))
    for t in rule.summary:
        if expr.render(t, values) is not None:
            used |= expr.template_names(t)
            break
    numbers = {**groups, **computed}
    for name in sorted(used):
        if name not in numbers and values.get(name) is not None:
            numbers[name] = values[name]
    return Diagnosis(
        rule=rule.id,
        category=rule.category or "",
        severity=severity,
        confidence=confidence,
        title=rule.title,
        summary=summary,
        explanation=rule.explanation,
        evidence=evidence,
        numbers=numbers,
        fixes=fixes,
        dropped=dropped,
        priority=rule.priority,
        wrapper=rule.wrapper,
        fallback=rule.fallback,
        first_line=match.first_line if match else (evidence[0].line if evidence else 0),
    )


def _got_past(match: Match, facts: Facts) -> bool:
    """Whether the lifetime printed stats, or became ready (a placed ready line), after the line the rule matched."""
    source = match.evidence[0].source if match.evidence else 0
    return LifePhases(facts).served_after(match.first_line, source)


def render_fix(
    fix: Fix, values: dict[str, Any], held: Callable[[Fix, str, str | None], bool] | None = None
) -> tuple[tuple[str, str, str | None], set[str]] | None:
    """The first variant of a fix whose names are all known (and that `held` accepts), rendered,
    and the names its action and why used; None when no variant is left."""
    for action_t, why_t, value_t in fix.variants():
        action, why = expr.render(action_t, values), expr.render(why_t, values)
        value = expr.render(value_t, values) if value_t else None
        if action is None or why is None or (value_t and value is None):
            continue
        if held is not None and not held(fix, action, value):
            continue
        return (action, why, value), expr.template_names(action_t) | expr.template_names(why_t)
    return None


def _explained(fallback: Diagnosis, others: list[Diagnosis]) -> bool:
    lines = {(e.line, e.source) for e in fallback.evidence}  # the failure's line and the frame that raised it
    for d in others:
        if (d.severity == "blocker" and not d.wrapper) or any((e.line, e.source) in lines for e in d.evidence):
            return True
    return False


def _lower(a: str, b: str) -> str:
    order = ("high", "medium", "low")
    return order[max(order.index(a), order.index(b))]


def _key(d: Diagnosis):
    return (_SEVERITY_RANK[d.severity], -d.priority, d.first_line)


def rank(found: list[Diagnosis]) -> list[Diagnosis]:
    """Most important first; a wrapper error yields to any real cause and becomes its context. A
    fallback (the unrecognised failure) is dropped when another rule explains the failure: a
    blocker that is a cause (not a wrapper), or a rule that matched the failure's own line or the
    frame that raised it."""
    fallbacks = [d for d in found if d.fallback]
    if fallbacks:
        found = [d for d in found if not d.fallback]
        for fb in fallbacks:
            if not _explained(fb, found):
                found.append(fb)
    wrappers = [d for d in found if d.wrapper]
    causes = sorted((d for d in found if not d.wrapper), key=_key)
    if causes and causes[0].severity == "blocker" and wrappers:
        for w in wrappers:
            causes[0].context.extend(w.evidence[:2])
        return causes
    return sorted(found, key=_key)
