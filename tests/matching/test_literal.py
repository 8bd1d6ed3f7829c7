"""The engine's literal gate (matching/literal.py): a pattern is searched, and compiled, only in a
text that holds a literal every match of it contains; the gate never hides a match."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching import engine
from vllm_doctor.matching.linear import compile_linear
from vllm_doctor.matching.literal import needs
from vllm_doctor.matching.loader import load

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("regex", "want"),
    [
        (r"Maximum concurrency for (?P<n>\d+) tokens", ("Maximum concurrency for ",)),
        (r"(?:CUDA|HIP) out of memory", (" out of memory",)),
        (r"OutOfMemoryError|CUDA error: out of memory", ("CUDA error: out of memory", "OutOfMemoryError")),
        (r"(?:abc)?defg", ("defg",)),  # an optional group is not needed
        (r"x{0,3}y", ()),  # nor a repeat that may be empty; "y" alone is too short
        (r"(?:abcd){2}", ("abcd",)),
        (r"abcd|e", ()),  # an alternative that needs nothing long: no gate
        (r"(?i)out of memory", ()),  # any case: a plain `in` would miss
        (r"foo(?i:barbaz)", ("foo",)),
        (r"\pL+ failed", ()),  # RE2 syntax Python does not read: always searched
        (r"[[:alpha:]]+ failed", ()),  # a POSIX class Python reads as a set and a literal "]"
        (r"\Qa.b\E failed", ()),
    ],
)
def test_what_a_pattern_needs(regex, want):
    assert needs(regex) == want


def _lines() -> list[str]:
    files = glob.glob(str(ROOT / "fixtures/**/*.log"), recursive=True)
    out: list[str] = []
    for f in files:
        text = Path(f).read_bytes().decode("utf-8", "replace").splitlines()
        out += text
        out += [a + b for a, b in zip(text, text[1:], strict=False)]  # a wrapped message, glued
    return out


def test_every_match_of_a_builtin_pattern_holds_what_it_needs():
    """On every fixture line (and each line glued to the next) and every example, a built-in
    pattern matches only where its gate lets it: the gate never hides a match."""
    lines = _lines()
    gated = checked = 0
    for rule in load(checks=CHECKS):
        for p in rule.patterns:
            if not p.needs:
                continue
            gated += 1
            rx = compile_linear(p.regex)
            anchors = rule.anchors or [""]
            for text in [p.example or "", *(t for t in lines if any(a in t for a in anchors))]:
                if rx.search(text):
                    checked += 1
                    assert any(n in text for n in p.needs), (rule.id, p.regex, text)
    assert gated > 300 and checked > 500


def test_a_pattern_is_compiled_only_where_a_text_holds_what_it_needs(monkeypatch):
    """A startup log: the patterns compiled are those of the rules its lines reach whose needed
    literal the lines hold; most of the built-in patterns never are."""
    from vllm_doctor.facts import Facts
    from vllm_doctor.read import logread

    compiled: set[str] = set()

    def spy(text):
        compiled.add(text)
        return compile_linear(text)

    monkeypatch.setattr(engine, "compile_regex", spy)
    rules = load(checks=CHECKS)
    log = ROOT / "fixtures/lab/cache-oom.log"
    e = engine.Engine(rules)
    e.run(logread.read([str(log)], e.prefilter, logread.ReadStats()), Facts())
    lines = log.read_text().splitlines()
    texts = "".join(lines) + "\n" + " ".join(t.strip() for t in lines)  # the windows, glued either way
    patterns = [p for r in rules for p in r.patterns]
    reached = [p for p in patterns if p.regex in compiled]
    assert any(p.needs for p in reached)  # the log's own rules were searched
    assert all(any(n in texts for n in p.needs) for p in reached if p.needs)
    assert len(reached) < len(patterns) // 4  # most never are
