"""Input we cannot use is one line and exit 2, never "internal error" and exit 3 (issue 10,
class 11): a closed stdin, a server that breaks HTTP under --metrics, and rule files that break
the TOML reader (100,000-deep arrays, a 10,000-digit integer, a 100,000-part dotted key)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import SAMPLE_RULE


def _run(*args: str, stdin=None, close_stdin: bool = False, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vllm_doctor", *args]
    if close_stdin:  # the shell's `<&-`: fd 0 is not open at all
        cmd = ["sh", "-c", 'exec "$@" <&-', "sh", *cmd]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess, *words: str, prefix: str = "vllm-doctor: ") -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(prefix), proc.stderr
    assert "internal error" not in proc.stderr and all(w in proc.stderr for w in words), proc.stderr


def test_explain_of_a_closed_stdin():
    _one_line(_run("explain", "-", "--no-gpu", close_stdin=True), "standard input is closed")


# --- --metrics against a server that breaks HTTP ------------------------------------------

_BROKEN = {
    "no-status-line": b"this is not HTTP\r\n\r\n",
    "bad-status": b"HTTP/1.1 abc OK\r\n\r\n",
    "short-body": b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nvllm:num_requests_running 1\n",
    "bad-length": b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nx",
    "header-too-long": b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 70_000 + b"\r\n\r\n",
    "too-many-headers": b"HTTP/1.1 200 OK\r\n" + b"X-A: 1\r\n" * 200 + b"\r\n",
    "bad-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nvllm\r\n0\r\n\r\n",
    "closed-at-once": b"",
}


def _serve_once(reply: bytes) -> tuple[int, threading.Thread]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(reply)
            except OSError:
                pass
            time.sleep(0.1)
        listener.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


@pytest.mark.parametrize("reply", list(_BROKEN.values()), ids=list(_BROKEN))
def test_metrics_from_a_server_that_breaks_http(reply):
    port, thread = _serve_once(reply)
    proc = _run("explain", "--metrics", f"http://127.0.0.1:{port}/metrics", "--no-gpu")
    thread.join(5)
    _one_line(proc, f"127.0.0.1:{port}")


def test_the_metrics_fetch_names_the_protocol_error():
    from vllm_doctor.read.metrics import MetricsError, fetch

    port, thread = _serve_once(_BROKEN["short-body"])
    with pytest.raises(MetricsError, match="not a valid HTTP response \\(IncompleteRead"):
        fetch(f"http://127.0.0.1:{port}/metrics")
    thread.join(5)


# --- rule files that break the TOML reader ------------------------------------------------

_TOML = {
    "deep-array": "x = " + "[" * 100_000 + "]" * 100_000 + "\n",
    "deep-inline-table": "x = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n",
    "huge-integer": "priority = " + "9" * 10_000 + "\n",
    "dotted-key": ".".join(["a"] * 100_000) + " = 1\n",
    "dotted-table": "[" + ".".join(['"a"'] * 100_000) + "]\n",
}


@pytest.mark.parametrize("text", list(_TOML.values()), ids=list(_TOML))
@pytest.mark.parametrize("command", ["explain", "rules check"])
def test_a_rule_file_that_breaks_the_toml_reader(tmp_path, text, command):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "my-rule.toml").write_text(text + SAMPLE_RULE.replace('id = "my-rule"', ""))
    log = tmp_path / "x.log"
    log.write_text("it happened 3\n")
    if command == "explain":
        args, prefix = ["explain", str(log), "--rules", str(rules), "--no-gpu", "--strict-rules"], "vllm-doctor: "
    else:  # `rules check` lists problems as FILE: PROBLEM lines
        args, prefix = ["rules", "check", str(rules)], str(rules / "my-rule.toml")
    proc = _run(*args, timeout=120)  # the dotted key took minutes and then the OOM killer
    _one_line(proc, "my-rule.toml", "not valid TOML", prefix=prefix)


def test_a_rule_may_still_say_a_dotted_name_in_its_text(tmp_path):
    """The dotted-key guard reads keys, not strings: a regex or an example with dots passes."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.loader import load

    rules = tmp_path / "rules"
    rules.mkdir()
    text = SAMPLE_RULE.replace('example = "it happened 3"', 'example = "it happened 3 in vllm.v1.engine.core.x"')
    (rules / "my-rule.toml").write_text(text)
    assert [r.id for r in load([rules], builtin=False, checks=CHECKS)] == ["my-rule"]
