"""Class 10 of issue 10: `--metrics` against a hostile server or file. A body without end, a
server dripping a byte at a time, redirects off the host, a million series, and values that
are not numbers: each is bounded, and ends in a report or in one line with exit status 2.

The server is a local http.server on 127.0.0.1; every handler loop is bounded and stops by
itself (a client that went away ends it at once)."""

from __future__ import annotations

import http.server
import time
import tracemalloc

import pytest
from typer.testing import CliRunner

from conftest import LAB, local_http
from vllm_doctor.cli import app
from vllm_doctor.pipeline import from_metrics
from vllm_doctor.read import metrics

SATURATED = (LAB / "queue-saturation.metrics-5.txt").read_bytes()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):  # noqa: N802
        try:
            getattr(self, "_" + self.path.strip("/").replace("/", "_").replace("-", "_"), self._missing)()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up, as it should

    def _ok(self, body: bytes = SATURATED, length: bool = True) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _missing(self):
        self.send_error(404)

    def _metrics(self):
        self._ok()

    def _endless(self):  # 8 MiB of series lines without a Content-Length, then it stops
        self._ok(b"", length=False)
        line = b'other_series{i="0123456789"} 1\n' * 2048
        for _ in range((8 << 20) // len(line)):
            self.wfile.write(line)

    def _drip_body(self):  # one byte every 0.25 s, for at most 20 s
        self.send_response(200)
        self.send_header("Content-Length", str(len(SATURATED)))
        self.end_headers()
        self.wfile.flush()
        for b in SATURATED[:80]:
            self.wfile.write(bytes([b]))
            self.wfile.flush()
            time.sleep(0.25)

    def _drip_headers(self):  # the status line itself, a byte at a time
        for b in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"a" * 70:
            self.wfile.write(bytes([b]))
            self.wfile.flush()
            time.sleep(0.25)

    def _redirect(self, where: str) -> None:
        self.send_response(302)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _to_other_host(self):
        self._redirect("http://metrics.example.invalid/metrics")

    def _to_ftp(self):
        self._redirect("ftp://127.0.0.1/metrics")

    def _to_same_host(self):
        self._redirect("/metrics")

    def _bad_values(self):
        self._ok(
            b'vllm:num_requests_running{engine="0"} 5\n'
            b'vllm:num_requests_waiting{engine="0"} NaN\n'
            b'vllm:kv_cache_usage_perc{engine="0"} NaN\n'
            b'vllm:num_preemptions_total{engine="0"} -3\n'
            b'vllm:prompt_tokens_total{engine="0"} +Inf\n'
        )

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    with local_http(Handler) as url:
        yield url


def _explain(source: str):
    return CliRunner().invoke(app, ["explain", "--metrics", source, "--format", "json"])


def test_a_body_without_end_is_cut_at_the_size_cap(server, monkeypatch):
    monkeypatch.setattr(metrics, "MAX_BYTES", 1 << 20)
    with pytest.raises(metrics.MetricsError, match="more than 1 MB"):
        metrics.fetch(server + "/endless")
    r = _explain(server + "/endless")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_dev_zero_is_refused_in_one_line():
    r = _explain("/dev/zero")
    assert r.exit_code == 2 and "longer than 1 MiB" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("path", ["/drip-body", "/drip-headers"])
def test_a_dripping_server_meets_the_total_deadline(server, path):
    t0 = time.monotonic()
    with pytest.raises(metrics.MetricsError, match="no complete answer within 1 s"):
        metrics.fetch(server + path, timeout=1.0)
    assert time.monotonic() - t0 < 5  # each byte came within the socket timeout: only the deadline ends it


@pytest.mark.parametrize("path", ["/to-other-host", "/to-ftp"])
def test_redirects_off_the_host_or_scheme_are_not_followed(server, path):
    with pytest.raises(metrics.MetricsError, match="another host or scheme; not followed"):
        metrics.fetch(server + path)
    r = _explain(server + path)
    assert r.exit_code == 2 and "not followed" in r.stderr


def test_a_redirect_on_the_same_host_is_followed(server):
    s = metrics.fetch(server + "/to-same-host")
    assert s.waiting == 11 and s.kv_usage_pct == 95.2


def test_nan_inf_and_negative_values_are_missing_with_a_warning(server):
    s = metrics.fetch(server + "/bad-values")
    assert s.running == 5 and s.waiting is None and s.kv_usage is None
    assert s.preemptions_total is None and s.prompt_tokens_total is None
    assert set(s.bad_values) == {
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
    }
    r = _explain(server + "/bad-values")
    assert r.exit_code == 0, r.output  # a report, not exit 3
    assert "read as missing" in r.output and "kv_usage_pct" in r.output
    report = from_metrics([s])
    assert report.facts["metrics"]["kv_usage_pct"] is None  # not read as 0 %
    assert not [d for d in report.diagnoses if d.category.startswith("queue-")]


def _million_series():
    yield b"# TYPE other gauge\n"
    row = b"".join(b'other{series="%07d",pod="vllm-0"} 1\n' % i for i in range(10_000))
    for _ in range(100):
        yield row
    yield SATURATED


def test_a_million_series_stay_flat():
    tracemalloc.start()
    try:
        s = metrics.parse_chunks(_million_series(), "big")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.lines > 1_000_000 and s.waiting == 11 and s.kv_usage_pct == 95.2
    assert peak < 32 << 20, peak  # the series are counted, not held (899 MB before)


def test_too_many_samples_of_a_read_name_are_skipped_with_a_warning(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_SAMPLES", 100)
    text = "".join(f'vllm:num_requests_running{{engine="{i}"}} 1\n' for i in range(500))
    s = metrics.parse(text + "vllm:kv_cache_usage_perc 0.5\n", "many")
    assert s.running == 100 and s.skipped == 401 and len(s.engines) <= metrics.MAX_KEYS
    assert any("not read" in w for w in metrics.warnings(s))
