"""The bulk families (access and stats lines read whole, matching/engine.py's _take) give the very
report the general path gives: every fixture and lab recording that has such lines, and a serving
log that mixes them with a failure, payloads, two servers and a restart, read both ways."""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from vllm_doctor.matching import engine
from vllm_doctor.read import logread
from vllm_doctor.render.json import to_dict

ACCESS = 'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" {status} OK'
STATS = (
    "({proc} pid={pid}) INFO 11-30 01:{m:02d}:{s:02d} [loggers.py:236] Engine 000: Avg prompt throughput: 12.0 tokens/s,"
    " Avg generation throughput: 40.5 tokens/s, Running: {run} reqs, Waiting: {wait} reqs, GPU KV cache usage: {kv}%"
)
HEAD = (
    "(APIServer pid={pid}) INFO 11-30 01:00:00 [logger.py:43] Received request cmpl-{i}: prompt: 'say Running: 3 reqs,"
    " Waiting: 1 reqs /v1/ CUDA out of memory', params: SamplingParams(n=1), lora_request: None."
)


def serving_log() -> str:
    lines = ["(APIServer pid=100) INFO 11-30 01:00:00 [api_server.py:1] vLLM API server version 0.10.1"]
    for i in range(3000):
        pid = 100 if i < 2000 else 300  # a restart with a new pid two thirds in
        if i == 2000:
            lines.append(f"(APIServer pid={pid}) INFO 11-30 01:30:00 [api_server.py:1] vLLM API server version 0.10.1")
        lines.append(HEAD.format(pid=pid, i=i))
        lines.append(ACCESS.format(port=30000 + i, status=500 if i % 97 == 0 else 200))
        if i % 50 == 0:
            lines.append(
                STATS.format(proc="APIServer", pid=pid, m=i // 60 % 60, s=i % 60, run=i % 9, wait=i % 4, kv=i % 100)
            )
            lines.append(STATS.format(proc="Other", pid=200, m=i // 60 % 60, s=i % 60, run=1, wait=0, kv=5))
        if i == 1500:
            lines.append("Running: 4 reqs, Waiting: 2 reqs,")  # a stats record cut by a wrap
            lines.append("GPU KV cache usage: 91.0%")
            lines.append(
                "(EngineCore pid=101) ERROR 11-30 01:25:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory."
            )
    return "\n".join(lines) + "\n"


def both_ways(run, paths, monkeypatch) -> tuple[dict, dict, int]:
    taken = 0
    real = logread.Bulk.__init__

    def counted(self, *args):
        nonlocal taken
        taken += 1
        real(self, *args)

    with monkeypatch.context() as m:
        m.setattr(logread.Bulk, "__init__", counted)
        fast = to_dict(run(*paths))
    with monkeypatch.context() as m:
        m.setattr(engine, "_families", lambda rules, by_anchor: {})
        slow = to_dict(run(*paths))
    return fast, slow, taken


def test_a_serving_log_reads_the_same_both_ways(run, tmp_path, monkeypatch):
    log = tmp_path / "serving.log"
    log.write_text(serving_log())
    fast, slow, taken = both_ways(run, [log], monkeypatch)
    assert taken > 3000  # the access and stats lines went the bulk way
    assert fast == slow
    assert len(fast["lifetimes"]) == 2


BULKY = sorted(
    p for p in FIXTURES.rglob("*.log") if any(a in p.read_text(errors="replace") for a in (" /v1/", "Running: "))
)


@pytest.mark.parametrize("log", BULKY, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recording_reads_the_same_both_ways(log, run, monkeypatch):
    fast, slow, _ = both_ways(run, [log], monkeypatch)
    assert fast == slow
