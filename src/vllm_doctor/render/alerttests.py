"""`vllm-doctor alerts --tests`: a promtool unit-test file for the rules alerts.py writes with the
same options (`promtool test rules FILE`). Each alert gets series that make it fire, at the
thresholds given, on a server whose labels satisfy the --selector and carry every --by label,
and the labels and annotations promtool must see: the alert's own, the --label ones, the --by
ones and the description as Prometheus renders its template for those numbers. The two queue
alerts each also check that the other stays silent: a full cache is not the sequence cap.
"""

from __future__ import annotations

import json
import math
import re

from vllm_doctor.errors import DoctorError
from vllm_doctor.render.alerts import KV_FULL, Alert, Scope, Thresholds, alerts, rule_annotations, rule_labels

EVAL = "30m"  # long past the window and the `for:` of every alert
SAMPLES = 40  # a sample a minute, past EVAL


def render(rules_file: str, thresholds: Thresholds | None = None, scope: Scope | None = None) -> str:
    """The test file; `rules_file` is the rules file's path as promtool finds it from the test file."""
    t, s = thresholds or Thresholds(), scope or Scope()
    server = _server(s)
    out = [f"rule_files: [{json.dumps(rules_file)}]", "evaluation_interval: 1m", "tests:"]
    every = {a.alert: a for a in alerts(t, s)}
    for a in every.values():
        series, value = _firing(a, t, server, s)
        out += ["  - interval: 1m", "    input_series:"]
        out += [f"      - series: {json.dumps(name)}\n        values: {json.dumps(values)}" for name, values in series]
        out += ["    alert_rule_test:", f"      - eval_time: {EVAL}", f"        alertname: {a.alert}"]
        exp_labels = {**rule_labels(a, s), **{k: server[k] for k in s.by}}
        exp = {**rule_annotations(a, s), "description": _described(a.description, value, server)}
        out += ["        exp_alerts:", f"          - exp_labels: {json.dumps(exp_labels)}"]
        out += [f"            exp_annotations: {json.dumps(exp)}"]
        other = {"VllmWaitingWithCacheFull": "VllmWaitingAtSequenceCap"}.get(a.alert) or (
            "VllmWaitingWithCacheFull" if a.alert == "VllmWaitingAtSequenceCap" else None
        )
        if other:
            out += [f"      - eval_time: {EVAL}", f"        alertname: {other}", "        exp_alerts: []"]
    return "\n".join(out) + "\n"


def _server(s: Scope) -> dict[str, str]:
    """One server's labels: each --by label a value, the selector's matchers satisfied."""
    out = {k: f"test-{k}" for k in s.by} | {"instance": "vllm-0:8000", "model_name": "m"}
    for k, op, v in s.selector:
        if op == "=":
            out[k] = v
        elif op == "=~":
            out[k] = _matching(k, v)
        elif op in ("!=", "!~") and _matches(op, v, out.get(k, "")):
            out[k] = "test-other"
            if _matches(op, v, out[k]):
                raise DoctorError(f"--tests: no label value satisfies {k}{op}{json.dumps(v)}")
    return out


def _matches(op: str, pattern: str, value: str) -> bool:
    """Whether `value` fails a negative matcher (`!=`, `!~`)."""
    return value == pattern if op == "!=" else re.fullmatch(pattern, value) is not None


def _matching(label: str, pattern: str) -> str:
    """A value the regex matcher accepts: one of its alternatives, when one is a plain word."""
    for word in [pattern, *pattern.split("|")]:
        if re.fullmatch(r"[\w.:/-]*", word) and re.fullmatch(pattern, word):
            return word
    raise DoctorError(f'--tests: give {label}="VALUE" in the selector for the tests (cannot pick a value for =~)')


def _labels(name: str, server: dict[str, str], **more: str) -> str:
    return name + "{" + ", ".join(f"{k}={json.dumps(v)}" for k, v in {**server, **more}.items()) + "}"


def _firing(a: Alert, t: Thresholds, server: dict[str, str], s: Scope) -> tuple[list[tuple[str, str]], float]:
    """The input series that make `a` fire, and the value its expression then has."""
    if a.alert in ("VllmWaitingWithCacheFull", "VllmWaitingAtSequenceCap"):
        full = a.alert == "VllmWaitingWithCacheFull"
        waiting, kv = (11, max(0.95, KV_FULL)) if full else (10, min(0.19, KV_FULL / 2))
        return [
            (_labels("vllm:num_requests_waiting", server), f"{waiting}x{SAMPLES}"),
            (_labels("vllm:kv_cache_usage_perc", server), f"{kv}x{SAMPLES}"),
        ], waiting
    if a.alert == "VllmPreemptionRate":
        per_min = math.ceil(t.preemptions_per_min) + 5
        return [(_labels("vllm:num_preemptions_total", server), f"0+{per_min}x{SAMPLES}")], per_min
    # a histogram whose observations all fall in (low, low + 20 * unit]: its p95 is low + 19 units
    limit, name = (t.queue_seconds, "vllm:request_queue_time_seconds_bucket")
    if a.alert == "VllmTpotOverBudget":
        limit, name = (t.tpot_budget_ms / 1000, "vllm:inter_token_latency_seconds_bucket")
    unit = 10 ** math.floor(math.log10(limit))  # a round step at the limit's scale
    low = (math.floor(limit / unit) + 1) * unit
    high = low + 20 * unit
    series = [
        (_labels(name, server, le=_le(low)), f"0x{SAMPLES}"),
        (_labels(name, server, le=_le(high)), f"0+10x{SAMPLES}"),
        (_labels(name, server, le="+Inf"), f"0+10x{SAMPLES}"),
    ]
    return series, low + 19 * unit


def _le(x: float) -> str:
    return f"{x:.12g}"


def _described(template: str, value: float, server: dict[str, str]) -> str:
    """The description as Prometheus renders it for this value and server (the forms alerts.py uses)."""
    text = template.replace("{{ $labels.instance }}", server["instance"])
    text = text.replace('{{ $value | printf "%.1f" }}', f"{value:.1f}")
    text = text.replace("{{ $value | humanizeDuration }}", _duration(value))
    return text.replace("{{ $value }}", f"{value:g}")


def _duration(v: float) -> str:
    """Prometheus' humanizeDuration, for the values tests use (under a minute)."""
    if v >= 1:
        return f"{v:.4g}s"
    prefix = ""
    for p in ("m", "u", "n"):
        if v >= 1:
            break
        prefix, v = p, v * 1000
    return f"{v:.4g}{prefix}s"
