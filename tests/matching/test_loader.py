"""The rule loader's choices of what to parse (matching/loader.py)."""

from __future__ import annotations

from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching.loader import load


def test_kinds_parse_only_the_built_in_rules_a_command_uses():
    """explain, watch and serve read logs and scrapes: the preflight rules are not parsed for them."""
    everything = load(checks=CHECKS)
    logs = load(kinds={"diagnosis", "fact"}, checks=CHECKS)
    assert {r.kind for r in logs} == {"diagnosis", "fact"}
    assert {r.id for r in logs} == {r.id for r in everything if r.kind != "preflight"}
    assert any(r.kind == "preflight" for r in everything)
