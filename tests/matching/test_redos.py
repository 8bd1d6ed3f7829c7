"""ReDoS: no log line can make a built-in rule pattern backtrack for long.

The built-in patterns compile in the regex module (8 of them use lookarounds, which RE2 lacks),
so they keep the timed guard, in three layers: `rules check` refuses patterns that can backtrack
catastrophically (a static look at nested and adjacent quantifiers, and a timed probe on
hostile lines); the reader hands a pattern at most logread.MAX_LINE characters; and every search
runs under the regex module's timeout. The tests below feed each built-in pattern lines built to
make it backtrack. Patterns from --rules compile in RE2's linear-time subset instead, with
nothing to time (tests/matching/test_linear.py, tests/hostile/test_hostile_rules.py).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LAB, SAMPLE_RULE
from vllm_doctor.cli import app
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching import engine as engine_mod
from vllm_doctor.matching import redos
from vllm_doctor.matching.engine import Engine
from vllm_doctor.matching.loader import compile_regex, load, parse_all, rule_files
from vllm_doctor.read import logread

BUILTIN = load(checks=CHECKS)
PATTERNS = [
    (rule, i, key, text)
    for rule in BUILTIN
    for i, p in enumerate(rule.patterns)
    for key, text in (("regex", p.regex), ("unless", p.unless))
    if text
]
IDS = [f"{r.id}[{i}].{k}" for r, i, k, _t in PATTERNS]

CATASTROPHIC = [
    r"(a+)+$",
    r"(\w+\s?)*$",
    r"(a*)*b",
    r"^(\d+)*x",
    r"error: (?:\S+\s*)*done",
    r"took \d+\d+ms",
    r"args: .*\s*.*end",
    r"sm_(\d+)\w* is",
    r"be (?P<c>[^\[]+?)\s*\[type=",
]
SAFE = [
    r"KV cache size: (?P<tokens>\d[\d,]*) tokens",
    r"(?:\d+, )*\d+ blocks",
    r"\S+(?:\s+\S+)*",
    r"non-default args: (?P<args>\{.*)",
    r"(?P<v>\d+\.\d+[\w.+\-]*)",
    r"(?:(?!Running: ).){0,300}?KV cache usage: (?P<kv>\d+(?:\.\d+)?)%",
    r"Tried to allocate (?P<alloc>[\d.]+) ?(?P<unit>[KMG]iB)",
    r"(?>\w+)+ x",
]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_static_check_finds_nested_and_adjacent_quantifiers(pattern):
    assert redos.static_problems(pattern)


@pytest.mark.parametrize("pattern", SAFE)
def test_static_check_leaves_common_safe_forms_alone(pattern):
    assert redos.static_problems(pattern) == []


def test_probe_catches_a_pattern_the_static_check_cannot_see():
    """A leading \\S+ in an alternation: quadratic in the length of a line without spaces."""
    pattern = r"GatedRepoError|(?P<repo>\S+) is a gated repository"
    assert redos.static_problems(pattern) == []
    slow = redos.probe(compile_regex(pattern), pattern, ["is a gated repository"], "org/model is a gated repository")
    assert slow is not None and slow[1] > redos.PROBE_BUDGET


def _rule(tmp_path: Path, regex: str, example: str, anchor: str) -> Path:
    d = tmp_path / "rules"
    d.mkdir()
    text = (
        SAMPLE_RULE.replace('"my-rule"', '"slow-rule"')
        .replace('["it happened"]', f'["{anchor}"]')
        .replace("it happened (?P<n>\\d+)", regex)
        .replace('"it happened 3"', f'"{example}"')
    )
    assert regex in text
    (d / "slow-rule.toml").write_text(text)
    return d


def _as_builtin(d: Path) -> list[str]:
    """`rules check` of a directory as if it held built-in rules (the regex module, the timed
    guard): the problems, one line each."""
    from vllm_doctor.matching.ruledoc import problems_in

    out: list[str] = []
    for path in rule_files(d):
        rule, found = parse_all(tomllib.loads(path.read_text()), path, linear=False, checks=CHECKS)
        out += [str(e) for e in found] + problems_in(rule)
    return out


def test_the_static_check_refuses_nested_quantifiers_in_a_builtin_pattern(tmp_path):
    d = _rule(tmp_path, r"it happened: (?P<n>\d+) (\w+\s?)*$", "it happened: 3 a b c", "it happened")
    assert any(
        "slow-rule.toml: key 'patterns[0].regex': can backtrack catastrophically: nested quantifiers" in p
        for p in _as_builtin(d)
    )
    # from --rules the same pattern compiles in RE2, where it cannot backtrack: accepted
    result = CliRunner().invoke(app, ["rules", "check", str(d)])
    assert result.exit_code == 0, result.stderr


def test_the_probe_refuses_a_builtin_pattern_it_finds_slow(tmp_path):
    d = _rule(
        tmp_path, r"GatedRepoError|(?P<repo>\S+) is a gated repository", "org/m is a gated repository", "gated repo"
    )
    problems = "\n".join(_as_builtin(d))
    assert "key 'patterns[0].regex': backtracks catastrophically" in problems and "KiB line of" in problems


def test_the_probe_uses_the_longest_line_the_engine_matches():
    assert redos.PROBE_SIZE == logread.MAX_LINE
    assert 2 * logread.WINDOW <= logread.MAX_LINE


@pytest.mark.parametrize(("rule", "index", "key", "text"), PATTERNS, ids=IDS)
def test_builtin_pattern_passes_the_probe(rule, index, key, text):
    assert redos.static_problems(text) == []
    slow = redos.probe(compile_regex(text), text, rule.anchors, rule.patterns[index].example)
    assert slow is None, f"{slow[1]:.2f} s on {slow[0]}"


def _worst_megabyte_lines(rule, index, text) -> list[tuple[str, str]]:
    rx = compile_regex(text)
    example = rule.patterns[index].example
    worst = set(redos.worst_lines(rx, text, rule.anchors, example, keep=1))
    return list(redos.probe_lines(text, rule.anchors, example, 1 << 20, only=worst))


@pytest.mark.parametrize(("rule", "index", "key", "text"), PATTERNS, ids=IDS)
def test_builtin_pattern_finishes_on_a_pathological_megabyte_line(tmp_path, rule, index, key, text):
    """The line a pattern backtracks worst on, at 1 MB, in a log: read and matched, the pattern
    never given more than a window of it (the bound `rules check` probes each pattern at), and no
    search hits the time limit. Held by what is searched, not by the clock of a busy machine."""
    searched: list[int] = []

    class Watched:
        def __init__(self, rx):
            self.rx = rx

        def search(self, text, **k):
            searched.append(len(text))
            return self.rx.search(text, **k)

        def finditer(self, text, **k):
            searched.append(len(text))
            return self.rx.finditer(text, **k)

    for what, line in _worst_megabyte_lines(rule, index, text):
        path = tmp_path / "hostile.log"
        path.write_text(f"first line\n{line}\nlast line\n", encoding="utf-8")
        eng = Engine([rule])
        stats = logread.ReadStats()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(engine_mod, "compile_regex", lambda t, linear=False: Watched(compile_regex(t, linear)))
            eng.run(logread.read([str(path)], eng.prefilter, stats), Facts())
        assert stats.lines == 3
        assert max(searched, default=0) <= 2 * logread.WINDOW + 2 * logread.MARGIN + 64, what
        assert eng.timeouts == 0, what


def test_every_search_runs_under_the_regex_timeout(monkeypatch):
    calls: list[dict] = []

    class Watched:
        def __init__(self, rx):
            self.rx = rx

        def search(self, *a, **k):
            calls.append(k)
            return self.rx.search(*a, **k)

        def finditer(self, *a, **k):
            calls.append(k)
            return self.rx.finditer(*a, **k)

    monkeypatch.setattr(engine_mod, "compile_regex", lambda text, linear=False: Watched(compile_regex(text, linear)))
    eng = Engine(BUILTIN)
    eng.run(logread.read([str(LAB / "cache-oom.log")], eng.prefilter, logread.ReadStats()), Facts())
    assert calls and all(k.get("timeout") == engine_mod.REGEX_TIMEOUT for k in calls)


def test_a_rule_slow_on_every_line_skips_those_lines_and_still_finds_the_last_one(tmp_path, monkeypatch):
    """A pattern slow on each of thousands of hostile lines would add up to hours; dropping the
    rule would lose a blocker after them (issue 10). Past RULE_BUDGET seconds of matching, the
    rule's limit per line tightens to SLOW_TIMEOUT: each slow line is skipped, with a warning,
    and the line after them that the rule is meant for is still matched."""
    from vllm_doctor.matching.loader import parse
    from vllm_doctor.pipeline import explain

    rule = parse(
        {
            "id": "slow-rule", "kind": "fact", "title": "t", "explanation": "e", "anchors": ["gated repository"],
            "facts": {"repo": "model"},
            "patterns": [{"regex": r"GatedRepoError|(?P<repo>\S+) is a gated repository"}],
        },
        Path("slow-rule.toml"),
        checks=CHECKS,
        trusted=True,  # as if it had slipped past `rules check`
    )  # fmt: skip
    monkeypatch.setattr(engine_mod, "RULE_BUDGET", 0.3)
    log = tmp_path / "hostile.log"
    log.write_text(("is a gated repository" + "x" * 8000 + "\n") * 400 + "\nmyorg/mymodel is a gated repository\n")
    report = explain([str(log)], [rule])
    assert report.facts["model"] == "myorg/mymodel"
    [warning] = [w for w in report.warnings if "skipped those lines only (lines skipped): slow-rule (" in w]
    assert 300 < int(warning.rsplit("(", 1)[1].rstrip(")")) <= 400  # a line or two finish within the first limit
