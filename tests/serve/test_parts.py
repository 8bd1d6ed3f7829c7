"""The serve parts on their own: the chunk pump, the marker detector, the one kill function,
the capture, and the live watch's candidate-line feed (logread.ChunkLines)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from vllm_doctor.read.logread import MAX_LINE, WINDOW, ChunkLines
from vllm_doctor.read.prefilter import Prefilter
from vllm_doctor.serve import process
from vllm_doctor.serve.capture import Capture
from vllm_doctor.serve.markers import FATAL_CHARS, FATAL_MARKERS, HANG_MARKER, READY_MARKERS, Markers
from vllm_doctor.serve.options import Outcome
from vllm_doctor.serve.passthrough import Output, Pump
from vllm_doctor.serve.watch import ChunkQueue


def _random_stream(rng: random.Random) -> tuple[bytes, list[bytes]]:
    """Random binary data with every marker in it, cut into random chunks (markers split too)."""
    parts = []
    for m in (*READY_MARKERS, *FATAL_MARKERS, HANG_MARKER):
        parts += [rng.randbytes(rng.randrange(0, 5000)), b"\n" + m + b" and the rest\n"]
    data = b"".join(parts) + rng.randbytes(100_000)
    chunks, at = [], 0
    while at < len(data):
        n = rng.choice((1, 2, 7, 100, 4096, 70_000))
        chunks.append(data[at : at + n])
        at += n
    return data, chunks


# --------------------------------------------------------------------------------------------
# the pump
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pump_passes_random_chunks_byte_for_byte(tmp_path, seed):
    data, chunks = _random_stream(random.Random(seed))
    r, w = os.pipe()
    out_path = tmp_path / "out"
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT, 0o600)

    def writer():
        for c in chunks:
            os.write(w, c)
        os.close(w)

    side: list[bytes] = []
    o = Outcome(status=0)
    markers = Markers(o)

    def on_chunk(fd, chunk):
        side.append(chunk)
        markers.feed(chunk)

    pump = Pump({r: out_fd}, Output((out_fd,)), on_chunk)
    t = threading.Thread(target=writer)
    t.start()
    end = time.monotonic() + 30
    while pump.open and time.monotonic() < end:
        pump.step(0.1)
    t.join()
    pump.close()
    os.close(r)
    os.close(out_fd)
    assert out_path.read_bytes() == data
    assert b"".join(side) == data  # the side readers get the very same chunks
    assert o.ready and o.hung
    assert [line.split(b" and")[0] for line in map(str.encode, o.fatal_lines)] == list(FATAL_MARKERS)


def test_output_survives_a_reader_that_went_away():
    r, w = os.pipe()
    os.close(r)
    out = Output((w,))
    old = signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        out.write(w, b"lost\n")  # EPIPE: the stream stops, nothing raises
        out.write(w, b"more\n")
    finally:
        signal.signal(signal.SIGPIPE, old)
        os.close(w)
    assert w in out.dead


# --------------------------------------------------------------------------------------------
# markers
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("marker", [*READY_MARKERS, *FATAL_MARKERS, HANG_MARKER])
def test_marker_split_at_every_position(marker):
    line = b"(EngineCore_DP0 pid=1) ERROR 11-30 01:58:49 [core.py:1] " + marker + b": it is over\n"
    before = b"x" * 50 + b"\n"
    stream = before + line + b"after\n"
    start = len(before) + line.index(marker)
    for cut in range(start, start + len(marker) + 1):
        o = Outcome(status=0)
        m = Markers(o)
        for piece in (stream[:cut], stream[cut:]):
            m.feed(piece)
        m.finish()
        assert o.ready is (marker in READY_MARKERS)
        assert o.hung is (marker == HANG_MARKER)
        assert o.fatal_lines == ([line[:-1].decode()] if marker in FATAL_MARKERS else []), cut


def test_fatal_line_in_many_small_chunks_and_long():
    o = Outcome(status=0)
    m = Markers(o)
    line = b"EngineDeadError: " + b"y" * 5000 + b"\n"
    for i in range(0, len(line), 3):
        m.feed(line[i : i + 3])
    m.feed(b"EngineDeadError at the end, no newline")
    m.finish()
    assert o.fatal_lines == [line.decode()[:FATAL_CHARS], "EngineDeadError at the end, no newline"]


def test_marker_not_found_across_lines_or_twice():
    o = Outcome(status=0)
    m = Markers(o)
    for piece in (b"Waiting for conn", b"\nections to close\n"):
        m.feed(piece)
    assert not o.hung


# --------------------------------------------------------------------------------------------
# the one kill function
# --------------------------------------------------------------------------------------------
def _sleeper(group: bool) -> subprocess.Popen:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    return subprocess.Popen([sys.executable, "-c", code], process_group=0 if group else None)


def _wait_members(pgid, n):
    end = time.monotonic() + 10
    while len(process.group_members(pgid)) < n:
        assert time.monotonic() < end
        time.sleep(0.05)


def test_signal_group_kills_the_whole_group():
    p = _sleeper(group=True)
    _wait_members(p.pid, 2)
    pids = [pid for pid, _ in process.group_members(p.pid)]
    process.signal_group(p.pid, signal.SIGKILL)
    assert p.wait(10) == -signal.SIGKILL
    end = time.monotonic() + 10
    while process.group_members(p.pid):
        assert time.monotonic() < end, pids
        time.sleep(0.05)


def test_signal_group_falls_back_to_the_process():
    p = _sleeper(group=False)  # in our group: no group of its own to signal
    try:
        process.signal_group(p.pid, signal.SIGTERM, waited=True)  # waited: the group only
        assert p.poll() is None
        process.signal_group(p.pid, signal.SIGTERM)
        assert p.wait(10) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    process.signal_group(p.pid, signal.SIGTERM, waited=True)  # gone: no error


def test_reap_kills_and_names_survivors():
    p = _sleeper(group=True)
    _wait_members(p.pid, 2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    survivors, line = process.reap(p.pid)
    assert len(survivors) == 1 and survivors[0]["killed"]
    assert line is not None and "1 of vLLM's processes outlived the main one" in line
    assert process.reap(p.pid) == ([], None)


# --------------------------------------------------------------------------------------------
# the capture
# --------------------------------------------------------------------------------------------
def test_capture_keeps_lines_whole_across_streams(tmp_path):
    cap = Capture(lambda m: None, [])
    cap.open(tmp_path / "c.log")
    fed = []
    fed += cap.add(1, b"out one\nout tw")
    fed += cap.add(2, b"err one\n")
    fed += cap.add(1, b"o\n")
    fed += cap.add(2, b"err tail")
    fed += cap.finish()
    text = (tmp_path / "c.log").read_bytes()
    assert text == b"out one\nerr one\nout two\nerr tail\n"
    assert b"".join(bytes(p) for p in fed) == text  # the watch reads what the file holds


# --------------------------------------------------------------------------------------------
# the live watch's feed
# --------------------------------------------------------------------------------------------
STATS = b"INFO 11-30 01:58:49 [loggers.py:335] Engine 000: Running: 7 reqs, Waiting: 9 reqs, GPU KV cache usage: 98.4%"


def test_chunk_lines_split_across_chunks():
    reader = ChunkLines(Prefilter(["KV cache usage"]))
    stream = b"one\ntwo\n" + STATS + b"\nfour\n" + STATS + b"\n"
    lines = []
    for i in range(0, len(stream), 7):
        lines += reader.feed(stream[i : i + 7])
    assert [ln.no for ln in lines] == [3, 5]
    assert all(ln.raw == STATS.decode() and ln.hit and ln.anchors == (0,) for ln in lines)
    assert reader.lines == 5


def test_chunk_lines_long_line_is_windowed_and_bounded():
    reader = ChunkLines(Prefilter(["KV cache usage"]))
    lines = reader.feed(b"first\n")
    piece = b"x" * (1 << 16)
    for i in range(48):  # 3 MiB without a newline, the anchor in the middle
        lines += reader.feed(piece + (STATS if i == 24 else b""))
        assert len(reader._buf) <= ChunkLines.HOLD + len(piece) + len(STATS)
    lines += reader.feed(b"\nlast " + STATS + b"\n")
    assert [ln.no for ln in lines] == [2, 3]
    assert "KV cache usage: 98.4%" in lines[0].raw and len(lines[0].raw) <= 2 * WINDOW <= MAX_LINE
    assert lines[1].raw == "last " + STATS.decode()


def test_chunk_lines_gap_drops_the_broken_line():
    reader = ChunkLines(Prefilter(["KV cache usage"]))
    assert reader.feed(b"GPU KV cache") == []
    reader.gap()
    lines = reader.feed(b" usage: lost\n" + STATS + b"\n")
    assert [ln.raw for ln in lines] == [STATS.decode()]


def test_chunk_queue_drops_rather_than_blocks():
    q = ChunkQueue(limit=10)
    q.put([b"12345"])
    q.put([b"123456"])  # over the limit: dropped at once
    q.put([b"abc"])
    assert q.dropped == 1
    assert q.get() == [(False, [b"12345"]), (True, [b"abc"])]
    q.close()
    assert q.get() is None


def test_signal_left_reaches_only_our_childs_escaped_descendants(tmp_path):
    """process.signal_left: the descendants of our child that left its group; nothing for a pid
    that is not our child (one that was waited for may be another process's by now)."""
    script = "import os, subprocess, time; subprocess.Popen(['sleep', '30'], start_new_session=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], process_group=0)
    try:
        for _ in range(200):
            table = process._table()
            left = [p for p in process._below(table, child.pid, set()) if table[p][1] != child.pid]
            if left:
                break
            time.sleep(0.05)
        assert left
        assert process.signal_left(os.getppid(), 0) == []  # our parent: no child of ours
        assert process.signal_left(child.pid, signal.SIGTERM) == left
    finally:
        process.signal_group(child.pid, signal.SIGKILL)
        child.wait()
