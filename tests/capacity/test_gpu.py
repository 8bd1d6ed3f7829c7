"""The NVML snapshot: the real adapter on this machine (usually no GPU: a reason, never a crash), and
a fake adapter, the one thing tests replace, for the shape of the snapshot and what explain says."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from conftest import FIXTURES, LAB
from vllm_doctor.capacity import gpu
from vllm_doctor.cli import app
from vllm_doctor.knowledge.checks import Options
from vllm_doctor.render.json import to_dict
from vllm_doctor.render.markdown import render as to_markdown
from vllm_doctor.render.text import render as to_text

MIB = 2**20


class FakeNvml:
    """Two 80 GiB cards; on GPU 0 another process holds 20 GiB."""

    def __init__(self, fail_on: str | None = None, devices=None):
        self.fail_on = fail_on
        self.closed = False
        self.devices = (
            devices
            if devices is not None
            else [
                ("NVIDIA H100 80GB HBM3", (81559 * MIB, 20480 * MIB, 61079 * MIB), [(4242, 20480 * MIB), (4243, None)]),
                ("NVIDIA H100 80GB HBM3", (81559 * MIB, 0, 81559 * MIB), []),
            ]
        )

    def _maybe_fail(self, what):
        if self.fail_on == what:
            raise type("NVMLError_LibraryNotFound", (Exception,), {})("NVML Shared Library Not Found")

    def open(self):
        self._maybe_fail("open")

    def close(self):
        self.closed = True

    def driver_version(self):
        return "550.54.15"

    def cuda_version(self):
        return "12.4"

    def device_count(self):
        self._maybe_fail("count")
        return len(self.devices)

    def device_name(self, i):
        return self.devices[i][0]

    def memory(self, i):
        return self.devices[i][1]

    def processes(self, i):
        return self.devices[i][2]

    def process_name(self, pid):
        return {4242: "python3", 4243: "jupyter"}[pid]


def test_the_real_adapter_never_raises():
    snap = gpu.snapshot()
    if snap.available:  # a machine with an NVIDIA GPU
        assert snap.devices and all(d.total_mib > 0 for d in snap.devices)
    else:
        assert snap.reason and snap.skipped_line == f"GPU checks skipped: {snap.reason}"


def test_snapshot_from_the_adapter():
    fake = FakeNvml()
    snap = gpu.snapshot(fake)
    assert snap.available and fake.closed
    assert (snap.driver_version, snap.cuda_version) == ("550.54.15", "12.4")
    d0 = snap.devices[0]
    assert (d0.index, d0.name, d0.total_mib, d0.used_mib, d0.free_mib) == (
        0,
        "NVIDIA H100 80GB HBM3",
        81559,
        20480,
        61079,
    )
    assert [(p.pid, p.name, p.used_mib) for p in d0.processes] == [(4242, "python3", 20480), (4243, "jupyter", None)]
    data = snap.to_json()
    assert {"available", "reason", "devices"} <= set(data)
    assert set(data["devices"][0]) == {"index", "name", "total_mib", "used_mib", "free_mib", "processes"}
    assert set(data["devices"][0]["processes"][0]) == {"pid", "name", "used_mib"}


def test_nvml_failures_are_a_reason():
    snap = gpu.snapshot(FakeNvml(fail_on="open"))
    assert not snap.available and snap.reason.startswith("no NVIDIA driver here")
    snap = gpu.snapshot(FakeNvml(fail_on="count"))
    assert not snap.available and snap.reason
    assert gpu.snapshot(FakeNvml(devices=[])).reason == "NVML sees no GPU"


def test_headroom_is_what_is_free():
    snap = gpu.snapshot(FakeNvml())
    assert gpu.headroom(snap.devices[0]) == 0.72  # 61,079 / 81,559 = 0.749, less a 0.02 margin
    assert gpu.headroom(snap.devices[1]) == 0.98


def test_explain_says_which_way_to_move_utilization(run):
    """Another process holds 20 GiB: the cache-oom numbers say vLLM's fraction must shrink to 0.72."""
    snap = gpu.snapshot(FakeNvml())
    report = run(LAB / "cache-oom.log", options=Options(gpu_snapshot=snap, this_host=True))
    facts = to_dict(report)["facts"]
    assert facts["gpu"]["available"] and facts["gpu"]["devices"][0]["processes"][0]["pid"] == 4242
    n = report.diagnoses[0].numbers
    assert n["gpu_free_utilization"] == 0.72 and n["gpu_used_by_others_gib"] == 20.0 and n["gpu_processes"] == 2
    md = to_markdown(report)
    assert "GPU 0 NVIDIA H100 80GB HBM3 (this machine, now): 81,559 MiB total, 20,480 used" in md
    assert "4242 python3 20,480 MiB" in md and "driver 550.54.15, CUDA 12.4" in md
    text = to_text(report, verbosity=0)  # they inform the fixes: on the first screen, without -v
    assert "GPU 0 NVIDIA H100 80GB HBM3 (this machine, now)" in text and "gpu_free_utilization" not in text
    assert "--gpu-memory-utilization that fits what is free now: 0.72" in to_text(report, verbosity=1)


def test_valid_tp_sizes_stop_at_the_gpus_present(run):
    snap = gpu.snapshot(FakeNvml())
    top = run(LAB / "tp-divisibility.log", options=Options(gpu_snapshot=snap, this_host=True)).diagnoses[0]
    assert top.numbers["gpus_present"] == 2
    assert top.numbers["valid_tp_sizes"] == [1, 2]


def test_cli_without_nvml_or_with_no_gpu_goes_on():
    runner = CliRunner()
    result = runner.invoke(app, ["explain", str(LAB / "healthy.log"), "--no-gpu", "-f", "json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["facts"]["gpu"]["reason"] == "not requested (--no-gpu)"
    result = runner.invoke(app, ["explain", str(LAB / "healthy.log"), "-v"], env={"NO_COLOR": "1", "COLUMNS": "300"})
    assert result.exit_code == 0 and "Traceback" not in result.output
    snap = gpu.snapshot()
    if not snap.available:
        assert f"GPU checks skipped: {snap.reason}" in result.output


def test_no_driver_on_the_machine_is_said_without_loading_nvml(monkeypatch):
    monkeypatch.setattr(gpu, "DRIVER_MARKERS", ("/nonexistent/nvidiactl",))
    monkeypatch.setattr(gpu, "Nvml", lambda: (_ for _ in ()).throw(AssertionError("NVML loaded")))
    snap = gpu.snapshot()
    assert not snap.available and snap.reason.startswith("no NVIDIA driver here")


def test_a_busy_local_gpu_changes_no_fix_of_a_foreign_log(run):
    """The log is from another machine (nothing in it is this one's): this machine's GPUs are shown
    apart and the fixes come from the log alone; with --this-host (or under serve) they inform them."""
    snap = gpu.snapshot(FakeNvml())  # another process holds 20 GiB of GPU 0 here
    log = FIXTURES / "logs" / "cache-oom" / "0.10.2_colour-real-esc-sequences.log"
    plain = run(log, options=Options())
    foreign = run(log, options=Options(gpu_snapshot=snap))
    local = run(log, options=Options(gpu_snapshot=snap, this_host=True))

    def fixes(report):
        return [(f.action, f.value) for d in report.diagnoses for f in d.fixes]

    assert fixes(foreign) == fixes(plain)
    assert not any("Lower --gpu-memory-utilization to 0.72" in a for a, _ in fixes(foreign))
    assert "Lower --gpu-memory-utilization to 0.72: other processes hold 20 GiB on this GPU" in [
        a for a, _ in fixes(local)
    ]
    assert "gpu_free_utilization" not in foreign.diagnoses[0].numbers
    facts = to_dict(foreign)["facts"]["gpu"]
    assert facts["this_host"] is False and facts["devices"][0]["used_mib"] == 20480  # shown, apart
    md = to_markdown(foreign)
    assert "This machine's GPUs (not the log's machine: they inform no fix" in md
    tp = FIXTURES / "logs" / "tp-divisibility" / "0.10.1_attention-heads-pydantic-value-error.log"  # a GPU's
    assert any("--tensor-parallel-size 4" in a for a, _ in fixes(run(tp, options=Options(gpu_snapshot=snap))))
    assert not any(
        "--tensor-parallel-size 4" in a for a, _ in fixes(run(tp, options=Options(gpu_snapshot=snap, this_host=True)))
    )


def test_a_log_naming_a_pid_that_holds_this_gpu_is_this_hosts(run, tmp_path):
    snap = gpu.snapshot(FakeNvml())
    log = tmp_path / "here.log"
    log.write_text(
        (LAB / "tp-divisibility.log").read_text()
        + "(EngineCore_DP0 pid=4242) INFO 11-30 01:54:00 [x.py:1] Using max model len 4096\n"
    )
    report = run(log, options=Options(gpu_snapshot=snap))
    assert to_dict(report)["facts"]["gpu"]["this_host"] is True
    assert report.diagnoses[0].numbers["gpus_present"] == 2
