"""The sizing checks: several vLLM servers on one GPU, read from this machine's NVML process list
(NVML faked through capacity/gpu.py's adapter, nothing else) and each process's real command line
(/proc/<pid>/cmdline of processes this test starts, named like `vllm serve`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from conftest import FIXTURES
from vllm_doctor.capacity import gpu
from vllm_doctor.capacity.colocated import server_of
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.pipeline import explain

MIB = 2**20
HEALTHY_LOG = FIXTURES / "logs" / "healthy" / "0.6.4_memory-profiling-results-line.log"


class TwoServersNvml:
    """One 80 GiB card holding the given processes."""

    def __init__(self, pids: list[int]):
        self.pids = pids

    def open(self): ...
    def close(self): ...
    def driver_version(self):
        return "550.54.15"

    def cuda_version(self):
        return "12.4"

    def device_count(self):
        return 1

    def device_name(self, i):
        return "NVIDIA A100-SXM4-80GB"

    def memory(self, i):
        return (81920 * MIB, 60000 * MIB, 21920 * MIB)

    def processes(self, i):
        return [(pid, 30000 * MIB) for pid in self.pids]

    def process_name(self, pid):
        return "python3"


def _server(*argv: str) -> subprocess.Popen:
    """A real process whose command line is a vLLM server's (it only sleeps)."""
    import time
    from pathlib import Path

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    for _ in range(100):  # just after exec the kernel may show an empty command line
        if b"time.sleep" in cmdline.read_bytes():
            break
        time.sleep(0.02)
    return proc


@pytest.fixture
def servers(request) -> Iterator[list[int]]:
    procs = [_server(*argv) for argv in request.param]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _sharing(pids: list[int]):
    snap = gpu.snapshot(TwoServersNvml(pids))
    report = explain([str(HEALTHY_LOG)], options=Options(gpu_snapshot=snap, this_host=True))
    return {d.rule: d for d in report.diagnoses}


OVER = [
    ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--gpu-memory-utilization", "0.6"],
    ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--api-key", "sk-secret"],  # the default (0.92 in 0.32)
]
UNDER = [
    ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--gpu-memory-utilization=0.45"],
    ["-m", "vllm.entrypoints.openai.api_server", "--model", "m2", "--gpu_memory_utilization", "0.45"],
]


EXACT = [
    ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--gpu-memory-utilization", "0.7"],
    ["vllm", "serve", "m2", "--gpu-memory-utilization", "0.3"],
]


@pytest.mark.parametrize("servers", [EXACT], indirect=True)
def test_shares_that_sum_to_exactly_one_card_are_too_much(servers):
    """The first server holds its 0.7 and its CUDA context: the second's startup check sees less free than 0.3."""
    assert _sharing(servers)["gpu-shares-over-one"].numbers["utilization_sum"] == 1.0


@pytest.mark.parametrize("servers", [OVER], indirect=True)
def test_two_servers_asking_for_more_than_the_card_are_named_with_their_shares(servers):
    d = _sharing(servers)["gpu-shares-over-one"]
    assert d.numbers["utilization_sum"] == 1.52 and d.numbers["servers_on_gpu"] == 2  # 0.6 + the default 0.92
    text = d.numbers["shared_gpu_servers"]
    assert f"pid {servers[0]} (Qwen/Qwen2.5-7B-Instruct) 0.6" in text
    assert f"pid {servers[1]} (meta-llama/Llama-3.1-8B-Instruct) 0.92" in text
    assert "sk-secret" not in repr(d)  # only the model and the share leave the command line


@pytest.mark.parametrize("servers", [UNDER], indirect=True)
def test_shares_that_sum_under_one_stay_quiet(servers):
    assert "gpu-shares-over-one" not in _sharing(servers)
    assert server_of(servers[1])[1:] == ("m2", 0.45, True)


def test_a_process_that_is_no_vllm_server_is_not_counted():
    import os

    assert server_of(os.getpid()) is None or "vllm" in " ".join(sys.argv)
    assert "gpu-shares-over-one" not in _sharing([os.getpid(), os.getpid()])


def fired_rules() -> set[str]:
    """The rules the two-servers case reports (test_fixtures counts them as triggered)."""
    procs = [_server(*argv) for argv in OVER]
    try:
        return set(_sharing([p.pid for p in procs]))
    finally:
        for p in procs:
            p.kill()
            p.wait()
