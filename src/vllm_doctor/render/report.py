"""The report as data (JSON contract vllm-doctor/report/1) and as a Markdown ticket."""

from __future__ import annotations

import json
from typing import Any

from vllm_doctor.data import Diagnosis, Evidence, Report
from vllm_doctor.matching.expr import fmt

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


def to_json(report: Report, redact: bool = True) -> str:
    """The JSON contract; secrets (tokens, API keys, passwords) masked unless redact=False."""
    data = to_dict(report)
    if redact:
        from vllm_doctor.render.redact import Redactor

        data = Redactor().obj(data)
    return json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n"


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


def model_line(report: Report) -> str | None:
    """The model's shape from its config.json, or why there is none."""
    m = report.facts.get("model_shape")
    if not isinstance(m, dict):
        return None
    if m.get("layers") is None:
        return f"Model config: {m['note']}" if m.get("note") else None
    heads = f" of {m['attention_heads']}" if m.get("attention_heads") else ""
    text = f"Model {m.get('name') or '?'} ({m.get('source')}): {m['layers']} layers, {m['kv_heads']} KV heads{heads}, head dim {m['head_dim']}"
    if m.get("kv_bytes_per_token"):
        text += f", {m['kv_bytes_per_token']:,} B/token"
    if m.get("params"):
        from vllm_doctor.capacity.arithmetic import fmt_params

        text += f", {fmt_params(m['params'])} params ({m.get('params_source')})"
    return text


def work_rows(report: Report) -> list[tuple[str, str, str]]:
    """The capacity arithmetic behind the prediction, as (step, work, value) rows."""
    cap = report.facts.get("capacity") or {}
    return [(w["name"], w["work"], w["value"]) for w in cap.get("work") or []]


def gpu_lines(gpu: dict | None) -> list[str]:
    """This machine's GPUs from NVML (facts.gpu), or the one line saying why they were skipped."""
    if not isinstance(gpu, dict):
        return []
    if not gpu.get("available"):
        return [f"GPU checks skipped: {gpu.get('reason')}"]
    out = []
    for d in gpu.get("devices") or []:
        procs = ", ".join(
            f"{p['pid']} {p['name']} {'?' if p['used_mib'] is None else format(p['used_mib'], ',')} MiB"
            for p in d["processes"]
        )
        out.append(
            f"GPU {d['index']} {d['name']} (this machine, now): {d['total_mib']:,} MiB total, {d['used_mib']:,} used, "
            f"{d['free_mib']:,} free" + (f"; processes: {procs}" if procs else "; no processes")
        )
    if gpu.get("driver_version"):
        out.append(f"driver {gpu['driver_version']}, CUDA {gpu.get('cuda_version') or '?'}")
    return out


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


def to_markdown(report: Report, redact: bool = True) -> str:
    """The ticket text; secrets masked unless redact=False (line for line, so nothing moves)."""
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
    out += _markdown_work(report)
    text = "\n".join(out)
    if redact:
        from vllm_doctor.render.redact import redact as mask

        text = mask(text)
    return text


def _markdown_work(report: Report) -> list[str]:
    out: list[str] = []
    line = model_line(report)
    if line:
        out += [f"**{line}**", ""]
    rows = work_rows(report)
    if rows:
        out += ["| step | work | value |", "|---|---|---|"]
        out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
        out.append("")
        explanation = (report.facts.get("capacity") or {}).get("explanation")
        if explanation:
            out += [f"Predicted vs logged: {explanation}", ""]
    out += [f"> {g}" for g in gpu_lines(report.facts.get("gpu"))]
    return out + [""] if out and out[-1] != "" else out


def _where(e: Evidence, report: Report) -> str:
    return f"{report.paths[e.source]}:{e.line}" if len(report.paths) > 1 else f"line {e.line}"
