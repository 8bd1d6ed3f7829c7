"""`vllm-doctor alerts`: promtool (Debian's prometheus package, scripts/ci-deps.sh) must accept
the rules, and `promtool test rules` must fire the right alert on the lab's numbers: the saturated
server (waiting 11, KV 95.2%) is cache-full, the capped one (waiting 10, KV 19%) is the sequence cap."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import LAB
from vllm_doctor.cli import app
from vllm_doctor.read import metrics

PROMTOOL = shutil.which("promtool")
if PROMTOOL is None and os.environ.get("CI") == "true":
    raise RuntimeError("promtool is missing: scripts/ci-deps.sh installs Debian's prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (scripts/ci-deps.sh)")


SCOPED = ("--by", "namespace,pod", "--label", "team=llm", "--selector", '{namespace="llm"}')


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
@pytest.mark.parametrize("scope", [(), SCOPED])
def test_promtool_accepts_the_prometheusrule_spec(tmp_path: Path, scope):
    text = alerts("--format", "k8s", "--namespace", "llm", *scope)
    manifest = yaml.safe_load(text)
    assert manifest["apiVersion"] == "monitoring.coreos.com/v1" and manifest["kind"] == "PrometheusRule"
    assert manifest["metadata"]["namespace"] == "llm"
    assert manifest["metadata"].get("labels") == ({"team": "llm"} if scope else None)  # what a ruleSelector matches
    (tmp_path / "spec.yml").write_text(yaml.safe_dump(manifest["spec"]))  # promtool reads the spec, not the object
    r = promtool("check", "rules", str(tmp_path / "spec.yml"))
    assert r.returncode == 0 and "SUCCESS: 5 rules found" in r.stdout, r.stdout + r.stderr
    (tmp_path / "object.yml").write_text(text)
    assert promtool("check", "rules", str(tmp_path / "object.yml")).returncode != 0  # as the README says


@pytest.mark.parametrize("args", [(), SCOPED, ("-f", "k8s", *SCOPED)])
def test_every_alert_is_ready_to_deploy(args):
    doc = yaml.safe_load(alerts(*args))
    rules = [r for g in (doc.get("spec") or doc)["groups"] for r in g["rules"]]
    assert len(rules) == 5
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r
        assert set(r["annotations"]) == {"summary", "description", "runbook_url"}, r
        assert all(r["annotations"].values()) and r["annotations"]["runbook_url"].startswith("https://")
        if args:  # --by namespace,pod and --label team=llm reach every rule, --selector every series
            assert r["labels"]["team"] == "llm"
            assert "namespace, pod" in r["expr"] and "instance, model_name" in r["expr"]
            names = re.findall(r"vllm:\w+(\{[^}]*\})?", r["expr"])
            assert names and all(n == '{namespace="llm"}' for n in names), r["expr"]


def test_the_runbook_url_is_the_rules_documentation():
    doc = yaml.safe_load(alerts("--runbook-url", "https://wiki.example/vllm/{rule}"))
    urls = {r["alert"]: r["annotations"]["runbook_url"] for r in doc["groups"][0]["rules"]}
    assert urls["VllmWaitingWithCacheFull"] == "https://wiki.example/vllm/queue-cache-full"
    from vllm_doctor.knowledge.rulebook import load

    ids = {rule.id for rule in load()}
    assert all(u.rsplit("/", 1)[1] in ids for u in urls.values())  # each a rule `rules show` documents


@needs_promtool
@pytest.mark.parametrize(
    "args",
    [
        (),
        SCOPED,
        ("--tpot-budget", "7", "--queue-budget", "250"),
        ("--selector", '{job=~"vllm|other", pod!="x"}', "--by", "job"),
    ],
)
def test_promtool_passes_the_tests_alerts_writes_for_its_rules(tmp_path: Path, args):
    (tmp_path / "rules.yml").write_text(alerts(*args))
    (tmp_path / "rules.test.yml").write_text(alerts(*args, "--tests", "--rules-file", "rules.yml"))
    r = promtool("test", "rules", str(tmp_path / "rules.test.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
    if args == SCOPED:  # tests of other rules fail: they hold the rules to their labels
        (tmp_path / "rules.yml").write_text(alerts())
        assert promtool("test", "rules", str(tmp_path / "rules.test.yml")).returncode != 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-o", "yaml"), "-o yaml: not a format (rules, k8s); for a file of that name give -o ./yaml"),
        (("--label", "team"), "--label 'team': give KEY=VALUE, e.g. team=llm"),
        (("--by", "a-b"), "'a-b': not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
        (("--tests", "-f", "k8s"), "--tests: promtool tests a rules file (--format rules), not a PrometheusRule"),
    ],
)
def test_bad_alerts_options_are_one_line(args, message):
    r = CliRunner().invoke(app, ["alerts", *args])
    assert r.exit_code == 2 and r.output.strip() == f"vllm-doctor: {message}"


def test_alerts_writes_o_and_answers_h(tmp_path: Path):
    r = CliRunner().invoke(app, ["alerts", "-o", str(tmp_path / "rules.yml")])
    assert r.exit_code == 0 and (tmp_path / "rules.yml").read_text() == alerts()
    assert alerts("-o", "-") == alerts() and alerts("-o", "k8s") == alerts("-f", "k8s")
    assert "--selector" in alerts("-h") and "--tests" in alerts("-h")


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
              runbook_url: "https://pypi.org/project/vllm-log-doctor/#queue-cache-full"
      - eval_time: 15m
        alertname: VllmWaitingAtSequenceCap
        exp_alerts:
          - exp_labels: {{severity: warning, instance: "capped:8000", model_name: m}}
            exp_annotations:
              summary: "Requests wait while the KV cache has room (queue-sequence-cap or token budget)"
              description: "10 requests waiting on capped:8000 while the KV cache has room: --max-num-seqs or --max-num-batched-tokens limits the batch, not the cache."
              runbook_url: "https://pypi.org/project/vllm-log-doctor/#queue-sequence-cap"
"""
    (tmp_path / "test.yml").write_text(test)
    r = promtool("test", "rules", str(tmp_path / "test.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
