"""A rule's documentation, generated from its file, and the on-demand rule check."""

from __future__ import annotations

from pathlib import Path

from vllm_doctor.data import Rule
from vllm_doctor.matching.contract import Checks, rule_groups
from vllm_doctor.matching.loader import check_file, compile_regex, rule_files

# the rule of the house for categories (README "Categories"), shown with every diagnosis rule
TAXONOMY = (
    "A category names one cause, and every fix of it moves the numbers the right way for that cause "
    "(an OOM of the weights, of a too-small cache and beside a sized cache are three categories)."
)


def document(rule: Rule, checks: Checks) -> str:
    out = [f"{rule.id}: {rule.title}", ""]
    if rule.kind != "fact":
        out.append(f"category {rule.category} · severity {rule.severity} · confidence {rule.confidence}")
        if rule.kind == "preflight":
            out.append(f"preflight finding (`vllm-doctor check`), at startup stage {rule.priority}")
        out.append(TAXONOMY)
    else:
        out.append("fact rule: fills facts, reports nothing by itself")
    out += ["", "What it means", "", _indent(rule.explanation), ""]
    if rule.patterns:
        out += ["What it matches", ""]
        for p in rule.patterns:
            span = _span(p.since, p.until)
            out.append(f"  - {p.regex}")
            details = [
                x for x in (span, f"from {p.source}" if p.source else "", f"{p.level} lines" if p.level else "") if x
            ]
            if details:
                out.append(f"    ({'; '.join(details)})")
            if p.example:
                out.append(f"    e.g. {p.example}")
        out.append("")
    if rule.facts:
        out += ["Facts it fills", ""] + [f"  - {g} -> {f}" for g, f in rule.facts.items()] + [""]
    if rule.checks or rule.when:
        out += ["Checks", ""]
        out += [f"  - {c}" for c in rule.checks]
        if rule.when:
            out.append(f"  - fires when: {rule.when}")
        out.append("")
    if rule.kind == "diagnosis":
        out += numbers(rule, checks)
    if rule.names:
        out += ["Numbers its check gives", "", "  " + ", ".join(rule.names), ""]
    if rule.fixes:
        out += ["Fixes, in order", ""]
        for i, f in enumerate(rule.fixes, 1):
            cond = f"  [when {f.when}]" if f.when else ""
            out.append(f"  {i}. {f.action}{cond}")
            out.append(f"     {f.why}")
            for action, why, _value in f.fallbacks:
                out.append(f"     else: {action}" + (f" ({why})" if why != f.why else ""))
        out.append("")
    if rule.references:
        out += ["References", ""] + [f"  - {r}" for r in rule.references] + [""]
    out.append(f"Defined in {rule.path}")
    return "\n".join(out)


def show(rules: list[Rule], name: str, checks: Checks) -> str:
    """`rules show NAME`: the rule's documentation, or the rules of the category NAME; for a name
    that is neither, a DoctorError that offers the close ids and categories."""
    import difflib

    from vllm_doctor.errors import DoctorError

    by_id = {r.id: r for r in rules}
    if name in by_id:
        return document(by_id[name], checks)
    members = sorted((r for r in rules if r.category == name), key=lambda r: (-SEVERITY_ORDER[r.severity], r.id))
    if members:
        lines = [f"{name}: {len(members)} rule(s); `vllm-doctor rules show ID` documents one", ""]
        return "\n".join(lines + [f"  {r.id:48} {r.severity:8} {r.title}" for r in members])
    known = list(by_id) + sorted({r.category for r in rules if r.category})
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    close += [k for k in known if name in k and k not in close][: 5 - len(close)]  # cache-oom -> its rules
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise DoctorError(f"no rule or category {name!r}{hint} (`vllm-doctor rules` lists them)")


SEVERITY_ORDER = {"blocker": 2, "warning": 1, "info": 0}


def numbers(rule: Rule, checks: Checks) -> list[str]:
    """The names the rule's summary, fixes and conditions can use (matching/contract.py)."""
    from vllm_doctor.facts import FACTS, STATS_PREFIX, stats_names

    out = ["Numbers it can use", ""]
    groups = sorted(rule_groups(rule))
    if groups:
        out += _wrapped("  groups: ", [f"{g} (-> {rule.facts[g]})" if g in rule.facts else g for g in groups])
    for name in rule.checks:
        c = checks.get(name)
        if c is None:
            continue
        out += _wrapped(f"  {name} returns: ", sorted(c.returns))
        if c.reads & set(groups):
            out += _wrapped("    reads this rule's groups: ", sorted(c.reads & set(groups)))
        if c.reads - set(groups) - set(FACTS):
            out += _wrapped("    reads these groups when a rule has them: ", sorted(c.reads - set(groups) - set(FACTS)))
    out += _wrapped("  facts: ", sorted(FACTS))
    stats = sorted(n[len(STATS_PREFIX) :] for n in stats_names())
    out += _wrapped(f"  {STATS_PREFIX}<aggregate>: ", stats)
    return [*out, ""]


def _wrapped(head: str, names: list[str], width: int = 100) -> list[str]:
    lines, line = [], head
    for i, n in enumerate(names):
        piece = n + (", " if i < len(names) - 1 else "")
        if len(line) + len(piece) > width and line.strip():
            lines.append(line.rstrip())
            line = " " * 6 + piece
        else:
            line += piece
    lines.append(line)
    return lines


def _span(since: str | None, until: str | None) -> str:
    if since and until:
        return f"vLLM {since} to before {until}"
    if since:
        return f"vLLM {since} and later"
    if until:
        return f"vLLM before {until}"
    return ""


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else "" for line in text.strip().splitlines())


def problems_in(rule: Rule) -> list[str]:
    """What loading does not catch: examples that their own pattern does not match, or that its
    `unless` voids, and counter-examples a pattern matches. Nothing is timed: every pattern is
    in RE2's linear-time subset (loading checks that), whatever the machine's load."""
    out = []
    for i, p in enumerate(rule.patterns):
        if p.example is not None:
            if not compile_regex(p.regex).search(p.example):
                out.append(f"{rule.path}: key 'patterns[{i}].example': the pattern does not match its own example")
            elif p.unless and compile_regex(p.unless).search(p.example):
                out.append(f"{rule.path}: key 'patterns[{i}].unless': voids the pattern's own example")
        for k, text in enumerate(p.counter_examples):
            hit = _matching_pattern(rule, text)
            if hit is not None:
                which = "this pattern" if hit == i else f"patterns[{hit}]"
                out.append(f"{rule.path}: key 'patterns[{i}].counter_example[{k}]': {which} matches it (it must not)")
    return out


def _matching_pattern(rule: Rule, text: str) -> int | None:
    """The first of the rule's patterns that matches a text as the engine would (not voided by
    its `unless`), or None."""
    for j, p in enumerate(rule.patterns):
        if compile_regex(p.regex).search(text) and not (p.unless and compile_regex(p.unless).search(text)):
            return j
    return None


def check_dir(directory: Path, checks: Checks) -> tuple[list[str], int]:
    """Every problem in every rule file of a directory, and how many files were read."""
    if not directory.is_dir():
        return [f"{directory}: not a directory of rule files"], 0
    problems: list[str] = []
    seen: dict[str, str] = {}
    files = rule_files(directory)
    for path in files:
        rule, found = check_file(path, checks)
        problems += [str(e) for e in found]
        if rule is None:
            continue
        if rule.id in seen:
            problems.append(f"{path}: key 'id': {rule.id!r} is also defined in {seen[rule.id]}")
        seen[rule.id] = str(path)
        problems += problems_in(rule)
    return problems, len(files)
