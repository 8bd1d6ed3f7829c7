"""Classes 9, 3 (serve) and 10 of issue 25: the wrapper SIGKILLed while vLLM hangs on "Waiting
for connections to close" (ignoring SIGTERM, the death signal) takes vLLM and its EngineCore
with it (the guardian, serve/guardian.py); it leaves no raw capture in the temp dir; and a
symlink planted at --log-file or at a picture's name beside the report is not written through.
And issue 20's leftover: the exit waits for the live watch to end, not for 2 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from conftest import LAB, alive
from vllm_doctor.serve import options as options_mod
from vllm_doctor.serve import watch as watch_mod
from vllm_doctor.serve import wrapper as serve_mod

SECRET = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
SAFETY = 60.0  # seconds: only a net for a broken build; each wait ends on its event


def _env(tmp_path, **fake) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update({k: str(v) for k, v in fake.items()}, NO_COLOR="1", TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


def _serve(tmp_path, fake_bin, *args, **fake) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--preflight", "off", *args]
    return subprocess.Popen(
        [*cmd, "--", "/m"],
        cwd=tmp_path,
        env=_env(tmp_path, **fake),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _until(check, what: str) -> None:
    end = time.monotonic() + SAFETY
    while not check():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def _stderr_line(p: subprocess.Popen, needle: bytes) -> threading.Event:
    """Set once the wrapper's stderr carries `needle` (read in a thread to its end)."""
    seen = threading.Event()

    def read() -> None:
        for line in p.stderr:
            if needle in line:
                seen.set()

    threading.Thread(target=read, daemon=True).start()
    return seen


def _kill_wrapper(p: subprocess.Popen) -> list[int]:
    """SIGKILL the wrapper; returns the pids of what it had started (vLLM, EngineCore, guardian)."""
    below = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
    p.kill()
    p.wait(SAFETY)
    return below


def _gone(pids: list[int]) -> None:
    try:
        _until(lambda: not any(alive(q) for q in pids), f"still running: {[q for q in pids if alive(q)]}")
    finally:
        for q in pids:  # a failed run leaves nothing behind on the machine
            if alive(q):
                os.kill(q, signal.SIGKILL)


def test_a_killed_wrapper_ends_vllm_hung_in_its_shutdown(tmp_path, fake_bin):
    ready = tmp_path / "ready"
    p = _serve(tmp_path, fake_bin, "--grace", "2", FAKE_REPLAY=LAB / "healthy.log", FAKE_END="hang",
               FAKE_ORPHAN=1, FAKE_READY=ready)  # fmt: skip
    hung = _stderr_line(p, b"Waiting for connections to close")
    _until(ready.exists, "the fake never became ready")
    _until(lambda: "VLLM::EngineCore" in str([c.cmdline() for c in psutil.Process(p.pid).children(True)]),
           "vLLM's EngineCore never started")  # fmt: skip
    p.send_signal(signal.SIGTERM)
    assert hung.wait(SAFETY), "vLLM never began its shutdown"
    below = _kill_wrapper(p)
    names = [" ".join(psutil.Process(q).cmdline()) for q in below if alive(q)]
    assert any("fakevllm" in n for n in names) and any("VLLM::EngineCore" in n for n in names), names
    _gone(below)  # vLLM ignored SIGTERM (and its EngineCore does always): SIGKILL after the grace


def test_a_killed_wrapper_leaves_no_raw_capture(tmp_path, fake_bin):
    recording = tmp_path / "secret.log"
    recording.write_bytes((LAB / "healthy.log").read_bytes() + f"HF_TOKEN={SECRET} loaded\n".encode())
    p = _serve(tmp_path, fake_bin, FAKE_REPLAY=recording, FAKE_END="wait")
    tmp = tmp_path / "tmp"

    def raw() -> list[str]:
        return [f.name for f in tmp.rglob("*") if f.is_file() and SECRET.encode() in f.read_bytes()]

    _until(raw, "the capture never held the output")  # the raw capture exists while the wrapper runs
    _gone(_kill_wrapper(p))
    assert raw() == []


def test_a_symlink_at_the_log_file_is_not_followed(tmp_path, fake_bin):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "server.log").symlink_to(victim)
    p = _serve(tmp_path, fake_bin, "--log-file", "server.log", FAKE_REPLAY=LAB / "tp-divisibility.log",
               FAKE_END="exit:1")  # fmt: skip
    _, err = p.communicate(timeout=SAFETY)
    assert p.returncode == 1
    assert victim.read_text() == "precious\n"
    assert b"cannot write server.log (a symbolic link, not followed); capturing to a temporary file" in err
    (d,) = (tmp_path / "vllm-doctor-reports").iterdir()  # the report still has the output
    assert (d / "server.log").read_bytes() == (LAB / "tp-divisibility.log").read_bytes()


def test_a_symlink_at_a_picture_beside_the_report_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "report.memory.svg").symlink_to(victim)
    p = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(LAB / "cache-oom.log"), "-o", "report.md"],
        cwd=tmp_path,
        capture_output=True,
        timeout=SAFETY,
    )
    assert victim.read_text() == "precious\n"
    assert p.returncode == 2
    assert p.stderr.decode().strip().splitlines() == [
        "vllm-doctor: report.memory.svg: cannot write (a symbolic link, not followed)"
    ]


def test_a_slow_live_watch_is_waited_for_at_the_exit(tmp_path, fake_bin, monkeypatch):
    """Issue 20's leftover: the wrapper waited 2 s for the watch at the exit, so on a loaded
    machine its warning was lost. It waits for the watch to read its queue to the end."""
    check = watch_mod.Watcher._check
    calls = []

    def slow(self, *args):  # a machine busy enough that the watch takes seconds to catch up
        if not calls:
            time.sleep(3)
        calls.append(1)
        return check(self, *args)

    monkeypatch.setattr(watch_mod.Watcher, "_check", slow)
    monkeypatch.setenv("FAKE_REPLAY", str(LAB / "queue-saturation.log"))
    monkeypatch.setenv("FAKE_END", "exit:0")
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "out", "wb") as out, open(tmp_path / "err", "wb") as err:
        opts = options_mod.ServeOptions(["/m"], vllm_bin=str(fake_bin), stdout_fd=out.fileno(), stderr_fd=err.fileno())
        serve_mod.run(opts)
    warnings = [ln for ln in (tmp_path / "err").read_text().splitlines() if "[vllm-doctor] warning" in ln]
    assert len(warnings) == 1 and "queue-saturation" in warnings[0]
