"""The GPUs now, through the NVML fake: memory held by real processes of this machine (named from
their /proc/<pid>/cmdline: a vLLM server, a leftover EngineCore), the fractions other servers asked
for, the driver against torch's CUDA build, and compute capability against dtype and quantisation."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest
from preflight_fakes import h100s

from conftest import FIXTURES
from vllm_doctor.preflight import gpunow, procfs
from vllm_doctor.preflight.args import parse
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun

SLEEP = "import time; time.sleep(60)"
LLAMA = str(FIXTURES / "configs" / "llama-3-8b")


def _started(p: subprocess.Popen, word: str, first: bool = False) -> int:
    """The pid once its /proc/<pid>/cmdline shows `word` (as argv[0] with `first`): the exec has
    happened, not only the fork, whose copy of the parent's command line may hold the word too."""
    end = time.monotonic() + 10
    while not _shows(p.pid, word, first):
        assert time.monotonic() < end, "the child never exec'd"
        time.sleep(0.01)
    return p.pid


def _shows(pid: int, word: str, first: bool) -> bool:
    argv = procfs.cmdline(pid) or []
    return argv[:1] == [word] if first else word in " ".join(argv)


@pytest.fixture
def other_server():
    """A real process whose command line is another vLLM server at --gpu-memory-utilization 0.6."""
    p = subprocess.Popen(
        [sys.executable, "-c", SLEEP, "/usr/bin/vllm", "serve", "m", "--gpu-memory-utilization", "0.6"]
    )
    yield _started(p, "serve")
    p.kill()
    p.wait()


@pytest.fixture
def engine_core():
    """A real process named as vLLM names its engine (argv[0] VLLM::EngineCore)."""
    p = subprocess.Popen(["bash", "-c", f'exec -a VLLM::EngineCore "{sys.executable}" -c "{SLEEP}"'])
    yield _started(p, "VLLM::EngineCore", first=True)
    p.kill()
    p.wait()


@pytest.fixture
def server_with_engine():
    """A real vLLM-like server (its command line `vllm serve m --gpu-memory-utilization 0.5`) whose
    child, titled VLLM::EngineCore as vLLM titles it, is what NVML lists on the GPU."""
    child = f"subprocess.Popen(['bash', '-c', 'exec -a VLLM::EngineCore {sys.executable} -c \\'{SLEEP}\\''])"
    code = f"import subprocess, time; {child}; time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code, "vllm", "serve", "m", "--gpu-memory-utilization", "0.5"])
    _started(p, "serve")
    end = time.monotonic() + 10
    while True:
        kids = [str(c.pid) for c in psutil.Process(p.pid).children()]
        if kids and _shows(int(kids[0]), "VLLM::EngineCore", first=True):  # exec'd, not the fork's copy of us
            break
        assert time.monotonic() < end, "the engine never started"
        time.sleep(0.01)
    yield p.pid, int(kids[0])
    subprocess.run(["kill", kids[0]], check=False)
    p.kill()
    p.wait()


def ctx(*argv, nvml, env=None):
    return Context(parse([LLAMA, *argv], env=env or {}), nvml=nvml, offline=True)


def test_memory_held_by_another_vllm_is_named(other_server, engine_core):
    nvml = h100s(1, free=30000, processes=[(other_server, 40000), (engine_core, 11000)])
    (found,) = gpunow.gpu_free(ctx(nvml=nvml))
    assert (found.category, found.severity, found.rule) == ("gpu-memory-occupied", "blocker", "check-gpu-memory-held")
    assert f"pid {other_server} a vLLM server (40,000 MiB)" in found.summary
    assert f"pid {engine_core} a vLLM EngineCore (11,000 MiB)" in found.summary
    assert found.numbers["max_utilization"] == 0.34  # floor((30000 / 81559 - 0.02) x 100) / 100
    assert gpunow.gpu_free(ctx("--gpu-memory-utilization", "0.3", nvml=nvml)) == []


def test_fractions_of_other_servers_add_up(other_server):
    nvml = h100s(1, free=81559 - 40000, processes=[(other_server, 40000)])
    (found,) = gpunow.other_servers(ctx(nvml=nvml))
    assert found.rule == "check-gpu-servers-oversubscribed" and found.numbers["sum"] == 1.52  # 0.6 + 0.32's 0.92
    assert found.fixes[0].value == "0.38"  # 1 - 0.6 - 0.02
    (fine,) = gpunow.other_servers(ctx("--gpu-memory-utilization", "0.35", nvml=nvml))
    assert fine.rule == "check-gpu-shared-by-servers" and fine.severity == "info" and fine.numbers["sum"] == 0.95
    (edge,) = gpunow.other_servers(ctx("--gpu-memory-utilization", "0.4", nvml=nvml))  # exactly the card
    assert edge.rule == "check-gpu-servers-oversubscribed" and edge.numbers["sum"] == 1.0  # the later start fails


def test_the_engine_holds_the_memory_and_its_server_asked_for_the_fraction(server_with_engine):
    server, engine = server_with_engine
    nvml = h100s(1, free=40000, processes=[(engine, 40000)])
    (found,) = gpunow.other_servers(ctx(nvml=nvml))
    assert found.severity == "blocker" and found.numbers["sum"] == 1.42 and f"pid {server} at 0.50" in found.summary
    (held,) = gpunow.gpu_free(ctx(nvml=nvml))
    assert f"pid {engine} a vLLM EngineCore of the server pid {server} (40,000 MiB)" in held.summary


def test_cuda_visible_devices_picks_the_gpus():
    nvml = h100s(2)
    nvml.gpus[1] = ("NVIDIA H100 80GB HBM3", 81559, 1000, [], (9, 0))
    (found,) = gpunow.gpu_free(ctx(nvml=nvml, env={"CUDA_VISIBLE_DEVICES": "1"}))
    assert found.numbers["gpu"] == 1
    assert gpunow.gpu_free(ctx(nvml=nvml, env={"CUDA_VISIBLE_DEVICES": "0"})) == []
    with pytest.raises(CannotRun, match="no GPU is visible"):
        gpunow.gpu_free(ctx(nvml=nvml, env={"CUDA_VISIBLE_DEVICES": ""}))


@pytest.mark.parametrize(
    ("torch", "cuda", "severity", "rule"),
    [("2.5.1+cu124", "12.4", None, None), ("2.5.1+cu124", "12.2", "warning", "check-driver-older-than-torch"),
     ("2.7.0+cu128", "11.8", "blocker", "check-driver-too-old")],
)  # fmt: skip
def test_driver_against_torchs_cuda(torch, cuda, severity, rule):
    found = gpunow.driver_verdict(torch, cuda, "535.0")
    assert [(f.severity, f.rule) for f in found] == ([(severity, rule)] if severity else [])
    assert all(f"supports up to {cuda}" in f.summary for f in found)


def test_torch_without_a_cuda_build_cannot_be_told():
    with pytest.raises(CannotRun, match="does not name its CUDA build"):
        gpunow.driver_verdict("2.5.1", "12.4", "535.0")


def test_bf16_and_quantisation_need_compute_capability():
    t4 = h100s(1, capability=(7, 5))
    (explicit,) = gpunow.capability(ctx("--dtype", "bfloat16", nvml=t4))
    assert (explicit.severity, explicit.category, explicit.rule) == (
        "blocker",
        "unsupported-dtype",
        "check-bfloat16-unsupported",
    )
    (auto,) = gpunow.capability(ctx(nvml=t4))  # llama-3-8b is bfloat16: vLLM 0.9+ falls back to float16
    assert (auto.severity, auto.rule) == (
        "info",
        "check-bfloat16-falls-back",
    ) and "compute capability 7.5" in auto.summary
    found = gpunow.capability(ctx("--dtype", "half", "--quantization", "awq_marlin", nvml=t4))
    assert [(f.category, f.numbers["min_capability"]) for f in found] == [("quantization-unsupported", 80)]
    assert found[0].rule == "check-quantization-capability" and "awq_marlin" in found[0].summary
    assert gpunow.capability(ctx("--dtype", "bfloat16", nvml=h100s(1))) == []
