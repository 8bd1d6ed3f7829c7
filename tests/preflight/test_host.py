"""The host checks on this machine, for real: /dev/shm, the open-files limit, a disk, a bound port,
the RAM in /proc/meminfo. Only the GPUs are faked (NVML), to ask for TP 2."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
import time

import pytest
from preflight_fakes import h100s

from vllm_doctor.preflight import host, procfs
from vllm_doctor.preflight.args import parse
from vllm_doctor.preflight.context import Context

GIB = 2**30


def ctx(*argv, env=None, nvml=None, backend=None):
    return Context(parse(["/no/model", *argv], env=env or {}), nvml=nvml or h100s(2), backend=backend)


def test_shm_is_this_machines():
    st = os.statvfs("/dev/shm")
    size = st.f_blocks * st.f_frsize
    (one,) = host.shm(ctx())
    assert one.rule == "check-shm-one-rank" and one.numbers["shm_total_mib"] == size // 2**20
    found = host.shm(ctx("--tensor-parallel-size", "2"))
    if size <= host.CONTAINER_SHM:
        assert found[0].rule == "check-shm-container-default" and found[0].numbers["ranks"] == 2
    else:
        assert found == []


def test_open_files_limit_is_this_processes():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    found = host.open_files(ctx())
    if hard != resource.RLIM_INFINITY and hard < host.NOFILE_TARGET:
        assert found[0].numbers == {"soft": soft, "hard": hard} and found[0].rule == "check-open-files-limit"
    else:
        assert found == []


def test_disk_against_the_checkpoint(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    (big,) = host.disk_verdict(tmp_path / "hub" / "not-yet", free + 10 * GIB)  # a parent that exists is used
    assert (big.severity, big.category, big.rule) == ("blocker", "disk-full", "check-disk-too-small")
    assert abs(big.numbers["free_gib"] - free / GIB) < 1
    assert host.disk_verdict(tmp_path, 1.0) == []
    (unknown,) = host.disk_verdict(tmp_path, None)
    assert unknown.rule == "check-disk-size-unknown" and "unknown" in unknown.summary


def test_disk_goes_where_hf_home_says(tmp_path):
    c = Context(parse(["some-org/some-model"], env={"HF_HOME": str(tmp_path)}), offline=True)
    assert host._download_dir(c) == tmp_path / "hub"
    c = Context(parse(["some-org/some-model", "--download-dir", str(tmp_path / "d")], env={}), offline=True)
    assert host._download_dir(c) == tmp_path / "d"


def test_a_bound_port_and_who_holds_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        (found,) = host.port(ctx("--host", "127.0.0.1", "--port", str(port)))
        assert (found.category, found.rule) == ("port-in-use", "check-port-in-use")
        assert f"pid {os.getpid()}" in found.summary  # this test holds it, found through /proc/net/tcp
        assert found.fixes[0].value == str(port + 1)
    assert host.port(ctx("--host", "127.0.0.1", "--port", str(port))) == []  # closed: free again


def test_swap_space_against_this_machines_ram():
    total = procfs.meminfo()["MemTotal"]
    big = f"{0.8 * total / GIB:.1f}"
    found = host.host_ram(ctx("--swap-space", big))
    assert [(f.severity, f.category, f.rule) for f in found] == [
        ("blocker", "config-validation", "check-swap-space-too-large")
    ]
    assert "is above 70% of" in found[0].summary  # the fraction of rules/tables/preflight.toml
    mid = f"{0.5 * total / GIB:.1f}"
    assert [(f.severity, f.rule) for f in host.host_ram(ctx("--swap-space", mid))] == [
        ("warning", "check-swap-space-large")
    ]
    assert host.host_ram(ctx("--swap-space", "0")) == []


def test_cpu_kv_space_against_this_machines_node_memory():
    total = procfs.meminfo()["MemTotal"]
    too_much = str(int(2 * total / GIB) + 1)
    (found,) = host.host_ram(ctx(env={"VLLM_CPU_KVCACHE_SPACE": too_much}, backend="cpu"))
    assert found.rule == "check-cpu-kvcache-exceeds-ram" and found.numbers["kv_cache_gib"] == float(too_much)
    assert host.host_ram(ctx(env={"VLLM_CPU_KVCACHE_SPACE": "0.01"}, backend="cpu")) == []


def test_cpu_offload_against_this_machines_ram():
    available = procfs.meminfo()["MemAvailable"]
    too_much = str(int(2 * available / 1e9) + 1)
    found = host.host_ram(ctx("--cpu-offload-gb", too_much))
    assert [(f.severity, f.rule) for f in found] == [("blocker", "check-cpu-offload-exceeds-ram")]
    assert host.host_ram(ctx("--cpu-offload-gb", "0.001")) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root binds any port: no privileged port to refuse")
def test_a_privileged_port_needs_root():
    (found,) = host.port(ctx("--host", "127.0.0.1", "--port", "1"))
    assert (found.rule, found.fixes[0].value) == ("check-port-privileged", "8000")


def test_who_holds_a_port_is_named_by_its_program_never_its_arguments():
    """Another process's command line may hold a secret no mask knows: only the program is said."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--token", "s3cr3t-value"])
    try:
        end = time.monotonic() + 10
        while "s3cr3t-value" not in " ".join(procfs.cmdline(p.pid) or []):
            assert time.monotonic() < end
            time.sleep(0.01)
        said = procfs.describe(p.pid)
        assert said.startswith(f"pid {p.pid} (python") and "s3cr3t" not in said and "time.sleep" not in said
    finally:
        p.kill()
        p.wait()
