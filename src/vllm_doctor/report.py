"""The report as data (JSON contract vllm-doctor/report/1) and as a Markdown ticket."""

from __future__ import annotations

import json
from typing import Any

from .data import Diagnosis, Evidence, Report
from .expr import fmt

SCHEMA = "vllm-doctor/report/1"


def _evidence(e: Evidence, report: Report) -> dict[str, Any]:
    out: dict[str, Any] = {"line": e.line, "text": e.text}
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
            {"rank": f.rank, "action": f.action, "flag": f.flag, "value": f.value, "why": f.why} for f in d.fixes
        ],
    }


def to_dict(report: Report) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "input": {"paths": report.paths, "lines": report.lines, "warnings": report.warnings},
        "status": report.status,
        "diagnoses": [_diagnosis(d, report) for d in report.diagnoses],
        "facts": report.facts,
    }


def to_json(report: Report) -> str:
    return json.dumps(to_dict(report), indent=2, ensure_ascii=False, default=str) + "\n"


def headline(report: Report) -> str:
    top = next((d for d in report.diagnoses if d.severity != "info"), None)
    if top is None:
        return {"healthy": "healthy: no failure found", "unknown": "no vLLM output recognised"}.get(
            report.status, report.status
        )
    return f"{report.status}: {top.category} ({top.severity})"


def describe_input(report: Report) -> str:
    f = report.facts
    parts = [", ".join(report.paths) + f" ({report.lines:,} lines)"]
    if f.get("vllm_version"):
        parts.append(f"vLLM {f['vllm_version']}")
    if f.get("model"):
        parts.append(f"model {f['model']}")
    return " · ".join(parts)


def capacity_line(report: Report) -> str | None:
    kv = report.facts.get("kv_cache") or {}
    budget = report.facts.get("concurrency") or {}
    tokens = kv.get("tokens")
    if tokens is None:
        return None
    text = f"KV cache {tokens:,} tokens"
    if kv.get("gpu_blocks") is not None:
        text += f" ({kv['gpu_blocks']:,} blocks)"
    if kv.get("max_concurrency") is not None and kv.get("concurrency_tokens"):
        text += f" · max concurrency {fmt(kv['max_concurrency'])}x at {kv['concurrency_tokens']:,} tokens"
    elif budget.get("worst_case_sequences") is not None:
        text += f" · {budget['worst_case_sequences']} sequences of {budget['max_model_len']:,} tokens"
    if budget.get("target_concurrency"):
        verdict = "holds" if budget["can_hold_target"] else f"is {budget['missing_tokens']:,} tokens short of"
        text += f" · {verdict} {budget['target_concurrency']} x {budget['target_len']:,} tokens"
    return text


def to_markdown(report: Report) -> str:
    out = [f"## vllm-doctor: {headline(report)}", "", f"**Input:** {describe_input(report)}", ""]
    for w in report.warnings:
        out += [f"> Note: {w}", ""]
    cap = capacity_line(report)
    if not report.diagnoses:
        out += ["No failure found in this log." if report.status == "healthy" else "No vLLM output recognised.", ""]
    for d in report.diagnoses:
        out += [f"### {d.severity.capitalize()}: {d.title}", ""]
        out += [f"`{d.category}` · rule `{d.rule}` · {d.confidence} confidence", "", d.summary, ""]
        if d.fixes:
            out.append("**Fixes, in order**")
            out.append("")
            for f in d.fixes:
                out.append(f"{f.rank}. **{f.action}** — {f.why}")
            out.append("")
        if d.numbers:
            out += ["| number | value |", "|---|---|"]
            out += [f"| {k} | {fmt(v)} |" for k, v in d.numbers.items()]
            out.append("")
        lines = [f"{_where(e, report)}: {e.text}" for e in d.evidence]
        lines += [f"{_where(e, report)}: {e.text}   (wrapper error; the cause is above)" for e in d.context]
        if lines:
            out += [f"<details><summary>Evidence ({len(lines)} lines)</summary>", "", "```"]
            out += lines
            out += ["```", "", "</details>", ""]
    if cap:
        out += [f"**Capacity:** {cap}", ""]
    return "\n".join(out)


def _where(e: Evidence, report: Report) -> str:
    return f"{report.paths[e.source]}:{e.line}" if len(report.paths) > 1 else f"line {e.line}"
