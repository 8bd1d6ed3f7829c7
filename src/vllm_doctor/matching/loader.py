"""Load and validate the rule files in rules/ (and any --rules DIR).

A rule is a TOML file named after its id. It is data only: nothing in it runs. Every key is
checked on load, and a bad file gives an error naming the file and the key (RuleError: one line,
the first problem; `.problems` holds every problem of the file, which `rules check` lists). The
names a rule's templates and conditions use are held against the contract (contract.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path

from vllm_doctor.data import CONFIDENCES, FIX_DIRECTIONS, SEVERITIES, Fix, Pattern, Rule
from vllm_doctor.facts import ARGS, FACTS, SERIES_FIELDS
from vllm_doctor.matching import rulecache
from vllm_doctor.matching.contract import Checks, _close, name_problems
from vllm_doctor.matching.literal import needs
from vllm_doctor.matching.problems import Problems as _Problems
from vllm_doctor.matching.problems import RuleError

_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")
MIN_ANCHOR = 4
# bounds on a rule file's prefilter and engine (issue 10): far above the built-ins' 27 anchors of <= 71 chars, 6 patterns
MAX_ANCHOR = 256  # characters in one anchor (hyperscan refuses long literals)
MAX_ANCHORS = 64
MAX_PATTERNS = 32

_RULE_KEYS = {
    "id", "kind", "category", "title", "severity", "confidence", "priority", "wrapper", "fallback", "summary",
    "survived", "explanation", "anchors", "patterns", "facts", "series", "phase", "checks", "when", "fixes",
    "references", "names", "bulk", "replaces",
}  # fmt: skip
_PATTERN_KEYS = {"regex", "since", "until", "source", "level", "unless", "example", "counter_example"}
_FIX_KEYS = {"action", "flag", "value", "when", "why", "direction"}
_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}


def builtin_dir() -> Path:
    """rules/ inside the installed wheel (beside this module), or atop a source checkout."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "rules"
    return packaged if packaged.is_dir() else package.parents[1] / "rules"


TABLES = "tables"  # rules/tables/: the preflight's tables (data, not rules), read by preflight/tables.py


def rule_files(directory: Path) -> list[Path]:
    """Every rule file of a directory: its *.toml, but those under tables/, in order. A walk of
    os.scandir's entries (their types come with the listing: this runs on every start), not
    rglob: a folder that vanishes or turns unreadable during the walk is left out (rglob raised,
    exit 3); a file that vanishes after it is listed is a "cannot read" of that file. A linked
    folder is not followed (as os.walk), a linked file is read."""
    import os

    tables = os.path.join(directory, TABLES)
    found: list[str] = []

    def walk(top: str) -> None:
        try:
            entries = list(os.scandir(top))
        except OSError:
            return
        for e in entries:
            try:
                if e.is_dir():
                    if not e.is_symlink() and e.path != tables:
                        walk(e.path)
                elif e.name.endswith(".toml") and e.is_file():
                    found.append(e.path)
            except OSError:
                continue

    walk(os.fspath(directory))
    return [Path(p) for p in sorted(found, key=lambda p: p.split(os.sep))]  # (as Paths sort)


def load(
    dirs: Iterable[Path] | None = None,
    *,
    checks: Checks,
    builtin: bool = True,
    skip: Callable | None = None,
    kinds: set | frozenset | None = None,
) -> list[Rule]:
    """All rules: the built-in ones, then each extra directory's. A rule replaces an earlier one only
    when it says so (`replaces = "id"`); an id taken without it is a bad file. A bad file of an extra
    directory raises, or with `skip` goes to skip(error) (a warning) and is left out.
    `checks`: the named checks a rule may use. `kinds`: only the built-in rules of these kinds are
    parsed (explain needs no preflight rule)."""
    sources = ([builtin_dir()] if builtin else []) + [Path(d) for d in (dirs or [])]
    rules: dict[str, Rule] = {}
    known: dict[str, str] = {}  # every id loaded so far -> its file (built-ins of every kind)
    for i, directory in enumerate(sources):
        if not directory.is_dir():
            raise RuleError(directory, None, "not a directory of rule files")
        files = rule_files(directory)
        if builtin and i == 0:  # checked in full by the test suite: no regex compiled, kept parsed
            parsed = rulecache.kept(directory, files, checks, lambda fs: [_builtin(p, checks) for p in fs])
            for rule in parsed:
                known[rule.id] = rule.path
                if kinds is None or rule.kind in kinds:
                    rules[rule.id] = rule
            continue
        for path in files:
            try:
                rule = load_file(path, checks=checks)
                _take_place(rule, known, rules)
            except RuleError as e:
                if skip is None:
                    raise
                skip(e)
            else:
                rule.source = str(directory)
                rules[rule.id] = rule
                known[rule.id] = rule.path
    return list(rules.values())


def _take_place(rule: Rule, known: dict[str, str], rules: dict[str, Rule]) -> None:
    """A rule whose id is taken replaces that rule only when its file says so (`replaces = "id"`):
    a rule directory planted beside a log cannot silence a built-in diagnosis unannounced."""
    if rule.replaces is None:
        if rule.id in known:
            raise RuleError(rule.path, "id", f"{rule.id!r} is the id of {known[rule.id]}; to replace that "
                            f'rule, say replaces = "{rule.id}" in this file')  # fmt: skip
        return
    if rule.replaces not in known:
        raise RuleError(rule.path, "replaces", f"{rule.replaces!r} is no rule loaded before this one")
    if rule.id != rule.replaces and rule.id in known:
        raise RuleError(
            rule.path, "id", f"{rule.id!r} is the id of {known[rule.id]} too; it replaces {rule.replaces!r}"
        )
    rules.pop(rule.replaces, None)
    rule.replaced = known.pop(rule.replaces)


def _builtin(path: Path, checks: Checks) -> Rule:
    return parse(_read_toml(path), path, checks=checks, trusted=True)


def load_file(path: Path, *, checks: Checks, trusted: bool = False) -> Rule:
    """One rule file. `trusted` (the built-in rules, which the test suite checks in full with
    `rules check`) skips compiling the regexes here: the engine compiles each one on first use,
    and most never are, which keeps the cold start of `explain` short. A file outside the
    built-in rules compiles its patterns in the linear-time subset (matching/linear.py)."""
    return parse(_read_toml(path), path, checks=checks, trusted=trusted)


def check_file(path: Path, checks: Checks) -> tuple[Rule | None, list[RuleError]]:
    """One rule file as far as it can be read, and every problem loading finds in it."""
    try:
        data = _read_toml(path)
    except RuleError as e:
        return None, [e]
    return parse_all(data, path, checks=checks)


# tomllib takes time and memory quadratic in the parts of a dotted key (100,000 parts: minutes,
# then the kernel's OOM killer); a rule's keys have two or three. Word runs are possessive and
# start at a word's start, so this search is linear in the file.
_DEEP_KEY = re.compile(r"""(?<![\w-])(?:(?:[\w-]++|"[^"\n]*+"|'[^'\n]*+')[ \t]*+\.[ \t]*+){64}""")


MAX_FILE = 4 << 20  # bytes in one rule file: the largest built-in is under 10 KiB (a regex may be 1 MiB)


def _read_toml(path: Path) -> dict:
    import tomllib  # only when a rule file is read, not when the cached built-ins are

    from vllm_doctor.errors import TooLarge, read_text_bounded

    try:
        text = read_text_bounded(path, MAX_FILE, "rule file")
        if _DEEP_KEY.search(text):
            raise RuleError(path, None, "not valid TOML for a rule (a dotted key of 64 or more parts)")
        return tomllib.loads(text)
    except TooLarge as e:
        raise RuleError(path, None, str(e)) from None
    except tomllib.TOMLDecodeError as e:
        raise RuleError(path, None, f"not valid TOML ({e})") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise RuleError(path, None, "not valid TOML (nested too deeply)") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int limit)
        raise RuleError(path, None, f"not valid TOML ({str(e).split(';')[0]})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RuleError(path, None, f"cannot read ({e})") from None


@lru_cache(maxsize=1024)
def compile_regex(text: str):
    """A rule pattern compiled by RE2 in the linear-time subset (matching/linear.py; raises
    NotLinear): every rule, built in or from --rules, matches in time linear in the line. Kept:
    each engine of a process (serve's live watch, then its exit diagnosis) shares the compiled
    pattern and the DFA states RE2 built while matching (RE2 matches from any thread)."""
    from vllm_doctor.matching.linear import compile_linear

    return compile_linear(text)


_GROUP_NAME = re.compile(r"\(\?P?<([A-Za-z_]\w*)>")


def _checked_regex(text: str, key: str, rule: Rule, trusted: bool, out: _Problems) -> set[str] | None:
    """The pattern's group names; None (and its problems) when it cannot be used.

    Every pattern must be in the linear-time subset (RE2), which bounds its size and repeats
    before anything compiles: what it is decides, never how long it took."""
    from vllm_doctor.matching.linear import NotLinear

    if trusted:  # the names alone, without compiling (tests check this agrees for the built-ins)
        return set(_GROUP_NAME.findall(text))
    try:
        names = set(compile_regex(text).groupindex)
    except NotLinear as e:
        for problem in e.problems:
            out.add(key, problem)
        return None
    except Exception as e:  # regex.error and friends: report, never crash
        out.add(key, f"does not compile ({e})")
        return None
    return names


def parse(data: dict, path: Path, *, checks: Checks, trusted: bool = False, linear: bool | None = None) -> Rule:
    """One rule from its TOML data; raises RuleError (every problem in `.problems`)."""
    rule, problems = parse_all(data, path, checks=checks, trusted=trusted, linear=linear)
    if problems:
        problems[0].problems = problems
        raise problems[0]
    return rule


def parse_all(
    data: dict, path: Path, *, checks: Checks, trusted: bool = False, linear: bool | None = None
) -> tuple[Rule, list[RuleError]]:
    """The rule as far as it can be read, and every problem of it (for `rules check`). `linear`: whether its patterns must be in the linear-time subset (RE2); by default every
    rule but a trusted one or one from the built-in rules directory."""
    out = _Problems(path)
    if linear is None:
        linear = not trusted and not _is_builtin(path)
    return _parse(data, path, checks, trusted, linear, out), out.items


def _is_builtin(path: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(builtin_dir().resolve())
    except (OSError, RuntimeError, ValueError):
        return False


def _parse(data: dict, path: Path, checks: Checks, trusted: bool, linear: bool, out: _Problems) -> Rule:
    out.unknown_keys(data, _RULE_KEYS, "", "a rule key")
    rule_id = out.need(data, "id", str)
    if rule_id is not None and not _ID.match(rule_id):
        out.add("id", "must be kebab-case (a-z, 0-9, -)")
    elif rule_id is not None and path.suffix == ".toml" and path.stem != rule_id:
        out.add("id", f"must equal the file name ({path.stem!r})")
    kind = data.get("kind", "diagnosis")
    if kind not in ("diagnosis", "fact", "preflight"):
        out.add("kind", "must be 'diagnosis', 'fact' or 'preflight'")
    title = out.need(data, "title", str)
    explanation = out.need(data, "explanation", str)
    rule = Rule(id=rule_id or path.stem, kind=kind, title=title or "", explanation=(explanation or "").strip(),
                path=str(path), linear=linear)  # fmt: skip
    groups = _patterns(data, rule, trusted, out)
    _anchors(data, rule, out)
    _facts(data, rule, groups, out)
    _checks(data, rule, checks, out)
    rule.phase = out.need(data, "phase", str, required=False)
    rule.replaces = out.need(data, "replaces", str, required=False)
    if rule.replaces is not None and not _ID.match(rule.replaces):
        out.add("replaces", "must be a rule id (kebab-case)")
    rule.references = out.strings(data, "references") or []
    if kind == "fact":
        _fact_rule(data, rule, out)
    else:
        if kind == "preflight":
            _preflight_rule(data, rule, out)
        _diagnosis_rule(data, rule, out)
        rule.fixes = _fixes(data, out)
        if rule.severity in ("blocker", "warning") and not rule.fixes and isinstance(data.get("fixes", []), list):
            out.add("fixes", "a blocker or warning needs at least one fix")
    for key, message in name_problems(rule, groups, checks):
        out.add(key, message)
    return rule


def _patterns(data: dict, rule: Rule, trusted: bool, out: _Problems) -> set[str]:
    """The rule's patterns (into rule.patterns); returns the names of their groups."""
    groups: set[str] = set()
    for n, (key, p) in enumerate(out.tables(data, "patterns", _PATTERN_KEYS, "a pattern key")):
        if n >= MAX_PATTERNS:  # no more compiling: the rest are not read
            out.add("patterns", f"has {len(data['patterns']):,} patterns: a rule may have at most {MAX_PATTERNS}")
            break
        regex_text = out.need(p, "regex", str, prefix=f"{key}.")
        if regex_text is None:
            continue
        names = _checked_regex(regex_text, f"{key}.regex", rule, trusted, out)
        if names is None:  # refused; its names still count, so that no use of them is one more problem
            groups |= set(_GROUP_NAME.findall(regex_text))
            continue
        groups |= names
        for vkey in ("since", "until"):
            v = p.get(vkey)
            if v is not None and not (isinstance(v, str) and _VERSION.match(v)):
                out.add(f"{key}.{vkey}", "must be a version like '0.9.1'")
        level = p.get("level")
        if level is not None and level not in _LEVELS:
            out.add(f"{key}.level", f"must be one of {', '.join(sorted(_LEVELS))}")
            level = None
        unless = p.get("unless")
        if unless is not None and not isinstance(unless, str):
            out.add(f"{key}.unless", "must be a string")
            unless = None
        elif unless is not None and _checked_regex(unless, f"{key}.unless", rule, trusted, out) is None:
            unless = None
        texts = {}
        for skey in ("source", "example"):
            texts[skey] = p.get(skey) if isinstance(p.get(skey), str) else None
            if p.get(skey) is not None and texts[skey] is None:
                out.add(f"{key}.{skey}", "must be a string")
        counters = out.strings(p, "counter_example", prefix=f"{key}.") or []
        rule.patterns.append(Pattern(regex_text, p.get("since"), p.get("until"), texts["source"], level, unless,
                                     texts["example"], counters, needs(regex_text)))  # fmt: skip
    return groups


def _anchors(data: dict, rule: Rule, out: _Problems) -> None:
    anchors = out.strings(data, "anchors")
    rule.anchors = anchors or []
    if rule.patterns and anchors == []:
        out.add("anchors", "is missing: a rule with patterns needs literal anchors")
    if len(rule.anchors) > MAX_ANCHORS:
        out.add("anchors", f"has {len(rule.anchors):,} anchors: a rule may have at most {MAX_ANCHORS}")
    for a in rule.anchors:
        if len(a) < MIN_ANCHOR:
            out.add("anchors", f"{a!r} is shorter than {MIN_ANCHOR} characters")
        elif len(a) > MAX_ANCHOR:
            out.add("anchors", f"{a[:30]!r}... is {len(a):,} characters long: an anchor may have at most {MAX_ANCHOR}")
    for i, p in enumerate(rule.patterns):
        if anchors and isinstance(p.example, str) and not any(a in p.example for a in rule.anchors):
            out.add(f"patterns[{i}].example", "holds none of the rule's anchors")


def _facts(data: dict, rule: Rule, groups: set[str], out: _Problems) -> None:
    facts = data.get("facts", {})
    if not isinstance(facts, dict) or not all(isinstance(v, str) for v in facts.values()):
        out.add("facts", "must map group names to fact names")
        return
    series = data.get("series")
    if series is not None and series not in SERIES_FIELDS:
        out.add("series", f"must be one of {', '.join(SERIES_FIELDS)}")
        series = None
    known = SERIES_FIELDS[series] if series else {**FACTS, ARGS: str}
    for group, fact in facts.items():
        if group not in groups:
            out.add(f"facts.{group}", "is not a named group of any pattern")
        if fact not in known:
            out.add(f"facts.{group}", f"{fact!r} is not a known fact name{_close(fact, known)}")
    rule.facts, rule.series = facts, series


def _checks(data: dict, rule: Rule, checks: Checks, out: _Problems) -> None:
    rule.checks = out.strings(data, "checks") or []
    for c in rule.checks:
        if c not in checks:
            out.add("checks", f"{c!r} is not a named check ({', '.join(sorted(checks))})")
    rule.when = out.need(data, "when", str, required=False)
    out.condition(rule.when, "when")


def _fact_rule(data: dict, rule: Rule, out: _Problems) -> None:
    if not rule.patterns and "patterns" not in data:
        out.add("patterns", "a fact rule needs at least one pattern")
    if not (rule.facts or rule.phase or "facts" in data):
        out.add("facts", "a fact rule must fill facts or mark a phase")
    for key in ("category", "severity", "fixes", "summary"):
        if key in data:
            out.add(key, "is for diagnosis rules, not fact rules")
    rule.bulk = out.need(data, "bulk", str, required=False)
    if rule.bulk is not None and (rule.linear or rule.series is None):
        out.add("bulk", "is for the built-in rules of a series (it is matched on every line of a region)")


def _preflight_rule(data: dict, rule: Rule, out: _Problems) -> None:
    """A finding of `vllm-doctor check`: its check (preflight/) computes the numbers and picks it by id."""
    for key in ("patterns", "anchors", "facts", "series", "phase", "checks", "when"):
        if key in data:
            out.add(key, "is for diagnosis and fact rules: a preflight check computes its numbers")
    rule.names = out.strings(data, "names") or []
    if "names" not in data:
        out.add("names", "is missing: list the values the check gives the templates ([] for none)")
    if "priority" not in data:
        out.add("priority", "is missing: the startup stage it fails at (port 90 ... cache 50)")


def _diagnosis_rule(data: dict, rule: Rule, out: _Problems) -> None:
    category = out.need(data, "category", str)
    if category is not None and not _ID.match(category):
        out.add("category", "must be kebab-case")
    rule.category = category
    severity = data.get("severity", "")
    if severity not in SEVERITIES:
        out.add("severity", f"must be one of {', '.join(SEVERITIES)}")
    confidence = data.get("confidence", "high")
    if confidence not in CONFIDENCES:
        out.add("confidence", f"must be one of {', '.join(CONFIDENCES)}")
        confidence = "high"
    if rule.kind == "diagnosis" and not rule.patterns and not rule.when and "patterns" not in data:
        out.add("when", "a rule without patterns needs a condition to fire on")
    priority = data.get("priority", 50)
    if not isinstance(priority, int) or isinstance(priority, bool):
        out.add("priority", "must be an integer")
        priority = 50
    wrapper, fallback = data.get("wrapper", False), data.get("fallback", False)
    for key, flag in (("wrapper", wrapper), ("fallback", fallback)):
        if not isinstance(flag, bool):
            out.add(key, "must be true or false")
    wrapper, rule.fallback = wrapper is True, fallback is True
    summary = out.strings(data, "summary")
    rule.summary = summary or []
    for t in rule.summary:
        out.templates(t, "summary")
    if summary == []:
        out.add("summary", "is missing")
    rule.survived = out.strings(data, "survived") or []
    for t in rule.survived:
        out.templates(t, "survived")
    if rule.survived and severity != "blocker":
        out.add("survived", "is for a blocker: what it means when the server got past it")
    rule.severity, rule.confidence, rule.priority, rule.wrapper = severity, confidence, priority, wrapper


def _fixes(data: dict, out: _Problems) -> list[Fix]:
    """[[fixes]]: action, why and value are each a template or a list of fallbacks."""
    fixes: list[Fix] = []
    for key, f in out.tables(data, "fixes", _FIX_KEYS, "a fix key"):
        parts: dict[str, list[str]] = {}
        for k in ("action", "why", "value"):
            got = out.strings(f, k, empty_ok=k == "value", prefix=f"{key}.")
            parts[k] = got or []
            if got == [] and k != "value":
                out.add(f"{key}.{k}", "is missing")
            if len(parts[k]) > max(1, len(parts["action"])):
                out.add(f"{key}.{k}", "has more fallbacks than action: each entry goes with one action")
            for t in parts[k]:
                out.templates(t, f"{key}.{k}")
        for k in ("flag", "when", "direction"):
            if f.get(k) is not None and not isinstance(f[k], str):
                out.add(f"{key}.{k}", "must be a string")
        flag, when, direction = (f.get(k) if isinstance(f.get(k), str) else None for k in ("flag", "when", "direction"))
        if direction is not None and (direction not in FIX_DIRECTIONS or flag is None):
            out.add(f"{key}.direction", f"must be one of {', '.join(FIX_DIRECTIONS)}, with a flag")
        out.condition(when, f"{key}.when")
        if not parts["action"] or not parts["why"]:
            continue
        variants = [(a, parts["why"][min(j, len(parts["why"]) - 1)],
                     (parts["value"][min(j, len(parts["value"]) - 1)] if parts["value"] else "") or None)
                    for j, a in enumerate(parts["action"])]  # fmt: skip
        (action, why, value), *fallbacks = variants
        fixes.append(Fix(action, why, flag, value, when, direction, fallbacks))
    return fixes
