"""The lines every format shows in its own markup: the headline, the input, the model, the
capacity arithmetic, this machine's GPUs, and where an evidence line stands."""

from __future__ import annotations

from vllm_doctor.data import Evidence, Report
from vllm_doctor.matching.expr import fmt


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


def where(e: Evidence, report: Report, prefix: str = "") -> str:
    """An evidence line's place: `path:line` when several inputs were read, else the line number."""
    return f"{report.paths[e.source]}:{e.line}" if len(report.paths) > 1 else f"{prefix}{e.line}"
