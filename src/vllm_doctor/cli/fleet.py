"""The fleet report: a Prometheus window read per replica (read/prom.py), each replica diagnosed
as its own scrape series (pipeline.from_metrics), every replica's numbers beside each so that the
replica_balance check can tell one replica queueing while others idle. The report leads with the
replica in the worst state and lists them all in facts.replicas."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from vllm_doctor.data import Report, Rule
from vllm_doctor.facts import StatsSeries
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.read import prom
from vllm_doctor.read.metrics import Scrape

_RANK = {"failed": 0, "degraded": 1, "unknown": 2, "healthy": 3}


def replica_numbers(name: str, scrapes: list[Scrape], stats: StatsSeries) -> dict[str, Any]:
    """What the balance check compares: how much each replica queued and ran over the window; the
    peaks are its stats series' (metrics.to_facts), the means over its scrapes."""
    waiting = [s.waiting for s in scrapes if s.waiting is not None]
    running = [s.running for s in scrapes if s.running is not None]
    return {
        "replica": name,
        "samples": len(scrapes),
        "waiting_max": stats.waiting_max,
        "waiting_mean": round(sum(waiting) / len(waiting), 1) if waiting else None,
        "running_mean": round(sum(running) / len(running), 1) if running else None,
        "kv_usage_max_pct": stats.kv_usage_max_pct,
    }


def from_prometheus(
    url: str,
    start: float,
    end: float,
    selector: str | None = None,
    rules: list[Rule] | None = None,
    options: Options | None = None,
) -> Report:
    """The window [start, end] of every replica Prometheus at `url` holds (under `selector`)."""
    from vllm_doctor import pipeline
    from vllm_doctor.read.metrics import to_facts

    cut: list[str] = []  # what of the answer was past its bounds (read/prom.py), said in the report
    series = prom.fetch(url, start, end, selector, cut)
    facts = {name: to_facts(scrapes) for name, scrapes in series.items()}
    fleet = [replica_numbers(name, scrapes, facts[name].stats) for name, scrapes in series.items()]
    reports = {
        name: pipeline.from_metrics(scrapes, rules, options, fleet, facts[name]) for name, scrapes in series.items()
    }
    for r, numbers in zip(reports.values(), fleet, strict=True):
        numbers["status"] = r.status
        top = next((d for d in r.diagnoses if d.severity != "info"), None)
        numbers["top"] = top.category if top else None
    lead = min(reports, key=lambda n: (_RANK.get(reports[n].status, 9), -(_numbers(fleet, n)["waiting_max"] or 0)))
    report = reports[lead]
    report.facts["replicas"] = fleet
    report.facts["prometheus"] = {"url": url, "start": start, "end": end, "selector": selector, "replica": lead}
    return replace(report, paths=[f"{url} ({lead})"], warnings=[*report.warnings, *cut])


def _numbers(fleet: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(f for f in fleet if f["replica"] == name)


def server_report(metrics: list[str] | None, prometheus: str | None, window: tuple, rules, options) -> Report:
    """A running server's report: from its /metrics scrapes, or from Prometheus over a window."""
    if prometheus:
        from vllm_doctor.read.prom import window_times

        since, start, end, selector = window
        begin, stop = window_times(since, start, end)
        return from_prometheus(prometheus, begin, stop, selector, rules, options)
    from vllm_doctor import pipeline
    from vllm_doctor.read.metrics import fetch

    return pipeline.from_metrics([fetch(m) for m in in_order(metrics or [])], rules, options)


def in_order(inputs: list[str]) -> list[str]:
    """Saved scrapes of one numbered series (`--metrics` from a shell glob: metrics-0 .. metrics-11,
    which the shell sorts as text, 0, 1, 10, 11, 2) in their numbers' order; any other list, URLs
    among them, as given (oldest first)."""
    import re

    from vllm_doctor.read.metrics import is_url

    if len(inputs) < 2 or any(is_url(i) for i in inputs) or len({re.sub(r"\d+", "#", i) for i in inputs}) > 1:
        return inputs
    return sorted(inputs, key=lambda i: [int(n) for n in re.findall(r"\d+", i)])
