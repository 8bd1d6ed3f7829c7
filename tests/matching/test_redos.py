"""ReDoS: no log line can make a rule pattern backtrack, by construction.

Every rule pattern, built in or from --rules, compiles in RE2's linear-time subset
(matching/linear.py): a search costs at most the program size per character, whatever the line
holds, so nothing is timed. The reader hands a pattern at most a window of a long line; the tests
below hold that, and that a line once quadratic for the regex module is matched, by what is
searched and found, not by a clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching import engine as engine_mod
from vllm_doctor.matching.engine import Engine
from vllm_doctor.matching.linear import LinearPattern
from vllm_doctor.matching.loader import compile_regex, load
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


@pytest.mark.parametrize(("rule", "index", "key", "text"), PATTERNS, ids=IDS)
def test_builtin_pattern_compiles_in_the_linear_subset(rule, index, key, text):
    assert isinstance(compile_regex(text), LinearPattern)


@pytest.mark.parametrize(("rule", "index", "key", "text"), PATTERNS, ids=IDS)
def test_builtin_pattern_is_given_a_window_of_a_megabyte_line(tmp_path, rule, index, key, text):
    """Each anchor of the rule followed by a megabyte without a line end, in a log: read and
    matched, the pattern never given more than a window of it."""
    searched: list[int] = []

    class Watched:
        def __init__(self, rx):
            self.rx = rx

        def search(self, text, *a):
            searched.append(len(text))
            return self.rx.search(text, *a)

        def finditer(self, text, *a):
            searched.append(len(text))
            return self.rx.finditer(text, *a)

    needed = rule.patterns[index].needs[:1]  # (a text without it is not searched: matching/literal.py)
    line = "".join(f"{a}{'a1 ' * 1000}" for a in [*rule.anchors, *needed]).ljust(1 << 20, "x")
    path = tmp_path / "hostile.log"
    path.write_text(f"first line\n{line}\nlast line\n", encoding="utf-8")
    eng = Engine([rule])
    stats = logread.ReadStats()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(engine_mod, "compile_regex", lambda t: Watched(compile_regex(t)))
        eng.run(logread.read([str(path)], eng.prefilter, stats), Facts())
    assert stats.lines == 3
    assert searched and max(searched) <= 2 * logread.WINDOW + 2 * logread.MARGIN + 64


def test_a_pattern_quadratic_for_the_regex_module_finds_the_last_line(tmp_path):
    """A leading \\S+ in an alternation made the regex module quadratic on a line without spaces
    (400 such lines took minutes, and a time limit skipped them). In RE2 every line is read,
    nothing is skipped, and the line after them that the rule is meant for is matched."""
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
    )  # fmt: skip
    log = tmp_path / "hostile.log"
    log.write_text(("is a gated repository" + "x" * 8000 + "\n") * 400 + "\nmyorg/mymodel is a gated repository\n")
    report = explain([str(log)], [rule])
    assert report.facts["model"] == "myorg/mymodel"
    assert not any("skipped" in w for w in report.warnings), report.warnings
