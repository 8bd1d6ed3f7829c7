"""`vllm-doctor alerts`: promtool (Debian's prometheus package, scripts/ci-deps.sh) must accept
the rules, and `promtool test rules` must fire the right alert on the lab's numbers: the saturated
server (waiting 11, KV 95.2%) is cache-full, the capped one (waiting 10, KV 19%) is the sequence cap."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LAB
from vllm_doctor.cli import app
from vllm_doctor.read import metrics

PROMTOOL = shutil.which("promtool")
if PROMTOOL is None and os.environ.get("CI") == "true":
    raise RuntimeError("promtool is missing: scripts/ci-deps.sh installs Debian's prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/ci-deps.sh)")


def alerts(*args: str) -> str:
    r = CliRunner().invoke(app, ["alerts", *args])
    assert r.exit_code == 0, r.output
    return r.output


def promtool(*args: str) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_accepts_the_rules_file(tmp_path: Path):
    path = tmp_path / "rules.yml"
    path.write_text(alerts("--tpot-budget", "50"))
    r = promtool("check", "rules", str(path))
    assert r.returncode == 0 and "SUCCESS: 5 rules found" in r.stdout, r.stdout + r.stderr


@needs_promtool
def test_promtool_accepts_the_prometheusrule_spec(tmp_path: Path):
    text = alerts("--format", "k8s", "--namespace", "llm")
    assert text.startswith("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n")
    assert 'namespace: "llm"' in text
    spec = text[text.index("  groups:") :]
    (tmp_path / "spec.yml").write_text("\n".join(line[2:] for line in spec.splitlines()) + "\n")
    r = promtool("check", "rules", str(tmp_path / "spec.yml"))
    assert r.returncode == 0 and "SUCCESS: 5 rules found" in r.stdout, r.stdout + r.stderr


def _series(instance: str, scrape: metrics.Scrape) -> list[str]:
    labels = f'instance="{instance}", model_name="m"'
    return [
        f"    - series: 'vllm:num_requests_waiting{{{labels}}}'\n      values: '{int(scrape.waiting or 0)}x20'",
        f"    - series: 'vllm:kv_cache_usage_perc{{{labels}}}'\n      values: '{scrape.kv_usage}x20'",
    ]


@needs_promtool
def test_the_alerts_fire_on_the_lab_numbers(tmp_path: Path):
    (tmp_path / "rules.yml").write_text(alerts())
    full = metrics.parse((LAB / "queue-saturation.metrics-5.txt").read_text())
    capped = metrics.parse((LAB / "queue-saturation-max-num-seqs.metrics-1.txt").read_text())
    series = _series("full:8000", full) + _series("capped:8000", capped)
    test = f"""rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{chr(10).join(series)}
    alert_rule_test:
      - eval_time: 15m
        alertname: VllmWaitingWithCacheFull
        exp_alerts:
          - exp_labels: {{severity: warning, instance: "full:8000", model_name: m}}
            exp_annotations:
              summary: "Requests wait while the KV cache is near full (queue-saturation)"
              description: "11 requests waiting on full:8000 with the KV cache at or over 80%: the cache limits concurrency. Run vllm-doctor explain on its log or /metrics."
      - eval_time: 15m
        alertname: VllmWaitingAtSequenceCap
        exp_alerts:
          - exp_labels: {{severity: warning, instance: "capped:8000", model_name: m}}
            exp_annotations:
              summary: "Requests wait while the KV cache has room (queue-sequence-cap or token budget)"
              description: "10 requests waiting on capped:8000 while the KV cache has room: --max-num-seqs or --max-num-batched-tokens limits the batch, not the cache."
"""
    (tmp_path / "test.yml").write_text(test)
    r = promtool("test", "rules", str(tmp_path / "test.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
