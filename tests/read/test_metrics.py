"""/metrics: real snapshots from the lab (fixtures/lab/*.metrics-N.txt, vLLM 0.32 CPU) diagnosed
with the same rules as the logs: cache full, sequence cap, stall, healthy."""

from __future__ import annotations

import http.server
import threading

import pytest
from typer.testing import CliRunner

from conftest import LAB, conforms
from vllm_doctor.cli import app
from vllm_doctor.pipeline import from_metrics
from vllm_doctor.read import metrics

SATURATED = LAB / "queue-saturation.metrics-5.txt"  # running 5, waiting 11, KV 95.2%
HEALTHY = LAB / "healthy.metrics-1.txt"
SEQ_CAP = LAB / "queue-saturation-max-num-seqs.metrics-1.txt"  # running 2 (= --max-num-seqs), waiting 10, KV 19%


def scrape(path, **kw):
    return metrics.parse(path.read_text(), str(path), **kw)


def top(report):
    return next((d for d in report.diagnoses if d.severity != "info"), None)


def test_parse_the_numbers_that_matter():
    s = scrape(LAB / "queue-saturation.metrics-11.txt")
    assert (s.running, s.waiting) == (4, 8)
    assert s.waiting_by_reason == {"capacity": 8, "deferred": 0}
    assert s.kv_metric == "vllm:kv_cache_usage_perc" and s.kv_usage_pct == pytest.approx(66.7)
    assert s.preemptions_total == 4
    assert s.queue_time is not None and s.queue_time.count == 4
    assert s.cache_config["num_gpu_blocks"] == "64" and s.cache_config["block_size"] == "128"
    assert s.model == "/models/wide-llama" and s.engines == {"0"}


def v0(text: str) -> str:
    """The same numbers under the V0 / early-V1 names: gpu_cache_usage_perc, model_name only."""
    text = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    return text.replace('engine="0",', "")


def test_both_kv_usage_names():
    new = scrape(SATURATED)
    old = metrics.parse(v0(SATURATED.read_text()), "v0")
    assert old.kv_metric == "vllm:gpu_cache_usage_perc"
    assert old.kv_usage_pct == new.kv_usage_pct == pytest.approx(95.2)
    assert top(from_metrics([old])).category == "queue-saturation"
    both = SATURATED.read_text() + 'vllm:gpu_cache_usage_perc{model_name="m"} 0.1\n'
    assert metrics.parse(both).kv_metric == "vllm:kv_cache_usage_perc"  # the current name wins


@pytest.mark.parametrize(
    ("path", "category"),
    [
        (SATURATED, "queue-saturation"),
        (LAB / "queue-saturation.metrics-1.txt", "queue-saturation"),
        (LAB / "queue-saturation.metrics-11.txt", "queue-saturation"),  # 4 preemptions
        (SEQ_CAP, "queue-sequence-cap"),
        (HEALTHY, None),
        (LAB / "queue-saturation.metrics-0.txt", None),  # before the load
        (LAB / "wrapper-sigterm.metrics-1.txt", None),  # 4 running, none waiting
    ],
)
def test_one_scrape(path, category):
    d = top(from_metrics([scrape(path)]))
    assert (d.category if d else None) == category


def test_stall_from_metrics():
    text = HEALTHY.read_text()
    text = text.replace(
        'vllm:num_requests_waiting{engine="0",model_name="/models/tiny-llama"} 0.0',
        'vllm:num_requests_waiting{engine="0",model_name="/models/tiny-llama"} 6.0',
    )
    s = metrics.parse(text, "stalled")
    assert (s.running, s.waiting) == (0, 6)
    assert top(from_metrics([s])).category == "queue-stall"


def test_series_tells_cache_full_from_sequence_cap():
    sat = [scrape(LAB / f"queue-saturation.metrics-{i}.txt", at=10.0 * k) for k, i in enumerate((0, 1, 5, 9, 10, 11))]
    r = from_metrics(sat)
    assert top(r).category == "queue-saturation"
    assert r.facts["stats"]["preemptions"] == 4
    assert r.facts["metrics"]["scrapes"] == 6 and metrics.to_facts(sat).window["seconds"] == 50  # the window's
    cap = [scrape(LAB / f"queue-saturation-max-num-seqs.metrics-{i}.txt", at=10.0 * i) for i in (1, 2, 3)]
    r = from_metrics(cap)
    assert top(r).category == "queue-sequence-cap"
    assert r.facts["stats"]["waiting_max"] == 10 and r.facts["stats"]["kv_usage_max_pct"] < 40


def test_histogram_quantiles():
    h = metrics.Histogram(count=10, sum=25.0, buckets=[(1.0, 2), (5.0, 9), (10.0, 10), (float("inf"), 10)])
    assert h.quantile_le(0.5) == 5.0 and h.quantile_le(0.99) == 10.0
    assert h.summary()["mean_s"] == 2.5
    assert h.minus(metrics.Histogram(count=2, sum=1.0, buckets=[(1.0, 2)])).count == 8


def test_not_a_vllm_server():
    s = metrics.parse("# TYPE up gauge\nup 1\n", "other")
    r = from_metrics([s])
    assert r.status == "unknown" and "no vllm:* metrics" in r.warnings[0]
    with pytest.raises(metrics.MetricsError):
        metrics.parse("this is { not prometheus", "junk")


def test_url_forms():
    assert metrics.metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics.metrics_url("http://h:8000/") == "http://h:8000/metrics"
    assert metrics.metrics_url("http://h:8000/custom/metrics") == "http://h:8000/custom/metrics"


# --------------------------------------------------------------------------------------------
# the CLI, against a local server that answers with the lab's snapshots in turn
# --------------------------------------------------------------------------------------------
@pytest.fixture
def server():
    state = {"files": [SATURATED], "i": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path != "/metrics":
                self.send_error(404)
                return
            files = state["files"]
            body = files[min(state["i"], len(files) - 1)].read_bytes()
            state["i"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()
    httpd.server_close()


def test_explain_metrics_saturated_and_healthy(server):
    url, state = server
    runner = CliRunner()
    r = runner.invoke(app, ["explain", "--metrics", url, "--format", "json"])
    assert r.exit_code == 0, r.output  # a warning: exit 1 only with --fail-on warning
    data = conforms(r.output)
    assert data["diagnoses"][0]["category"] == "queue-saturation"
    assert data["input"]["paths"] == [url + "/metrics"]
    assert data["facts"]["metrics"]["kv_usage_metric"] == "vllm:kv_cache_usage_perc"
    assert data["facts"]["metrics"]["waiting_by_reason"] == {"capacity": 11.0, "deferred": 0.0}
    r = runner.invoke(app, ["explain", "--metrics", url, "--fail-on", "warning"])
    assert r.exit_code == 1 and "queue-saturation" in r.output
    state["files"], state["i"] = [HEALTHY], 0
    r = runner.invoke(app, ["explain", "--metrics", url, "--format", "json"])
    assert r.exit_code == 0
    data = conforms(r.output)
    assert data["status"] == "healthy"
    assert [d for d in data["diagnoses"] if d["severity"] != "info"] == []


def test_explain_metrics_from_a_saved_scrape():
    r = CliRunner().invoke(app, ["explain", "--metrics", str(SEQ_CAP), "--format", "markdown"])
    assert r.exit_code == 0 and "queue-sequence-cap" in r.output


def test_watch_a_series(server):
    url, state = server
    state["files"] = [LAB / f"queue-saturation.metrics-{i}.txt" for i in (0, 1, 5, 9)]
    r = CliRunner().invoke(app, ["watch", url, "--interval", "0.1", "--samples", "4", "--format", "json"])
    assert r.exit_code == 0, r.output
    data = conforms(r.stdout)
    assert data["diagnoses"][0]["category"] == "queue-saturation"
    assert data["facts"]["stats"]["samples"] == 4
    assert r.stderr.count("scrape ") == 4 and "waiting 11 (capacity 11)" in r.stderr


def test_unreachable_and_usage_errors(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["explain", "--metrics", "http://127.0.0.1:9/metrics"])
    assert r.exit_code == 2 and "cannot connect" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = runner.invoke(app, ["explain", str(LAB / "healthy.log"), "--metrics", str(HEALTHY)])
    assert r.exit_code == 2
    r = runner.invoke(app, ["watch", "http://127.0.0.1:9", "--samples", "1"])
    assert r.exit_code == 2
    r = runner.invoke(app, ["explain", "--metrics", str(tmp_path / "missing.txt")])
    assert r.exit_code == 2


def test_a_sample_counts_increases_over_restarts_and_rates_only_between_timed_scrapes():
    from dataclasses import replace

    from vllm_doctor.read.window import MIN_SECONDS

    late = scrape(LAB / "queue-saturation.metrics-11.txt", at=100.0)  # 4 preemptions since the start
    assert metrics.sample(late)["preemptions"] == 4
    restarted = replace(late, at=130.0, preemptions_total=1.0)  # the counter dropped: a restart, 1 since
    assert metrics.sample(restarted, late)["preemptions"] == 1
    assert metrics.sample(replace(late, at=130.0), late)["preemptions"] == 0
    close = replace(late, at=100.0 + MIN_SECONDS / 2, generation_tokens_total=(late.generation_tokens_total or 0) + 50)
    assert "gen_tps" not in metrics.sample(close, late)  # not taken apart in time: no rate
    timed = replace(close, at=100.0 + 2 * MIN_SECONDS)
    assert metrics.sample(timed, late)["gen_tps"] == round(50 / (2 * MIN_SECONDS), 1)


def test_a_series_counts_preemptions_from_its_first_scrape_and_a_lone_scrape_since_the_start():
    late = [scrape(LAB / "queue-saturation.metrics-11.txt", at=at) for at in (0.0, 10.0)]  # 4 since the start
    facts = metrics.to_facts(late)
    assert facts.stats.preemptions == facts.window["preemptions"] == 0  # none during the series
    assert metrics.to_facts(late[:1]).stats.preemptions == 4  # no window: the server's count so far
    assert "preemptions 4 since start" in metrics.describe(late[0], 1)
    assert "preemptions +0" in metrics.describe(late[1], 2, late[0])
