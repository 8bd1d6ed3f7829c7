"""Class 4 of issue 25: `explain --follow` under a file that changes under it. The real command
follows a file in tmp_path while the test rotates it (a new file at the name), truncates and
rewrites it past its old size, points its symlink elsewhere, feeds it /dev/zero, or grows it
faster than it is read; each event is said on stderr and in the report, the failure written
after it is found, the temp dir stays bounded, and SIGTERM brings the report at once."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from conftest import LAB, ROOT

OOM = LAB / "cache-oom.log"
HEALTHY = LAB / "healthy.log"
SAFETY = 60  # seconds: a net under every wait, never a timing assertion


def _follow(path: Path, tmp_path: Path) -> subprocess.Popen:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_DOCTOR_", "FORCE_COLOR", "NO_COLOR"))}
    env.update({"PYTHONPATH": str(ROOT / "src"), "VLLM_DOCTOR_CONFIG": "", "TMPDIR": str(tmp)})
    return subprocess.Popen(
        [sys.executable, "-m", "vllm_doctor", "explain", "--follow", str(path), "--no-gpu", "--offline"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _read_to(p: subprocess.Popen, path: Path, offset: int) -> None:
    """Wait until the follow holds `path` open and has read it to `offset` (psutil's fd position)."""
    real, end = os.path.realpath(path), time.monotonic() + SAFETY
    while time.monotonic() < end:
        try:
            if any(f.path == real and f.position >= offset for f in psutil.Process(p.pid).open_files()):
                return
        except psutil.Error:
            break
        time.sleep(0.05)
    p.kill()
    raise AssertionError(f"the follow never read {path} to {offset}: {p.communicate()}")


def _stderr_line(p: subprocess.Popen, word: bytes) -> bytes | None:
    """The first line on stderr holding `word`, or None when none comes (or the process ends)."""
    end, got = time.monotonic() + SAFETY, b""
    while time.monotonic() < end:
        if select.select([p.stderr], [], [], max(0.0, end - time.monotonic()))[0]:
            byte = os.read(p.stderr.fileno(), 1)
            if not byte:
                return None
            got += byte
            if byte == b"\n":
                if word in got:
                    return got
                got = b""
    return None


def _report(p: subprocess.Popen) -> tuple[int, bytes, bytes]:
    p.send_signal(signal.SIGTERM)
    try:
        out, err = p.communicate(timeout=SAFETY)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"no report within {SAFETY} s of SIGTERM: {out[-500:]!r}") from None
    assert b"Traceback" not in err, err
    return p.returncode, b" ".join(out.split()), err


def _failed_after(p: subprocess.Popen, word: bytes) -> None:
    said = _stderr_line(p, word)
    code, out, _ = _report(p)
    assert said is not None and said.startswith(b"vllm-doctor: "), said
    assert code == 1 and out.startswith(b"vllm-doctor: failed: cache-oom"), out[:300]
    assert word in out  # the event is in the report's notes too


def test_a_rotated_log_is_followed_to_the_new_file(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(HEALTHY.read_bytes())
    p = _follow(log, tmp_path)
    _read_to(p, log, log.stat().st_size)
    log.rename(tmp_path / "server.log.1")  # logrotate's create: the old file moves, a new one takes the name
    log.write_bytes(OOM.read_bytes())
    _failed_after(p, b"rotated")


def test_a_log_truncated_and_rewritten_past_its_old_size_is_read_again(tmp_path):
    log = tmp_path / "server.log"
    old = HEALTHY.read_bytes() * (OOM.stat().st_size // HEALTHY.stat().st_size + 1)
    new = OOM.read_bytes() + b"\n" * (len(old) - OOM.stat().st_size + 4096)  # the failure lies before the old end
    log.write_bytes(old)
    p = _follow(log, tmp_path)
    _read_to(p, log, len(old))
    with log.open("r+b") as f:  # copytruncate and the writer's next lines, as the follow wakes to them
        f.write(new)
    _failed_after(p, b"truncated")


def test_a_symlink_pointed_at_another_file_is_followed(tmp_path):
    a, b, link = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "server.log"
    a.write_bytes(HEALTHY.read_bytes())
    b.write_bytes(OOM.read_bytes())
    link.symlink_to(a)
    p = _follow(link, tmp_path)
    _read_to(p, a, a.stat().st_size)
    (tmp_path / "next").symlink_to(b)
    os.replace(tmp_path / "next", link)
    _failed_after(p, b"now points to")


def _temp_bytes(tmp: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in tmp.rglob("*") if f.is_file())


def test_an_endless_input_keeps_the_temp_dir_and_memory_bounded(tmp_path):
    p = _follow(Path("/dev/zero"), tmp_path)
    proc, end, peak = psutil.Process(p.pid), time.monotonic() + SAFETY, 0
    while proc.io_counters().read_chars < 300e6 and time.monotonic() < end:
        peak = max(peak, _temp_bytes(tmp_path / "tmp"))
        time.sleep(0.05)
    read, rss = proc.io_counters().read_chars, proc.memory_info().rss
    peak = max(peak, _temp_bytes(tmp_path / "tmp"))
    code, out, _ = _report(p)
    assert read >= 300e6, read  # it read a lot
    assert peak < 40e6 and rss < 300e6, (peak, rss)  # and held little of it
    assert out.startswith(b"vllm-doctor: ") and code in (0, 4), out[:300]
    assert _temp_bytes(tmp_path / "tmp") == 0  # the spool is gone with it


def test_sigterm_reports_at_once_while_the_log_grows_fast(tmp_path):
    """A writer appends access and stats lines as fast as it can: the follow keeps reading, and
    SIGTERM brings the report of what was read (not of the file still growing) and the exit."""
    log = tmp_path / "server.log"
    lines = HEALTHY.read_bytes().splitlines(keepends=True)
    block = b"".join(ln for ln in lines if b"POST" in ln or b"throughput" in ln) * 400
    log.write_bytes(HEALTHY.read_bytes())
    stop = threading.Event()

    def write() -> None:
        with log.open("ab") as f:
            while not stop.is_set() and f.tell() < 200e6:
                f.write(block)
                f.flush()

    writer = threading.Thread(target=write, daemon=True)
    p = _follow(log, tmp_path)
    writer.start()
    try:
        _read_to(p, log, 40_000_000)
        code, out, _ = _report(p)
    finally:
        stop.set()
        writer.join()
    assert code == 0 and out.startswith(b"vllm-doctor: healthy"), out[:300]
    assert b"were left out" in out  # what the bounded spool cut is said
