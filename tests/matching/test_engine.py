"""The engine alone: one rule, hand-made lines."""

from __future__ import annotations

from pathlib import Path

from vllm_doctor.data import Line
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching.engine import Engine
from vllm_doctor.matching.loader import parse

RULE = {
    "id": "heads", "category": "tp-divisibility", "title": "t", "explanation": "e", "severity": "blocker",
    "summary": ["{heads} by {tp}"], "anchors": ["attention heads", "tensor parallel size"],
    "facts": {"tp": "tensor_parallel_size"},
    "patterns": [{"regex": r"Total number of attention heads \((?P<heads>\d+)\) must be divisible by tensor parallel size \((?P<tp>\d+)\)"}],
    "fixes": [{"action": "a", "why": "w"}],
}  # fmt: skip


def run(texts: list[str]):
    engine = Engine([parse(RULE, Path("heads.toml"), checks=CHECKS)])
    lines = [
        Line(no=i, text=t, raw=t, anchors=tuple(engine.prefilter.anchors_in(t.encode())))
        for i, t in enumerate(texts, 1)
    ]
    facts = Facts()
    return engine.run(lines, facts), facts


def test_a_line_matches_its_rule_and_fills_groups_facts_and_evidence():
    matches, facts = run(
        [
            "INFO starting",
            "ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).",
        ]
    )
    m = matches["heads"]
    assert m.groups == {"heads": 40, "tp": 3} and m.first_line == 2 and m.count == 1
    assert [e.line for e in m.evidence] == [2]
    assert facts.get("tensor_parallel_size") == 3


def test_a_hard_wrapped_line_is_joined_to_its_neighbour():
    matches, _ = run(
        ["ValueError: Total number of attention heads (40) must be divisible by tensor par", "allel size (3)."]
    )
    m = matches["heads"]
    assert m.groups == {"heads": 40, "tp": 3}
    assert [e.line for e in m.evidence] == [1, 2]


def test_no_match_without_the_message():
    matches, facts = run(["attention heads are fine", "tensor parallel size (3) is set"])
    assert matches == {} and facts.values == {}
