"""One test per fixture in fixtures/logs/<category>/: the log and, beside it, what it must give.

Adding a case is adding two files, `<name>.log` (or .log.gz, .json, .txt) and `<name>.expect.toml`,
and writing its snapshot of every diagnosis (test_snapshots.py says how):

    category = "cache-oom"          # the top blocker/warning's category, or "healthy"
    rule = "kv-cache-too-small-for-max-len"   # optional: the top diagnosis's rule
    severity = "blocker"            # optional
    status = "failed"               # optional
    lifetimes = 1                   # optional: the server lifetimes the input was split into
    not_rules = ["engine-dead"]     # optional: rules that must not be reported
    also_rules = ["kv-capacity"]    # optional: rules that must be reported too (e.g. info ones)
    config = "qwen2.5-7b"           # optional: read with fixtures/configs/<name>/config.json (--config)
    [facts]                         # optional: report facts by dotted path
    "kv_cache.tokens" = 8192
    [numbers]                       # optional: numbers of the top diagnosis
    fit_max_model_len = 8064
    [first_fix]                     # optional: its first fix
    flag = "--max-model-len"
    value = "8064"
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.render.json import to_dict

LOGS = FIXTURES / "logs"


def cases() -> list[tuple[Path, Path]]:
    out = []
    for expect in sorted(LOGS.rglob("*.expect.toml")):
        base = expect.name[: -len(".expect.toml")]
        inputs = [p for p in expect.parent.iterdir() if p.name.startswith(base + ".") and p != expect]
        assert len(inputs) == 1, f"{expect}: expected one input file named {base}.*, found {inputs}"
        out.append((inputs[0], expect))
    return out


CASES = cases()


def top(report: dict) -> dict | None:
    return next((d for d in report["diagnoses"] if d["severity"] in ("blocker", "warning")), None)


def dig(obj, dotted: str):
    for key in dotted.split("."):
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


@pytest.mark.parametrize(("log", "expect"), CASES, ids=[f"{c[0].parent.name}/{c[0].name}" for c in CASES])
def test_fixture(log: Path, expect: Path, run):
    want = tomllib.loads(expect.read_text())
    config = FIXTURES / "configs" / want["config"] / "config.json" if "config" in want else None
    report = to_dict(run(log, options=Options(config=str(config)) if config else None))
    first = top(report)
    got_category = first["category"] if first else "healthy"
    assert got_category == want["category"], f"diagnoses: {[(d['rule'], d['severity']) for d in report['diagnoses']]}"
    if want["category"] != "healthy":
        assert log.parent.name == want["category"], "a fixture lives in the folder of its category"
    if "rule" in want:
        assert first and first["rule"] == want["rule"]
    if "severity" in want:
        assert first and first["severity"] == want["severity"]
    if "status" in want:
        assert report["status"] == want["status"]
    if "lifetimes" in want:
        assert len(report["lifetimes"]) == want["lifetimes"], [(x["index"], x["outcome"]) for x in report["lifetimes"]]
    fired = {d["rule"] for d in report["diagnoses"]}
    for rule in want.get("not_rules", []):
        assert rule not in fired, f"{rule} must not fire"
    for rule in want.get("also_rules", []):
        assert rule in fired, f"{rule} must fire"
    for path, value in want.get("facts", {}).items():
        assert dig(report["facts"], path) == value, f"fact {path}"
    for name, value in want.get("numbers", {}).items():
        assert first and first["numbers"].get(name) == value, f"number {name}: {first and first['numbers']}"
    if "first_fix" in want:
        fix = first["fixes"][0]
        for key, value in want["first_fix"].items():
            assert fix[key] == value, f"first fix {key}: {fix}"


def test_every_diagnosis_rule_has_a_fixture_that_triggers_it(rules, run):
    fired: set[str] = set()
    for log in [c[0] for c in CASES] + sorted(LAB.glob("*.log")):
        fired |= {d.rule for d in run(log).diagnoses}
    from test_scrapes import fired_rules  # the runtime rules fire on scrape series

    fired |= fired_rules()
    from test_gpu_sharing import fired_rules as sharing_rules  # gpu-sharing needs processes on this machine

    fired |= sharing_rules()
    untested = sorted(r.id for r in rules if r.kind == "diagnosis" and r.id not in fired)
    assert not untested, f"rules no fixture triggers: {untested}"


def test_healthy_fixtures_get_nothing_above_info(run):
    """A server that became ready, served and shut down on request (or still serves) gets nothing
    above info from any built-in rule: every healthy fixture and every healthy lab recording."""
    import json

    healthy = [log for log, expect in CASES if tomllib.loads(expect.read_text())["category"] == "healthy"]
    lab = [json.loads(line) for line in (LAB / "cases.jsonl").read_text().splitlines() if line.strip()]
    healthy += [LAB / c["file"] for c in lab if c["category"] == "healthy"]
    assert len(healthy) > len(CASES) // 10 and any(p.parent == LAB for p in healthy)
    for log in healthy:
        loud = [(d.rule, d.severity) for d in run(log).diagnoses if d.severity != "info"]
        assert not loud, f"{log.name}: {loud}"
