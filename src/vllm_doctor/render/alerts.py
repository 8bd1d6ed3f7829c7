"""`vllm-doctor alerts`: Prometheus alerting rules for the conditions this tool diagnoses, as a
plain rules file or a PrometheusRule manifest (prometheus-operator, `--format k8s`).

The alerts watch the numbers that tell a queue from a healthy server (waiting, KV usage,
preemptions, queue time, inter-token latency), not GPU utilisation, which reads 100% on a healthy
busy server too. Each expression covers the renames by version (shared/vllm-reference/metrics.md):
`kv_cache_usage_perc` or `gpu_cache_usage_perc`, `inter_token_latency_seconds` or
`time_per_output_token_seconds`. `promtool check rules` accepts the output (tests/render/test_alerts.py).
The output is YAML written by hand: every string is a JSON string, which YAML reads as it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from vllm_doctor.facts import KV_NEAR_FULL_PCT

BY = "instance, model_name"  # one alert per server and model
KV = f"(max by ({BY}) (vllm:kv_cache_usage_perc) or max by ({BY}) (vllm:gpu_cache_usage_perc))"
WAITING = f"sum by ({BY}) (vllm:num_requests_waiting)"
KV_FULL = KV_NEAR_FULL_PCT / 100  # the diagnosis's "near full", as the gauge's fraction


@dataclass(frozen=True)
class Thresholds:
    tpot_budget_ms: float = 100.0  # --tpot-budget
    queue_seconds: float = 5.0  # --queue-budget
    preemptions_per_min: float = 1.0
    window: str = "5m"  # the rate() window
    hold: str = "10m"  # the `for:` of each alert


def _rules(t: Thresholds) -> list[dict[str, str]]:
    w = t.window
    itl = f"rate(vllm:inter_token_latency_seconds_bucket[{w}]) or rate(vllm:time_per_output_token_seconds_bucket[{w}])"
    return [
        {
            "alert": "VllmWaitingWithCacheFull",
            "expr": f"({WAITING} > 0) and on ({BY}) ({KV} >= {KV_FULL})",
            "summary": "Requests wait while the KV cache is near full (queue-saturation)",
            "description": "{{ $value }} requests waiting on {{ $labels.instance }} with the KV cache at or over "
            f"{KV_FULL:.0%}: the cache limits concurrency. Run vllm-doctor explain on its log or /metrics.",
        },
        {
            "alert": "VllmWaitingAtSequenceCap",
            "expr": f"({WAITING} > 0) and on ({BY}) ({KV} < {KV_FULL})",
            "summary": "Requests wait while the KV cache has room (queue-sequence-cap or token budget)",
            "description": "{{ $value }} requests waiting on {{ $labels.instance }} while the KV cache has room: "
            "--max-num-seqs or --max-num-batched-tokens limits the batch, not the cache.",
        },
        {
            "alert": "VllmPreemptionRate",
            "expr": f"sum by ({BY}) (rate(vllm:num_preemptions_total[{w}])) * 60 >= {t.preemptions_per_min:g}",
            "summary": "Sequences are preempted (evicted and recomputed)",
            "description": '{{ $value | printf "%.1f" }} preemptions a minute on {{ $labels.instance }}: the KV '
            "cache is too small for the running batch.",
        },
        {
            "alert": "VllmQueueTimeHigh",
            "expr": f"histogram_quantile(0.95, sum by (le, {BY}) (rate(vllm:request_queue_time_seconds_bucket[{w}]))) "
            f"> {t.queue_seconds:g}",
            "summary": f"Queue time p95 over {t.queue_seconds:g} s",
            "description": 'Requests on {{ $labels.instance }} wait {{ $value | printf "%.1f" }} s (p95) before '
            "they are scheduled: capacity, not prompt length, makes their time to first token.",
        },
        {
            "alert": "VllmTpotOverBudget",
            "expr": f"histogram_quantile(0.95, sum by (le, {BY}) ({itl})) > {t.tpot_budget_ms / 1000:g}",
            "summary": f"Inter-token latency p95 over the {t.tpot_budget_ms:g} ms budget",
            "description": "Inter-token latency p95 {{ $value | humanizeDuration }} on {{ $labels.instance }}: a "
            "smaller --max-num-seqs shortens each decode step.",
        },
    ]


def _group(t: Thresholds, indent: str) -> list[str]:
    out = [f"{indent}- name: vllm-doctor", f"{indent}  rules:"]
    for r in _rules(t):
        out += [
            f"{indent}    - alert: {r['alert']}",
            f"{indent}      expr: {json.dumps(r['expr'])}",
            f"{indent}      for: {t.hold}",
            f"{indent}      labels:",
            f"{indent}        severity: warning",
            f"{indent}      annotations:",
            f"{indent}        summary: {json.dumps(r['summary'])}",
            f"{indent}        description: {json.dumps(r['description'])}",
        ]
    return out


def render(fmt: str = "rules", thresholds: Thresholds | None = None, namespace: str = "monitoring") -> str:
    """The rules file (`fmt` "rules") or a PrometheusRule manifest ("k8s")."""
    t = thresholds or Thresholds()
    if fmt == "k8s":
        head = [
            "apiVersion: monitoring.coreos.com/v1",
            "kind: PrometheusRule",
            "metadata:",
            "  name: vllm-doctor",
            f"  namespace: {json.dumps(namespace)}",
            "spec:",
            "  groups:",
        ]
        return "\n".join(head + _group(t, "    ")) + "\n"
    return "\n".join(["groups:", *_group(t, "  ")]) + "\n"
