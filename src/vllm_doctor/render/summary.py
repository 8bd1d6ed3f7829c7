"""The lines every format shows in its own markup: the headline, the input, the model, the
capacity arithmetic, this machine's GPUs, and where an evidence line stands."""

from __future__ import annotations

import os
import re

from vllm_doctor.data import Evidence, Report
from vllm_doctor.matching.expr import fmt


def headline(report: Report) -> str:
    preflight = report.facts.get("preflight")
    if isinstance(preflight, dict):  # `vllm-doctor check`: a start that has not happened yet
        return str(preflight["headline"])
    top = next((d for d in report.diagnoses if d.severity != "info"), None)
    if report.empty:
        return "unknown: the input is empty (nothing to diagnose)"
    if top is None:
        shown = _shown(report)
        if report.status == "unknown" and shown is not None:
            return f"unknown: {shown.outcome}, with no error and no sign of why"
        cut = (report.facts.get("metrics") or {}).get("samples_not_read")
        if report.status == "unknown" and cut:
            return f"unknown: the scrape was cut ({cut:,} samples not read); no failure in the part read"
        text = {"healthy": "healthy: no failure found", "unknown": "unknown: no vLLM output recognised"}.get(
            report.status, report.status
        )
        return text + _after(report)
    return f"{report.status}: {top.category} ({top.severity})" + _after(report)


def _after(report: Report) -> str:
    """What came before the start shown: " (start 3 of 3; 2 earlier starts failed)"."""
    if len(report.lifetimes) < 2 or not report.shown:
        return ""
    servers = {life.space for life in report.lifetimes}
    if len(servers) > 1:  # several inputs, several servers: the worst one is shown
        shown = report.lifetimes[report.shown - 1]
        failed = len({life.space for life in report.lifetimes if life.report.status == "failed"})
        return f" (server {shown.server}, the worst of {len(servers)}; {failed} failed)"
    failed = sum(1 for life in report.lifetimes[: report.shown - 1] if life.report.status == "failed")
    where = f"start {report.shown} of {len(report.lifetimes)}"
    return f" ({where}; {failed} earlier start{'s' if failed != 1 else ''} failed)" if failed else f" ({where})"


def _shown(report: Report):
    return report.lifetimes[report.shown - 1] if report.lifetimes and report.shown else None


def timeline(report: Report) -> list[str]:
    """The server's starts, one phrase each, when the input holds more than one (or the one ended
    with no sign of why): "3 starts: #1 01:54 cache-oom, #2 01:58 port-in-use, #3 02:03 serving since 02:04"."""
    lives = report.lifetimes
    out: list[str] = []
    servers = {life.space for life in lives}
    if len(servers) > 1:  # one line per server, each named by its input
        for space in sorted(servers):
            mine = [life for life in lives if life.space == space]
            parts = [f"#{life.index} {_hhmm(life.started)} {life.outcome}" for life in mine]
            out.append(f"server {mine[0].server}: " + ", ".join(parts))
    elif len(lives) > 1:
        parts = [f"#{life.index} {_hhmm(life.started)} {life.outcome}" for life in lives]
        out.append(f"{len(lives)} starts: " + ", ".join(parts))
        if report.shown and report.shown != len(lives):
            out.append(f"showing start #{report.shown} (--lifetime {report.shown}); the latest is #{len(lives)}")
    if report.crash_loop:
        cause, first, last = report.crash_loop
        out.append(f"crash loop: starts #{first}-#{last} all failed with {cause} ({last - first + 1} times in a row)")
    shown = _shown(report)
    if shown is not None and shown.note:
        out.append(f"start #{shown.index}: {shown.note}" if len(lives) > 1 else shown.note[:1].upper() + shown.note[1:])
    return out


def _hhmm(time: str | None) -> str:
    return time[6:11] if time and len(time) >= 11 else "--:--"


def nothing(report: Report) -> str:
    """What a report with no diagnosis says instead."""
    if report.status == "healthy":
        return "No failure found in this log."
    if report.empty:
        return "The input is empty."
    return "No failure found, and no sign of why it stopped." if report.lifetimes else "No vLLM output recognised."


def describe_input(report: Report) -> str:
    f = report.facts
    if isinstance(f.get("preflight"), dict):
        return str(f["preflight"]["input"])
    many = f"{len(report.paths)} inputs, " if len(report.paths) > 3 else ""
    parts = [f"{inputs(report.paths)} ({many}{report.lines:,} lines)"]
    if f.get("vllm_version"):
        parts.append(f"vLLM {f['vllm_version']}")
    if f.get("model"):
        parts.append(f"model {f['model']}")
    return " · ".join(parts)


def inputs(paths: list[str]) -> str:
    """The inputs in one phrase: a few by name; a numbered series (12 scrapes) as its first and
    last numbers, `dir/queue.metrics-{0..11}.txt`; other many as the first, … the last."""
    if len(paths) <= 3:
        return ", ".join(paths)
    first, last = paths[0], paths[-1]
    lead = os.path.commonprefix([first, last]).rstrip("0123456789")  # not into a number
    tail = os.path.commonprefix([first[len(lead) :][::-1], last[len(lead) :][::-1]])[::-1].lstrip("0123456789")
    a, b = first[len(lead) : len(first) - len(tail)], last[len(lead) : len(last) - len(tail)]
    if a.isdigit() and b.isdigit() and paths == [f"{lead}{n}{tail}" for n in range(int(a), int(b) + 1)]:
        return f"{lead}{{{a}..{b}}}{tail}"
    return f"{first}, … {last}"


def model_line(report: Report) -> str | None:
    """The model's shape from its config.json, or why there is none."""
    m = report.facts.get("model_shape")
    if not isinstance(m, dict):
        return None
    if m.get("layers") is None:
        return f"Model config: {m['note']}" if m.get("note") else None
    heads = f"{m['attention_heads']} attention heads, " if m.get("attention_heads") else ""
    text = f"Model {m.get('name') or '?'} ({m.get('source')}): {m['layers']} layers, {heads}{m['kv_heads']} KV heads, head dim {m['head_dim']}"
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
    if gpu.get("this_host") is False:
        out.append(
            "This machine's GPUs (not the log's machine: they inform no fix; --this-host if the log is from here):"
        )
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
    """An evidence line's place: `path:line` when several inputs were read, else the line number;
    a scrape's, its file (its evidence line says which scrape it was)."""
    if len(report.paths) > 1 and "metrics" in report.facts:
        return report.paths[e.source]
    return f"{report.paths[e.source]}:{e.line}" if len(report.paths) > 1 else f"{prefix}{e.line}"


# vLLM's logger prefix, "(EngineCore pid=15848) ERROR 11-30 01:54:29 [core.py:1510] " and its
# older forms: on a narrow screen the message is what matters, the line number finds the rest
_PREFIX = re.compile(
    r"^(?:\([^)]{1,80}\)\s+)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+)?(?:\d{4}-)?\d\d-\d\d\s+"
    r"\d\d:\d\d:\d\d(?:[.,]\d+)?\s+(?:\[[^\]]{1,80}\]\s*|[\w.]{1,80}:\d+\]\s*)?"
)


def message(text: str) -> str:
    """An evidence line without vLLM's logger prefix (process, level, time, source)."""
    rest = _PREFIX.sub("", text, count=1)
    return rest if rest.strip() else text


def distinct_evidence(evidence: list[Evidence]) -> list[Evidence]:
    """Evidence with repeats dropped: the same message logged twice (by the engine with its
    prefix, then by the API server as the traceback's last line; either cut short) is shown once."""
    out: list[Evidence] = []
    keys: list[str] = []
    for e in evidence:
        key = " ".join(message(e.text).split())
        if any(key.startswith(k) or k.startswith(key) for k in keys):
            continue
        keys.append(key)
        out.append(e)
    return out


def earlier_lives(report: Report) -> list[tuple[str, list[str]]]:
    """With --lifetime all: each start other than the one shown, as a title and its diagnoses'
    lines (headline, summary, first fix)."""
    if not report.all_lifetimes:
        return []
    out = []
    for life in report.lifetimes:
        if life.index == report.shown:
            continue
        title = f"Start #{life.index} ({life.started or 'no time'}, lines {life.lines[0]}-{life.lines[1]}): "
        title += f"{life.report.status}, {life.outcome}"
        lines = []
        for d in life.report.diagnoses:
            if d.severity == "info":
                continue
            lines.append(f"{d.severity.upper()} {d.title} ({d.category}): {d.summary}")
            if d.fixes:
                lines.append(f"first fix: {d.fixes[0].action}")
        if life.note:
            lines.append(life.note)
        out.append((title, lines))
    return out


def corrected_command(report: Report, redact: bool = True) -> tuple[str, str] | None:
    """(what it is, the serve line with the top fix applied, secrets masked) when the log has a command."""
    c = report.corrected
    if c is None:
        return None
    line = c.line
    if redact:
        from vllm_doctor.render.redact import redact as mask

        line = mask(line)
    return f"Corrected command (fix {c.fix} applied: {c.change})", line
