"""Load and validate the rule files in rules/ (and any --rules DIR).

A rule is a TOML file named after its id. It is data only: nothing in it runs. Every key is
checked on load, and a bad file gives one error naming the file and the key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vllm_doctor.data import CONFIDENCES, SEVERITIES, Fix, Pattern, Rule
from vllm_doctor.errors import DoctorError
from vllm_doctor.knowledge.facts import ARGS, FACTS, STATS_FIELDS
from vllm_doctor.matching import expr

_ID = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_VERSION = re.compile(r"^\d+\.\d+(?:\.\d+)?$")
MIN_ANCHOR = 4

_RULE_KEYS = {
    "id", "kind", "category", "title", "severity", "confidence", "priority", "wrapper", "summary",
    "explanation", "anchors", "patterns", "facts", "series", "phase", "checks", "when", "fixes",
    "references",
}  # fmt: skip
_PATTERN_KEYS = {"regex", "since", "until", "source", "level", "unless", "example"}
_FIX_KEYS = {"action", "flag", "value", "when", "why"}
_LEVELS = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}
SERIES = {"stats": STATS_FIELDS}


class RuleError(DoctorError):
    """A rule file that cannot be used; str() is one line naming the file and the key."""

    def __init__(self, path: str | Path, key: str | None, message: str):
        self.path, self.key = str(path), key
        where = f"{path}: key '{key}'" if key else str(path)
        super().__init__(f"{where}: {message}")


def builtin_dir() -> Path:
    """rules/ inside the installed wheel (beside this module), or at the top of a source
    checkout or editable install."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "rules"
    return packaged if packaged.is_dir() else package.parents[1] / "rules"


def rule_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.toml") if p.is_file())


def load(dirs: Iterable[Path] | None = None, *, builtin: bool = True) -> list[Rule]:
    """All rules: the built-in ones, then each extra directory; a later id replaces an earlier."""
    sources = ([builtin_dir()] if builtin else []) + [Path(d) for d in (dirs or [])]
    rules: dict[str, Rule] = {}
    for i, directory in enumerate(sources):
        if not directory.is_dir():
            raise RuleError(directory, None, "not a directory of rule files")
        files = rule_files(directory)
        if builtin and i == 0:  # checked in full by the test suite: no regex compiled, TOML cached
            for path, data in _builtin_data(directory, files):
                rule = parse(data, path, trusted=True)
                rules[rule.id] = rule
            continue
        for path in files:
            rule = load_file(path)
            rules[rule.id] = rule
    return list(rules.values())


def load_file(path: Path, *, trusted: bool = False) -> Rule:
    """One rule file. `trusted` (the built-in rules, which the test suite checks in full with
    `rules check`) skips compiling the regexes here: the engine compiles each one on first use,
    and most never are, which keeps the cold start of `explain` short."""
    return parse(_read_toml(path), path, trusted=trusted)


def _read_toml(path: Path) -> dict:
    import tomllib  # only when a rule file is read, not when the cached built-ins are

    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise RuleError(path, None, f"not valid TOML ({e})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RuleError(path, None, f"cannot read ({e})") from None


_CACHE_FORMAT = 1


def _builtin_data(directory: Path, files: list[Path]) -> list[tuple[Path, dict]]:
    """The parsed TOML of the built-in rule files. Parsing 100+ TOML files is a sixth of the
    cold start of `explain`, so the result is kept as JSON (data, like the files) and reused
    while no file's name, size or mtime has changed (cache.py)."""
    from vllm_doctor import cache

    try:
        stamp = [[str(p.relative_to(directory)), *_stat(p)] for p in files]
    except OSError:
        stamp = None
    key = [_CACHE_FORMAT, str(directory), stamp]
    name = "builtin-rules.json"
    if stamp is not None:
        try:
            cached = json.loads(cache.read(name) or b"null")
            if cached and cached["key"] == key:
                return [(directory / rel, data) for rel, data in cached["rules"]]
        except (ValueError, KeyError, TypeError):
            pass
    out = [(p, _read_toml(p)) for p in files]
    if stamp is not None:
        try:
            blob = json.dumps({"key": key, "rules": [[r, d] for (_p, d), (r, *_) in zip(out, stamp, strict=False)]})
        except (TypeError, ValueError):  # a value JSON cannot hold (a TOML date): no cache
            return out
        cache.write(name, blob.encode("utf-8"))
    return out


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _need(data: dict, key: str, kind: type | tuple, path: Path, required: bool = True) -> Any:
    if key not in data:
        if required:
            raise RuleError(path, key, "is missing")
        return None
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RuleError(path, key, f"must be a {name}")
    return value


def _strings(data: dict, key: str, path: Path) -> list[str]:
    value = data.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise RuleError(path, key, "must be a list of non-empty strings")
    return value


def _templates(text: str, key: str, path: Path) -> None:
    bad = expr.bad_placeholders(text)
    if bad:
        raise RuleError(path, key, f"{bad[0]} is not a placeholder: use {{name}}, {{name:,}} or {{name:.2f}}")


def _condition(text: str | None, key: str, path: Path) -> None:
    if text is None:
        return
    try:
        expr.Condition(text)
    except expr.ExprError as e:
        raise RuleError(path, key, f"bad condition: {e}") from None


def compile_regex(text: str):
    import regex

    return regex.compile(text, regex.VERSION0)


_GROUP_NAME = re.compile(r"\(\?P?<([A-Za-z_]\w*)>")


def _group_names(text: str, trusted: bool = False) -> set[str]:
    if trusted:  # the names alone, without compiling (tests check this agrees for the built-ins)
        return set(_GROUP_NAME.findall(text))
    return set(compile_regex(text).groupindex)


def _no_catastrophic_backtracking(text: str, key: str, path: Path) -> None:
    """A pattern whose structure lets a hostile line make it backtrack for minutes is refused
    (`rules check` also times each pattern on such lines: redos.py)."""
    from vllm_doctor.matching.redos import static_problems

    problems = static_problems(text)
    if problems:
        raise RuleError(path, key, f"can backtrack catastrophically: {problems[0]}")


def parse(data: dict, path: Path, *, trusted: bool = False) -> Rule:
    from vllm_doctor.knowledge.checks import CHECKS

    unknown = set(data) - _RULE_KEYS
    if unknown:
        raise RuleError(path, sorted(unknown)[0], "is not a rule key (typo?)")
    rule_id = _need(data, "id", str, path)
    if not _ID.match(rule_id):
        raise RuleError(path, "id", "must be kebab-case (a-z, 0-9, -)")
    if path.suffix == ".toml" and path.stem != rule_id:
        raise RuleError(path, "id", f"must equal the file name ({path.stem!r})")
    kind = data.get("kind", "diagnosis")
    if kind not in ("diagnosis", "fact"):
        raise RuleError(path, "kind", "must be 'diagnosis' or 'fact'")
    title = _need(data, "title", str, path)
    explanation = _need(data, "explanation", str, path)

    patterns = []
    raw_patterns = data.get("patterns", [])
    if not isinstance(raw_patterns, list):
        raise RuleError(path, "patterns", "must be an array of tables ([[patterns]])")
    groups: set[str] = set()
    for i, p in enumerate(raw_patterns):
        key = f"patterns[{i}]"
        if not isinstance(p, dict):
            raise RuleError(path, key, "must be a table")
        extra = set(p) - _PATTERN_KEYS
        if extra:
            raise RuleError(path, f"{key}.{sorted(extra)[0]}", "is not a pattern key")
        regex_text = _need(p, "regex", str, path)
        try:
            names = _group_names(regex_text, trusted)
        except Exception as e:  # regex.error and friends: report, never crash
            raise RuleError(path, f"{key}.regex", f"does not compile ({e})") from None
        if not trusted:
            _no_catastrophic_backtracking(regex_text, f"{key}.regex", path)
        groups |= names
        for vkey in ("since", "until"):
            v = p.get(vkey)
            if v is not None and not (isinstance(v, str) and _VERSION.match(v)):
                raise RuleError(path, f"{key}.{vkey}", "must be a version like '0.9.1'")
        level = p.get("level")
        if level is not None and level not in _LEVELS:
            raise RuleError(path, f"{key}.level", f"must be one of {', '.join(sorted(_LEVELS))}")
        unless = p.get("unless")
        if unless is not None and not trusted:
            try:
                compile_regex(unless)
            except Exception as e:
                raise RuleError(path, f"{key}.unless", f"does not compile ({e})") from None
            _no_catastrophic_backtracking(unless, f"{key}.unless", path)
        for skey in ("source", "example"):
            if p.get(skey) is not None and not isinstance(p[skey], str):
                raise RuleError(path, f"{key}.{skey}", "must be a string")
        patterns.append(
            Pattern(regex_text, p.get("since"), p.get("until"), p.get("source"), level, unless, p.get("example"))
        )

    anchors = _strings(data, "anchors", path)
    if patterns and not anchors:
        raise RuleError(path, "anchors", "is missing: a rule with patterns needs literal anchors")
    for a in anchors:
        if len(a) < MIN_ANCHOR:
            raise RuleError(path, "anchors", f"{a!r} is shorter than {MIN_ANCHOR} characters")
    for i, p in enumerate(patterns):
        if p.example is not None and not any(a in p.example for a in anchors):
            raise RuleError(path, f"patterns[{i}].example", "holds none of the rule's anchors")

    facts = data.get("facts", {})
    if not isinstance(facts, dict) or not all(isinstance(v, str) for v in facts.values()):
        raise RuleError(path, "facts", "must map group names to fact names")
    series = data.get("series")
    if series is not None and series not in SERIES:
        raise RuleError(path, "series", f"must be one of {', '.join(SERIES)}")
    known = SERIES[series] if series else {**FACTS, ARGS: str}
    for group, fact in facts.items():
        if group not in groups:
            raise RuleError(path, f"facts.{group}", "is not a named group of any pattern")
        if fact not in known:
            raise RuleError(path, f"facts.{group}", f"{fact!r} is not a known fact name")

    checks = _strings(data, "checks", path)
    for c in checks:
        if c not in CHECKS:
            raise RuleError(path, "checks", f"{c!r} is not a named check ({', '.join(sorted(CHECKS))})")
    when = _need(data, "when", str, path, required=False)
    _condition(when, "when", path)

    rule = Rule(id=rule_id, kind=kind, title=title, explanation=explanation.strip(), path=str(path))
    rule.patterns, rule.anchors, rule.facts, rule.series = patterns, anchors, facts, series
    rule.checks, rule.when = checks, when
    rule.phase = _need(data, "phase", str, path, required=False)
    rule.references = _strings(data, "references", path)

    if kind == "fact":
        if not patterns:
            raise RuleError(path, "patterns", "a fact rule needs at least one pattern")
        if not (facts or rule.phase):
            raise RuleError(path, "facts", "a fact rule must fill facts or mark a phase")
        for key in ("category", "severity", "fixes", "summary"):
            if key in data:
                raise RuleError(path, key, "is for diagnosis rules, not fact rules")
        return rule

    category = _need(data, "category", str, path)
    if not _ID.match(category):
        raise RuleError(path, "category", "must be kebab-case")
    severity = data.get("severity", "")
    if severity not in SEVERITIES:
        raise RuleError(path, "severity", f"must be one of {', '.join(SEVERITIES)}")
    confidence = data.get("confidence", "high")
    if confidence not in CONFIDENCES:
        raise RuleError(path, "confidence", f"must be one of {', '.join(CONFIDENCES)}")
    if not patterns and not when:
        raise RuleError(path, "when", "a rule without patterns needs a condition to fire on")
    priority = data.get("priority", 50)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise RuleError(path, "priority", "must be an integer")
    wrapper = data.get("wrapper", False)
    if not isinstance(wrapper, bool):
        raise RuleError(path, "wrapper", "must be true or false")
    summary = _strings(data, "summary", path)
    for t in summary:
        _templates(t, "summary", path)
    if not summary:
        raise RuleError(path, "summary", "is missing")

    fixes = []
    raw_fixes = data.get("fixes", [])
    if not isinstance(raw_fixes, list):
        raise RuleError(path, "fixes", "must be an array of tables ([[fixes]])")
    for i, f in enumerate(raw_fixes):
        key = f"fixes[{i}]"
        if not isinstance(f, dict):
            raise RuleError(path, key, "must be a table")
        extra = set(f) - _FIX_KEYS
        if extra:
            raise RuleError(path, f"{key}.{sorted(extra)[0]}", "is not a fix key")
        action = _need(f, "action", str, path)
        why = _need(f, "why", str, path)
        for k in ("action", "why", "value"):
            if isinstance(f.get(k), str):
                _templates(f[k], f"{key}.{k}", path)
        for k in ("flag", "value", "when"):
            if f.get(k) is not None and not isinstance(f[k], str):
                raise RuleError(path, f"{key}.{k}", "must be a string")
        _condition(f.get("when"), f"{key}.when", path)
        fixes.append(Fix(action=action, why=why, flag=f.get("flag"), value=f.get("value"), when=f.get("when")))
    if severity in ("blocker", "warning") and not fixes:
        raise RuleError(path, "fixes", "a blocker or warning needs at least one fix")

    rule.category, rule.severity, rule.confidence = category, severity, confidence
    rule.priority, rule.wrapper, rule.summary, rule.fixes = priority, wrapper, summary, fixes
    return rule
