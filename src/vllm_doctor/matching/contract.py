"""The names a rule may use, and the check that it uses no other.

A rule's templates (`{name}` in its summary and fixes) and conditions (`when`, rule and fix
level) read values by name. The names that can ever be known are the rule's own named groups,
the facts (facts.py: FACTS, and `stats.<aggregate>` of the stats series) and what the rule's
checks declare they return. The declarations are handed in (`checks`: knowledge/checks.py's CHECKS,
by knowledge/rulebook.py): matching knows rules, not the checks. A name outside them is a typo that
would silently drop a summary or a fix, so loading refuses it; a phase outside facts.PHASES likewise.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Protocol

from vllm_doctor.data import Rule
from vllm_doctor.facts import PHASES, fact_names
from vllm_doctor.matching import expr


class Declared(Protocol):
    """A named check as a rule sees it (knowledge/contract.py's Check): what it reads and returns."""

    @property
    def reads(self) -> frozenset[str]: ...

    @property
    def returns(self) -> frozenset[str]: ...


Checks = Mapping[str, Declared]  # name -> declaration: the checks a rule may name

_GROUP_NAME = re.compile(r"\(\?P?<([A-Za-z_]\w*)>")


def rule_groups(rule: Rule) -> set[str]:
    """The named groups of a rule's patterns (read from the text, without compiling)."""
    return {name for p in rule.patterns for name in _GROUP_NAME.findall(p.regex)}


def check_returns(rule: Rule, checks: Checks) -> dict[str, frozenset[str]]:
    """What each of the rule's checks declares it returns."""
    return {c: checks[c].returns for c in rule.checks if c in checks}


def known_names(rule: Rule, groups: Iterable[str], checks: Checks) -> set[str]:
    """Every name the rule's templates and conditions may use (a preflight rule: what its check gives)."""
    if rule.kind == "preflight":
        return set(rule.names)
    out = set(groups) | fact_names()
    for returns in check_returns(rule, checks).values():
        out |= returns
    return out


def used_names(rule: Rule) -> list[tuple[str, str, str]]:
    """(key, name, how it is written) for every name the rule's templates and conditions use."""
    out: list[tuple[str, str, str]] = []
    for key, templates in (("summary", rule.summary), ("survived", rule.survived)):
        for t in templates:
            out += [(key, n, f"{{{n}}}") for n in sorted(expr.template_names(t))]
    if rule.when:
        out += [("when", n, repr(n)) for n in sorted(_condition_names(rule.when))]
    for i, fix in enumerate(rule.fixes):
        for action, why, value in fix.variants():
            for k, text in (("action", action), ("why", why), ("value", value or "")):
                out += [(f"fixes[{i}].{k}", n, f"{{{n}}}") for n in sorted(expr.template_names(text))]
        if fix.when:
            out += [(f"fixes[{i}].when", n, repr(n)) for n in sorted(_condition_names(fix.when))]
    return out


def _condition_names(text: str) -> set[str]:
    try:
        return expr.Condition(text).names
    except expr.ExprError:  # reported by the loader as a bad condition
        return set()


def name_problems(rule: Rule, groups: Iterable[str], checks: Checks) -> list[tuple[str, str]]:
    """(key, message) for each name the rule uses that can never be known, and a bad phase."""
    out: list[tuple[str, str]] = []
    if rule.phase is not None and rule.phase not in PHASES:
        out.append(
            ("phase", f"{rule.phase!r} is not a phase ({', '.join(sorted(PHASES))}){_close(rule.phase, PHASES)}")
        )
    if rule.kind == "fact":
        return out
    known = known_names(rule, groups, checks)
    seen: set[tuple[str, str]] = set()
    named = ", ".join(rule.checks) or "none"
    for key, name, written in used_names(rule):
        if name in known or (key, name) in seen:
            continue
        seen.add((key, name))
        what = (
            "in the rule's names"
            if rule.kind == "preflight"
            else f"a named group, a fact or a return of the rule's checks ({named})"
        )
        out.append((key, f"{written} is not {what}{_close(name, known)}"))
    return out


def _close(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
