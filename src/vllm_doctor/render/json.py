"""The report as data: the JSON contract vllm-doctor/report/1 (documented in the README)."""

from __future__ import annotations

import json
from typing import Any

from vllm_doctor.data import Diagnosis, Evidence, Life, Report

SCHEMA = "vllm-doctor/report/1"


def _evidence(e: Evidence, report: Report) -> dict[str, Any]:
    out: dict[str, Any] = {"line": e.line, "text": e.text, "truncated": e.truncated}
    if len(report.paths) > 1:
        out["path"] = report.paths[e.source]
    return out


def _diagnosis(d: Diagnosis, report: Report) -> dict[str, Any]:
    return {
        "rule": d.rule,
        "category": d.category,
        "severity": d.severity,
        "confidence": d.confidence,
        "title": d.title,
        "summary": d.summary,
        "evidence": [_evidence(e, report) for e in d.evidence],
        "context": [_evidence(e, report) for e in d.context],
        "numbers": d.numbers,
        "fixes": [
            {
                "rank": f.rank,
                "action": f.action,
                "flag": f.flag,
                "value": f.value,
                "direction": f.direction,
                "why": f.why,
            }
            for f in d.fixes
        ],
        "dropped_fixes": [{"action": action, "reason": reason} for action, reason in d.dropped],
    }


def _life(life: Life, report: Report) -> dict[str, Any]:
    return {
        "index": life.index,
        "started": life.started,
        "ended": life.ended,
        "outcome": life.outcome,
        "status": life.report.status,
        "ready": life.ready,
        "ready_at": life.ready_at,
        "last_phase": life.last_phase,
        "end": life.end,
        "note": life.note,
        "last_stats": life.last_stats,
        "lines": {"first": life.lines[0], "last": life.lines[1]},
        "server": life.server,
        "diagnoses": [_diagnosis(d, report) for d in life.report.diagnoses],
        "facts": life.report.facts,
    }


def to_dict(report: Report) -> dict[str, Any]:
    """The top level is the lifetime shown (the latest unless --lifetime N); `lifetimes` lists every
    server start of the input with its own diagnoses and facts (additive to report/1)."""
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "input": {"paths": report.paths, "lines": report.lines, "warnings": report.warnings, "empty": report.empty},
        "status": report.status,
        "diagnoses": [_diagnosis(d, report) for d in report.diagnoses],
        "facts": report.facts,
        "lifetime": report.shown,
        "lifetimes": [_life(life, report) for life in report.lifetimes],
        "corrected_command": (
            {"line": c.line, "rule": c.rule, "fix": c.fix, "change": c.change} if (c := report.corrected) else None
        ),
    }
    if report.settings:  # the config file, variables and --rules directories in force (additive)
        out["settings"] = report.settings
    if report.crash_loop:
        cause, first, last = report.crash_loop
        out["crash_loop"] = {"cause": cause, "first": first, "last": last, "times": last - first + 1}
    return out


def render(report: Report, redact: bool = True) -> str:
    """The JSON contract; secrets (tokens, API keys, passwords) masked unless redact=False."""
    data = to_dict(report)
    if redact:
        from vllm_doctor.render.redact import Redactor

        data = Redactor().obj(data)
    from vllm_doctor.render.visible import json_visible

    return json_visible(json.dumps(data, indent=2, ensure_ascii=False, default=str)) + "\n"  # no raw C1 or bidi
