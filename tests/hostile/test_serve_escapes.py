"""Class 7 of issue 10: processes that escape the wrapper. A descendant that calls setsid()
leaves vLLM's process group, so a group signal misses it: it is still reaped and named. A
wrapper that is SIGKILLed cannot forward anything: vLLM is stopped by PR_SET_PDEATHSIG."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import LAB, alive, conforms

linux = pytest.mark.skipif(sys.platform != "linux", reason="/proc and prctl are Linux's")


def _env(**fake):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update({k: str(v) for k, v in fake.items()})
    return env


def _wait(cond, timeout=20.0, what=""):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


@linux
def test_a_descendant_that_called_setsid_is_reaped_and_named(tmp_path, fake_bin):
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--reap-wait", "1", "--", "m"],
        cwd=tmp_path,
        env=_env(FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:1", FAKE_ESCAPE=1),
        capture_output=True,
        timeout=60,
    )
    assert p.returncode == 1
    assert b"VLLM::Escaped (had left the process group)" in p.stderr
    (d,) = (tmp_path / "vllm-doctor-reports").iterdir()
    survivors = conforms((d / "report.json").read_text(), "serve-report-1")["serve"]["survivors"]
    (s,) = [s for s in survivors if "VLLM::Escaped" in s["command"]]
    assert s["killed"] and s["left_group"]
    assert not alive(s["pid"])  # reaped after --reap-wait, not left holding the pipes


@linux
def test_a_sigkilled_wrapper_stops_vllm(tmp_path, fake_bin):
    ready = tmp_path / "ready"
    w = subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--", "m"],
        cwd=tmp_path,
        env=_env(FAKE_END="wait", FAKE_READY=ready),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(ready.exists, what="the child never started")
        kids = Path(f"/proc/{w.pid}/task/{w.pid}/children").read_text().split()
        (child,) = [int(k) for k in kids if b"fakevllm" in Path(f"/proc/{k}/cmdline").read_bytes()]  # not the guardian
        assert alive(child)
        w.send_signal(signal.SIGKILL)
        w.wait(10)
        _wait(lambda: not alive(child), what="vLLM outlived its SIGKILLed wrapper")
    finally:
        if w.poll() is None:
            w.kill()
            w.wait()


def test_death_signal_is_a_no_op_without_prctl():
    from vllm_doctor.serve import process

    assert process._death_signal(None, os.getpid()) is None


@linux
def test_a_descendant_that_left_the_group_gets_the_forwarded_signal(tmp_path, fake_bin):
    """A worker that called setsid() is out of the group a signal to serve is forwarded to: it
    is sent the signal too (vLLM's workers shut down on SIGTERM), so it ends with the server,
    not at the reaping after --reap-wait."""
    pid_file = tmp_path / "escaped"
    ready = tmp_path / "ready"
    p = subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--preflight", "off"]
        + ["--grace", "2", "--reap-wait", "30", "--", "m"],
        cwd=tmp_path,
        env=_env(FAKE_END="wait", FAKE_ESCAPE="plain", FAKE_ESCAPE_PID=pid_file, FAKE_READY=ready),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait(lambda: ready.exists() and pid_file.exists(), what="the child never started")
        escaped = int(pid_file.read_text().split()[1])
        assert alive(escaped)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0  # the child's: its clean shutdown
    assert not alive(escaped)
    assert pid_file.read_text().split()[2:] == ["TERM"], (
        err
    )  # it was told (ended by the signal), not reaped after --reap-wait
