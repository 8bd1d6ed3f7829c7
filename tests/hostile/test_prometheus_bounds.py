"""Issue 25, class 8: `--prometheus` against a hostile or huge answer, bounded as `--metrics` is.

The answer streams in and is read a series at a time (read/jsonstream.py): an answer over the
byte cap is one line and exit 2 (as a /metrics page over it is), never gigabytes; more series,
replicas or steps than the bounds are cut with a note in the report (as a scrape's samples past
MAX_SAMPLES are); timestamps that are no time, points of another arity and JSON nested 200,000
deep are one line and exit 2, never exit 3. The server is a local http.server on 127.0.0.1; the
doctor runs as a real process, and its peak RSS (wait4) shows the memory stayed flat."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from conftest import ROOT, local_http
from vllm_doctor.read import prom

RSS_CAP = 400 << 20  # the doctor itself is ~100 MB; a 250 MB answer grew it to 3.75 GB


def _series(name: str = "vllm:num_requests_running", points: int = 1, **labels: str) -> bytes:
    values = [[1000.0 + 15 * i, "1"] for i in range(points)]
    return json.dumps({"metric": {"__name__": name, "instance": "a:8000", **labels}, "values": values}).encode()


def _answer(series: Iterator[bytes]) -> Iterator[bytes]:
    yield b'{"status":"success","data":{"resultType":"matrix","result":['
    for i, s in enumerate(series):
        yield (b"," if i else b"") + s
    yield b"]}}"


def _big_labels() -> Iterator[bytes]:  # 1,000 series of 100 KB each: 100 MB, over the 64 MB cap
    pad = "x" * 100_000
    for i in range(1000):
        yield _series(pad=pad, instance=f"a:{i}")


ANSWERS = {
    "huge": lambda: _answer(_big_labels()),
    "many-series": lambda: _answer(_series(name="vllm:other", engine=str(i)) for i in range(100_000)),
    "many-replicas": lambda: _answer(_series(instance=f"h{i}:8000") for i in range(2_000)),
    "many-points": lambda: _answer(iter([_series(points=5_000)])),
    "bad-time": lambda: _answer(iter([b'{"metric":{"__name__":"vllm:num_requests_running"},"values":[["soon","1"]]}'])),
    "nan-time": lambda: _answer(iter([b'{"metric":{"__name__":"vllm:num_requests_running"},"values":[[NaN,"1"]]}'])),
    "arity": lambda: _answer(iter([b'{"metric":{"__name__":"vllm:num_requests_running"},"values":[[1,"1","2"]]}'])),
    "deep": lambda: _answer(iter([b"[" * 200_000 + b"]" * 200_000])),
    "deep-status": lambda: iter([b'{"status":' + b"[" * 200_000 + b"]" * 200_000 + b"}"]),
    "deep-top": lambda: iter([b"[" * 200_000]),
}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def do_GET(self):  # noqa: N802
        case = self.path.strip("/").split("/", 1)[0]
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            for piece in ANSWERS[case]():
                self.wfile.write(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the doctor stopped reading, as it should

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def server():
    with local_http(Handler) as url:
        yield url


def _explain(url: str) -> tuple[int, str, str, int]:
    """The doctor as a real process: (status, stdout, stderr, its peak RSS in bytes)."""
    import tempfile

    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_DOCTOR_")}
    env.update({"PYTHONPATH": str(ROOT / "src"), "VLLM_DOCTOR_CONFIG": ""})
    cmd = [sys.executable, "-m", "vllm_doctor", "explain", "--prometheus", url, "--since", "1h", "-f", "json"]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read().decode(), err.read().decode(), usage.ru_maxrss * 1024


def test_an_answer_over_the_byte_cap_is_one_line_and_exit_2(server):
    status, out, err, rss = _explain(server + "/huge")
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert f"an answer over {prom.MAX_BYTES >> 20} MB" in err and rss < RSS_CAP


@pytest.mark.parametrize(
    ("case", "note"),
    [
        ("many-series", f"more than {prom.MAX_SERIES:,} series"),
        ("many-replicas", f"more than {prom.MAX_REPLICAS} replicas"),
        ("many-points", f"more than {prom.MAX_STEPS} steps a replica"),
    ],
)
def test_more_than_the_bounds_is_cut_with_a_note(server, case, note):
    status, out, err, rss = _explain(server + "/" + case)
    assert status in (0, 1, 4) and rss < RSS_CAP, err
    assert any(note in w for w in json.loads(out)["input"]["warnings"])


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("bad-time", "a sample time that is no time"),
        ("nan-time", "a sample time that is no time"),
        ("arity", "a sample that is not [time, value]"),
        ("deep", "nested too deeply"),
        ("deep-status", "nested too deeply"),
        ("deep-top", "not the JSON expected"),
    ],
)
def test_hostile_json_is_one_line_and_exit_2(server, case, says):
    status, out, err, _rss = _explain(server + "/" + case)
    [line] = err.splitlines()
    assert status == 2 and out == "" and says in line and line.startswith("vllm-doctor: "), err


def test_the_points_in_all_are_bounded_too(monkeypatch):
    monkeypatch.setattr(prom, "MAX_SAMPLES", 100)
    series = [json.loads(_series(points=30, engine=str(i))) for i in range(10)]
    notes: list[str] = []
    [(_key, scrapes)] = prom.replicas(series, notes).items()
    assert len(scrapes) == 30 and notes == [
        "Prometheus answered more than 100 points; the rest not read (narrow the window or the selector)"
    ]
