"""diagnose() alone: ranking, wrappers as context, fix fallbacks."""

from __future__ import annotations

from pathlib import Path

from vllm_doctor.data import Diagnosis, Evidence, Fix, Match
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.knowledge.diagnose import diagnose, rank, render_fix
from vllm_doctor.matching.loader import parse


def d(rule: str, severity: str = "blocker", priority: int = 50, line: int = 1, wrapper: bool = False) -> Diagnosis:
    return Diagnosis(rule, "c", severity, "high", "t", "s", "e", [Evidence(line, f"line {line}")], {}, [],
                     priority=priority, first_line=line, wrapper=wrapper)  # fmt: skip


def test_rank_orders_by_severity_then_priority_then_line():
    out = rank(
        [
            d("info", "info"),
            d("warn", "warning"),
            d("late", line=9),
            d("early", line=2),
            d("urgent", priority=90, line=50),
        ]
    )
    assert [x.rule for x in out] == ["urgent", "early", "late", "warn", "info"]


def test_a_wrapper_yields_to_a_real_cause_and_becomes_its_context():
    out = rank([d("engine-dead", wrapper=True, priority=99, line=30), d("cause", line=10)])
    assert [x.rule for x in out] == ["cause"]
    assert [e.line for e in out[0].context] == [30]
    alone = rank([d("engine-dead", wrapper=True, line=30), d("note", "info", line=3)])
    assert [x.rule for x in alone] == ["engine-dead", "note"] and alone[1].context == []


def test_a_fix_shows_its_first_variant_whose_names_are_known():
    fix = Fix(action="Use {tp_below}", why="{tp_below} divides it", value="{tp_below}",
              fallbacks=[("Use a power of two", "Powers of two divide most dimensions", None)])  # fmt: skip
    assert render_fix(fix, {"tp_below": 2}) == (("Use 2", "2 divides it", "2"), {"tp_below"})
    assert render_fix(fix, {}) == (("Use a power of two", "Powers of two divide most dimensions", None), set())
    assert render_fix(Fix(action="Use {x}", why="w"), {}) is None


RULE = {
    "id": "heads", "category": "tp-divisibility", "title": "Heads", "explanation": "e", "severity": "blocker",
    "summary": ["{heads} heads on {tp} GPUs; try {tp_below}", "{heads} heads on {tp} GPUs"],
    "anchors": ["attention heads"], "checks": ["tp_sizes"],
    "patterns": [{"regex": r"attention heads \((?P<heads>\d+)\) .{0,40}size \((?P<tp>\d+)\)"}],
    "fixes": [
        {"action": ["Use --tensor-parallel-size {tp_below}", "Use a size that divides {heads}"],
         "value": ["{tp_below}", ""], "flag": "--tensor-parallel-size", "why": "It divides the heads."},
        {"action": "Never shown", "why": "w", "when": "tp_above > 100"},
    ],
}  # fmt: skip


def test_diagnose_runs_the_checks_and_renders_summary_and_fixes():
    rule = parse(RULE, Path("heads.toml"), checks=CHECKS)
    match = Match(rule, [Evidence(5, "x")], {"heads": 40, "tp": 3}, 1, 5)
    [out] = diagnose([rule], {"heads": match}, Facts())
    assert out.summary == "40 heads on 3 GPUs; try 2"
    assert [(f.rank, f.action, f.value) for f in out.fixes] == [(1, "Use --tensor-parallel-size 2", "2")]
    assert out.numbers["valid_tp_sizes"] == [1, 2, 4, 5, 8] and out.numbers["tp_below"] == 2
    # with no smaller size the fix falls back to its generic variant
    one = Match(rule, [Evidence(5, "x")], {"heads": 40, "tp": 1}, 1, 5)
    [out] = diagnose([rule], {"heads": one}, Facts())
    assert out.summary == "40 heads on 1 GPUs"
    assert [(f.action, f.value, f.flag) for f in out.fixes] == [
        ("Use a size that divides 40", None, "--tensor-parallel-size")
    ]


def test_a_blocker_the_lifetime_got_past_is_an_info_note_of_what_it_means():
    rule = parse(
        {**RULE, "survived": ["{heads} heads noted, and the server served"]}, Path("heads.toml"), checks=CHECKS
    )
    match = Match(rule, [Evidence(5, "x")], {"heads": 40, "tp": 3}, 1, 5)
    [failed] = diagnose([rule], {"heads": match}, Facts())
    assert failed.severity == "blocker" and failed.fixes
    ready = Facts()
    ready.phases.append((9, 0, "ready", "APIServer"))  # ready at line 9, after the match at line 5
    [note] = diagnose([rule], {"heads": match}, ready)
    assert (note.severity, note.summary, note.fixes) == ("info", "40 heads noted, and the server served", [])
    before = Facts()
    before.phases.append((3, 0, "ready", "APIServer"))  # ready before the error: the error is what ended it
    assert diagnose([rule], {"heads": match}, before)[0].severity == "blocker"
    bare = Facts()  # uvicorn's unprefixed ready on stderr: a capture of both streams may put it last
    bare.phases.append((9, 0, "ready", None))
    assert diagnose([rule], {"heads": match}, bare)[0].severity == "blocker"
    plain = parse(RULE, Path("heads.toml"), checks=CHECKS)  # no `survived` text: the summary, and that it was got past
    [note] = diagnose([plain], {"heads": Match(plain, [Evidence(5, "x")], {"heads": 40, "tp": 1}, 1, 5)}, ready)
    assert note.severity == "info" and note.summary.endswith("it became ready or served after line 5.")
