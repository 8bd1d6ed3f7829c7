"""Prometheus as the fleet's store, against a REAL Prometheus (Debian's package; scripts/ci-deps.sh):
the test starts it on a loopback port, scraping two tiny local servers that serve the lab's recorded
/metrics files, one recording per scrape: a saturated replica (queue-saturation.metrics-0..11) and an
idle one (healthy.metrics-1). explain --prometheus must read the window back per replica, give the
same window numbers as the files, and find the one replica queueing while the other idles."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LAB
from vllm_doctor.cli import app
from vllm_doctor.cli.fleet import from_prometheus
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.read import prom

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None and os.environ.get("CI") == "true":
    raise RuntimeError("prometheus is missing: scripts/ci-deps.sh installs Debian's prometheus")

SATURATED = [(LAB / f"queue-saturation.metrics-{i}.txt").read_bytes() for i in range(12)]
IDLE = [(LAB / "healthy.metrics-1.txt").read_bytes()]


def test_a_selector_is_parsed_and_every_value_quoted_again():
    assert prom.parse_selector('{namespace="llm", pod=~"vllm-.*"}') == [
        ("namespace", "=", "llm"),
        ("pod", "=~", "vllm-.*"),
    ]
    tricky = prom.parse_selector(r'{team="a\"} or vector(1) or {x=\"b"}')
    assert tricky == [("team", "=", 'a"} or vector(1) or {x="b')]  # one value, not PromQL
    assert r'team="a\"} or vector(1) or {x=\"b"' in prom.promql(tricky)
    assert prom.parse_selector(None) == [] and prom.parse_selector("{}") == []


@pytest.mark.parametrize(
    "bad",
    ['namespace="llm"', "{namespace=llm}", '{namespace="llm"} or vector(1)', '{__name__="up"}', '{a="x" b="y"}'],
)
def test_a_selector_that_is_not_label_matchers_is_refused_in_one_line(bad: str):
    r = CliRunner().invoke(app, ["explain", "--prometheus", "http://127.0.0.1:1", "--selector", bad])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--selector" in r.output, r.output


def test_the_window_from_since_or_start_and_end():
    assert prom.window_times("90m", None, None, now=10_000.0) == (4600.0, 10_000.0)
    assert prom.window_times(None, "2026-12-01T10:00:00Z", "2026-12-01T11:00:00Z")[1] - 3600 == prom.parse_time(
        "2026-12-01T10:00:00Z"
    )
    with pytest.raises(prom.PromError):
        prom.window_times("1h", "0", None)
    with pytest.raises(prom.PromError):
        prom.parse_duration("an hour")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replica(pages: list[bytes]) -> tuple[http.server.ThreadingHTTPServer, list[int]]:
    """A /metrics server giving the next recorded page at each scrape, then the last one again."""
    served = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages[min(served[0], len(pages) - 1)]
            served[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, served


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (scripts/ci-deps.sh)")
    tmp: Path = tmp_path_factory.mktemp("prometheus")
    busy, busy_served = _replica(SATURATED)
    idle, _ = _replica(IDLE)
    targets = ", ".join(f'"127.0.0.1:{s.server_address[1]}"' for s in (busy, idle))
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: [{targets}]\n"
    )
    port = _free_port()
    start = time.time()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while busy_served[0] < len(SATURATED) + 1 and time.time() < deadline:
            time.sleep(0.5)
        assert busy_served[0] > len(SATURATED), "Prometheus did not scrape the recordings"
        time.sleep(1.5)  # the last scrape's samples are queryable
        url = f"http://127.0.0.1:{port}"
        urllib.request.urlopen(f"{url}/-/ready", timeout=5).read()
        yield url, start, time.time(), busy.server_address[1]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        busy.shutdown()
        idle.shutdown()


def test_the_window_read_back_from_prometheus_is_the_recordings(prometheus):
    url, start, end, busy_port = prometheus
    series = prom.fetch(url, start, end)
    assert len(series) == 2
    busy = next(s for name, s in series.items() if f":{busy_port}" in name)
    from vllm_doctor.read.window import window

    w = window(busy)
    assert w["itl"]["count"] == 5093 and w["preemptions"] == 4 and w["finished"]["length"] == 4  # as the files say
    assert w["seconds"] is not None and w["seconds"] > 5  # Prometheus' samples carry their times


def test_explain_prometheus_finds_the_replica_that_queues_while_the_other_idles(prometheus):
    url, start, end, busy_port = prometheus
    report = from_prometheus(url, start, end, '{job="vllm"}', options=Options(tpot_budget_ms=144.3))
    rules = {d.rule: d for d in report.diagnoses}
    assert f":{busy_port}" in report.facts["prometheus"]["replica"]  # the report leads with the queueing one
    imbalance = rules["replica-imbalance"]
    assert f":{busy_port}" in imbalance.numbers["queued_replica"] and imbalance.numbers["idle_running_mean"] == 0
    assert "queue-cache-full" in rules and "preemption-rate" in rules
    assert len(report.facts["replicas"]) == 2
    assert rules["preemption-rate"].numbers["preempt_per_min"] > 0  # timed: a rate a minute


def test_explain_prometheus_from_the_command_line(prometheus):
    url, _start, _end, _port = prometheus
    r = CliRunner().invoke(
        app, ["explain", "--prometheus", url, "--since", "10m", "--selector", '{job="vllm"}', "-f", "json"]
    )
    assert r.exit_code == 0 and '"replica-imbalance"' in r.output, r.output[-2000:]
    r = CliRunner().invoke(app, ["explain", "--prometheus", url, "--since", "10m", "--selector", '{job="nothing"}'])
    assert r.exit_code == 2 and "no vllm:* series" in r.output


def test_the_api_answer_is_read_as_the_scrape_it_came_from():
    """prom.replicas reads Prometheus' JSON samples directly (no exposition text written back):
    the same numbers as read/metrics.py's parse of the scrape Prometheus stored them from."""
    from prometheus_client.parser import text_string_to_metric_families

    from vllm_doctor.read import metrics

    text = SATURATED[5].decode()
    series = [
        {
            "metric": {"__name__": s.name, "instance": "a:8000", "job": "vllm", **s.labels},
            "values": [[100.0, str(s.value)]],
        }
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vllm:")
    ]
    [(key, [got])] = prom.replicas(series).items()
    want = metrics.parse(text, key, at=100.0)
    assert key == "instance=a:8000" and got.waiting == want.waiting and got.running == want.running
    assert (got.kv_usage, got.hists.keys(), got.counters, got.cache_config) == (
        want.kv_usage,
        want.hists.keys(),
        want.counters,
        {**want.cache_config, "instance": "a:8000"},
    )
    with pytest.raises(prom.PromError, match="no number"):
        prom.replicas([{"metric": {"__name__": "vllm:num_requests_waiting"}, "values": [[1, "lots"]]}])


def test_a_url_error_never_repeats_the_urls_secrets():
    from vllm_doctor.read.httpget import masked, secrets_of

    url = "http://ops:pa%2055w0rd@prom:9090/api?query=up&token=tok-123&X-Amz-Signature=abcd&step=60"
    assert secrets_of(url) == ["pa%2055w0rd", "pa 55w0rd", "tok-123", "abcd"]
    said = masked(f"{url}: cannot connect (nonnumeric port: 'pa%2055w0rd@prom:9090')", url)
    assert "pa%2055w0rd" not in said and "tok-123" not in said and "abcd" not in said
    assert "query=up" in said and "step=60" in said and said.count("[REDACTED]") == 4
