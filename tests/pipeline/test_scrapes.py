"""Scrape series end to end: fixtures/scrapes/cases.toml over the lab's recorded /metrics files.

Each finding of the running server has a case that triggers it and a counterpart that stays
quiet. The edits below write, from shared/vllm-reference/metrics.md, what the lab's 0.32 server
did not show: the old metric names, prefix hits, error and abort finishes.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable

import pytest

from conftest import FIXTURES, LAB
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.pipeline import from_metrics
from vllm_doctor.read import metrics

CASES = tomllib.loads((FIXTURES / "scrapes" / "cases.toml").read_text())["case"]
INTERVAL = 10.0  # the lab scraped every 10 s


def _set_counter(text: str, name: str, value: Callable[[float], float]) -> str:
    return re.sub(
        rf"^({re.escape(name)}\{{[^}}]*\}}) (\S+)$", lambda m: f"{m[1]} {value(float(m[2]))}", text, flags=re.M
    )


def _prefix_hits(text: str) -> str:
    queries = float(re.search(r"^vllm:prefix_cache_queries_total\{[^}]*\} (\S+)$", text, re.M)[1])
    return _set_counter(text, "vllm:prefix_cache_hits_total", lambda _: queries * 0.25)


def _caching_off(text: str) -> str:
    text = text.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    return _set_counter(text, "vllm:prefix_cache_queries_total", lambda _: 0.0)


def _old_names(text: str) -> str:
    """V1 before 0.9.2 / 0.10.2: time_per_output_token, gpu_prefix_cache_*, gpu_cache_usage_perc."""
    text = text.replace("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
    text = text.replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
    return text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def _finished(reason: str, n: float) -> Callable[[str], str]:
    def edit(text: str) -> str:
        pattern = rf'^(vllm:request_success_total\{{[^}}]*finished_reason="{reason}"[^}}]*\}}) (\S+)$'
        return re.sub(pattern, lambda m: f"{m[1]} {n}", text, flags=re.M)

    return edit


EDITS: dict[str, Callable[[str], str]] = {
    "prefix-hits-25pct": _prefix_hits,
    "prefix-caching-off": _caching_off,
    "v0-names": _old_names,
    "finished-error-2": _finished("error", 2.0),
    "finished-abort-3": _finished("abort", 3.0),
}


def series(case: dict) -> list[metrics.Scrape]:
    first, last = case["scrapes"]
    out = []
    for i in range(first, last + 1):
        path = LAB / f"{case['series']}.metrics-{i}.txt"
        text = path.read_text()
        if "edit" in case and (i == last or case["edit"] != "finished-error-2" and case["edit"] != "finished-abort-3"):
            text = EDITS[case["edit"]](text)
        out.append(metrics.parse(text, str(path), at=INTERVAL * i))
    return out


def report(case: dict):
    options = Options(tpot_budget_ms=case.get("tpot_budget"), ttft_budget_ms=case.get("ttft_budget"))
    return from_metrics(series(case), options=options)


def fleet_report(idle_pages: list[str]):
    """Two replicas without Prometheus (test_prom.py has the real one): the saturated series, and
    an idle or a queueing second one; the report of the first with both replicas' numbers."""
    from vllm_doctor.cli.fleet import replica_numbers

    busy = series({"series": "queue-saturation", "scrapes": [0, 11]})
    other = [metrics.parse((LAB / p).read_text(), p, at=INTERVAL * i) for i, p in enumerate(idle_pages)]
    fleet = [
        replica_numbers(name, s, metrics.to_facts(s).stats) for name, s in (("busy:8000", busy), ("other:8000", other))
    ]
    return from_metrics(busy, fleet=fleet)


IDLE = ["healthy.metrics-1.txt", "healthy.metrics-1.txt"]
ALSO_BUSY = [f"queue-saturation-max-num-seqs.metrics-{i}.txt" for i in range(1, 4)]


def fired_rules() -> set[str]:
    """Every rule some scrape case reports (test_fixtures counts them as triggered)."""
    return {d.rule for case in CASES for d in report(case).diagnoses} | {d.rule for d in fleet_report(IDLE).diagnoses}


def test_one_replica_queueing_while_another_idles_is_imbalance():
    d = next(d for d in fleet_report(IDLE).diagnoses if d.rule == "replica-imbalance")
    assert d.numbers["queued_replica"] == "busy:8000" and d.numbers["idle_replicas"] == "other:8000"
    assert d.numbers["queued_waiting_max"] == 13 and d.numbers["idle_running_mean"] == 0


def test_every_replica_queueing_is_no_imbalance():
    assert "replica-imbalance" not in {d.rule for d in fleet_report(ALSO_BUSY).diagnoses}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_scrape_case(case: dict):
    diagnoses = {d.rule: d for d in report(case).diagnoses}
    for rule in case.get("rules", []):
        assert rule in diagnoses, f"{rule} must fire: {sorted(diagnoses)}"
    for rule in case.get("not_rules", []):
        assert rule not in diagnoses, f"{rule} must not fire: {diagnoses[rule].summary if rule in diagnoses else ''}"
    if case.get("numbers"):
        numbers = diagnoses[case["rules"][0]].numbers
        for name, value in case["numbers"].items():
            assert numbers.get(name) == value, f"{name}: {numbers}"


def test_every_case_edit_changes_the_scrape():
    text = (LAB / "queue-saturation.metrics-11.txt").read_text()
    for name, edit in EDITS.items():
        assert edit(text) != text, name
