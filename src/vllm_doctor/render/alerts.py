"""`vllm-doctor alerts`: Prometheus alerting rules for the conditions this tool diagnoses, as a
plain rules file or a PrometheusRule manifest (prometheus-operator, `--format k8s`), ready to
deploy as they are (monitoring-mixins conventions): each alert has a `severity` label, a
`summary`, a `description` and a `runbook_url` (the documentation of the vllm-doctor rule that
diagnoses the same condition), keeps the labels named by `--by` (namespace, pod, job) beside
instance and model_name, carries the `--label`s (on the PrometheusRule's metadata too, for a
ruleSelector) and watches only the series `--selector` matches.

The alerts watch the numbers that tell a queue from a healthy server (waiting, KV usage,
preemptions, queue time, inter-token latency), not GPU utilisation, which reads 100% on a healthy
busy server too. Each expression covers the renames by version (shared/vllm-reference/metrics.md):
`kv_cache_usage_perc` or `gpu_cache_usage_perc`, `inter_token_latency_seconds` or
`time_per_output_token_seconds`. `promtool check rules` accepts the rules file and the
PrometheusRule's spec, `promtool test rules` passes on `alerts --tests` (alerttests.py;
tests/render/test_alerts.py). The output is YAML written by hand: every string is a JSON string,
which YAML reads as it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from vllm_doctor.errors import DoctorError
from vllm_doctor.facts import KV_NEAR_FULL_PCT

BASE_BY = ("instance", "model_name")  # one alert per server and model
KV_FULL = KV_NEAR_FULL_PCT / 100  # the diagnosis's "near full", as the gauge's fraction
# the rule's documentation: `vllm-doctor rules show {rule}` prints the same; --runbook-url points it at yours
RUNBOOK = "https://pypi.org/project/vllm-log-doctor/#{rule}"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
MATCH_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class Thresholds:
    tpot_budget_ms: float = 100.0  # --tpot-budget
    queue_seconds: float = 5.0  # --queue-budget
    preemptions_per_min: float = 1.0
    window: str = "5m"  # the rate() window
    hold: str = "10m"  # the `for:` of each alert


@dataclass(frozen=True)
class Scope:
    """Which series the alerts watch and what they carry: --by, --label, --selector, --runbook-url."""

    by: tuple[str, ...] = BASE_BY
    labels: tuple[tuple[str, str], ...] = ()  # on every rule, and on the PrometheusRule's metadata
    selector: tuple[tuple[str, str, str], ...] = ()  # (label, op, value) matchers on every series
    runbook: str = RUNBOOK

    def group(self) -> str:
        return ", ".join(self.by)

    def series(self, name: str) -> str:
        """A metric with the selector's matchers: `vllm:num_requests_waiting{namespace="llm"}`."""
        if not self.selector:
            return name
        return name + "{" + ",".join(f"{k}{op}{json.dumps(v, ensure_ascii=False)}" for k, op, v in self.selector) + "}"


def scope(by: str | None, labels: list[str], selector: list[tuple[str, str, str]], runbook: str | None) -> Scope:
    """The Scope from the command line's words; a bad label name is one line (DoctorError)."""
    keep = [*BASE_BY, *(w.strip() for w in (by or "").split(",") if w.strip())]
    pairs = []
    for item in labels:
        key, eq, value = item.partition("=")
        if not eq:
            raise DoctorError(f"--label {item!r}: give KEY=VALUE, e.g. team=llm")
        pairs.append((key.strip(), value.strip()))
    for name in [*keep, *(k for k, _ in pairs)]:
        if not LABEL_NAME.match(name) or name.startswith("__"):
            raise DoctorError(f"{name!r}: not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)")
    if any(k in ("severity", *keep) for k, _ in pairs):
        raise DoctorError("--label: severity and the --by labels are the alerts' own")
    if runbook is not None and "{rule}" not in runbook:
        raise DoctorError(f"--runbook-url {runbook!r}: put {{rule}} where the rule's id goes")
    return Scope(tuple(dict.fromkeys(keep)), tuple(pairs), tuple(selector), runbook or RUNBOOK)


@dataclass(frozen=True)
class Alert:
    alert: str
    rule: str  # the vllm-doctor rule that diagnoses the same condition (its runbook)
    expr: str
    summary: str
    description: str
    severity: str = "warning"
    extra: dict[str, str] = field(default_factory=dict)


def alerts(t: Thresholds, s: Scope) -> list[Alert]:
    w, by = t.window, s.group()
    kv = f"(max by ({by}) ({s.series('vllm:kv_cache_usage_perc')}) or max by ({by}) ({s.series('vllm:gpu_cache_usage_perc')}))"
    waiting = f"sum by ({by}) ({s.series('vllm:num_requests_waiting')})"
    itl = (
        f"rate({s.series('vllm:inter_token_latency_seconds_bucket')}[{w}]) "
        f"or rate({s.series('vllm:time_per_output_token_seconds_bucket')}[{w}])"
    )
    queue = f"rate({s.series('vllm:request_queue_time_seconds_bucket')}[{w}])"
    return [
        Alert(
            "VllmWaitingWithCacheFull", "queue-cache-full", f"({waiting} > 0) and on ({by}) ({kv} >= {KV_FULL})",
            "Requests wait while the KV cache is near full (queue-saturation)",
            "{{ $value }} requests waiting on {{ $labels.instance }} with the KV cache at or over "
            f"{KV_FULL:.0%}: the cache limits concurrency. Run vllm-doctor explain on its log or /metrics.",
        ),
        Alert(
            "VllmWaitingAtSequenceCap", "queue-sequence-cap", f"({waiting} > 0) and on ({by}) ({kv} < {KV_FULL})",
            "Requests wait while the KV cache has room (queue-sequence-cap or token budget)",
            "{{ $value }} requests waiting on {{ $labels.instance }} while the KV cache has room: "
            "--max-num-seqs or --max-num-batched-tokens limits the batch, not the cache.",
        ),
        Alert(
            "VllmPreemptionRate", "preemption-rate",
            f"sum by ({by}) (rate({s.series('vllm:num_preemptions_total')}[{w}])) * 60 >= {t.preemptions_per_min:g}",
            "Sequences are preempted (evicted and recomputed)",
            '{{ $value | printf "%.1f" }} preemptions a minute on {{ $labels.instance }}: the KV '
            "cache is too small for the running batch.",
        ),
        Alert(
            "VllmQueueTimeHigh", "ttft-over-budget",
            f"histogram_quantile(0.95, sum by (le, {by}) ({queue})) > {t.queue_seconds:g}",
            f"Queue time p95 over {t.queue_seconds:g} s",
            'Requests on {{ $labels.instance }} wait {{ $value | printf "%.1f" }} s (p95) before '
            "they are scheduled: capacity, not prompt length, makes their time to first token.",
        ),
        Alert(
            "VllmTpotOverBudget", "tpot-over-budget",
            f"histogram_quantile(0.95, sum by (le, {by}) ({itl})) > {t.tpot_budget_ms / 1000:g}",
            f"Inter-token latency p95 over the {t.tpot_budget_ms:g} ms budget",
            "Inter-token latency p95 {{ $value | humanizeDuration }} on {{ $labels.instance }}: a "
            "smaller --max-num-seqs shortens each decode step.",
        ),
    ]  # fmt: skip


def rule_labels(a: Alert, s: Scope) -> dict[str, str]:
    return {"severity": a.severity, **dict(s.labels)}


def rule_annotations(a: Alert, s: Scope) -> dict[str, str]:
    return {"summary": a.summary, "description": a.description, "runbook_url": s.runbook.replace("{rule}", a.rule)}


def _group(t: Thresholds, s: Scope, indent: str) -> list[str]:
    out = [f"{indent}- name: vllm-doctor", f"{indent}  rules:"]
    for a in alerts(t, s):
        out += [
            f"{indent}    - alert: {a.alert}",
            f"{indent}      expr: {json.dumps(a.expr)}",
            f"{indent}      for: {t.hold}",
        ]
        out += [
            f"{indent}      labels:",
            *(f"{indent}        {k}: {json.dumps(v)}" for k, v in rule_labels(a, s).items()),
        ]
        out += [f"{indent}      annotations:"]
        out += [f"{indent}        {k}: {json.dumps(v)}" for k, v in rule_annotations(a, s).items()]
    return out


def render(
    fmt: str = "rules", thresholds: Thresholds | None = None, namespace: str = "monitoring", scope: Scope | None = None
) -> str:
    """The rules file (`fmt` "rules") or a PrometheusRule manifest ("k8s")."""
    t, s = thresholds or Thresholds(), scope or Scope()
    if fmt == "k8s":
        head = ["apiVersion: monitoring.coreos.com/v1", "kind: PrometheusRule", "metadata:", "  name: vllm-doctor"]
        head.append(f"  namespace: {json.dumps(namespace)}")
        if s.labels:  # what a Prometheus' ruleSelector matches
            head += ["  labels:", *(f"    {k}: {json.dumps(v)}" for k, v in s.labels)]
        return "\n".join([*head, "spec:", "  groups:", *_group(t, s, "    ")]) + "\n"
    return "\n".join(["groups:", *_group(t, s, "  ")]) + "\n"
