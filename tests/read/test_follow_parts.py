"""The parts `explain --follow` reads with: the bounded spool (read/spool.py) and the file followed
by its name (read/tailf.py), driven directly, without the command or a clock."""

from __future__ import annotations

import os

from vllm_doctor.read.spool import Spool
from vllm_doctor.read.tailf import Followed


def _lines(n: int, start: int = 0) -> bytes:
    return b"".join(b"line %06d of the stream\n" % i for i in range(start, start + n))


def test_the_spool_keeps_its_head_and_a_tail_from_a_line_start(tmp_path):
    with Spool(head=1000, tail=2000) as spool:
        for i in range(100):
            spool.write(_lines(10, i * 10))
            assert os.path.getsize(spool.name) <= 1000 + 2 * 2000 + 250  # never more than a chunk past the bound
        spool.trim(spool.tail)
        held = open(spool.name, "rb").read()
        [note] = spool.notes()
    everything = _lines(1000)
    head = everything[: everything.rfind(b"\n", 0, 1000) + 1]
    assert held.startswith(head) and everything.endswith(held[len(head) :])  # the head, then the stream's end
    assert held[len(head) :].startswith(b"line ") and len(held) <= 1000 + 2000
    head_lines = head.count(b"\n")
    assert "left out" in note and f"after line {head_lines} " in note


def test_a_spool_under_its_bound_holds_everything_and_says_nothing(tmp_path):
    with Spool(head=1000, tail=2000) as spool:
        spool.write(_lines(50))
        spool.trim(spool.tail)
        assert open(spool.name, "rb").read() == _lines(50) and spool.notes() == []


def _all(f: Followed) -> bytes:
    out = b""
    while chunk := f.read(1 << 16):
        out += chunk
    return out


def test_a_file_truncated_and_written_past_its_old_size_is_read_from_its_start(tmp_path):
    log, notes = tmp_path / "server.log", []
    log.write_bytes(b"old start\n" * 100)
    fd = os.open(log, os.O_RDONLY)
    try:
        f = Followed(fd, str(log), notes.append)
        assert _all(f) == b"old start\n" * 100
        log.write_bytes(b"new start\n" * 150)  # truncated and longer again before the next read
        assert _all(f) == b"new start\n" * 150 and len(notes) == 1 and "truncated" in notes[0]
        log.write_bytes(b"x")  # shorter: a plain truncation, and a cut line ends before what follows
        assert _all(f) == b"x" and "was truncated" in notes[1]
        with log.open("ab") as out:
            out.write(b"y\n")
        assert _all(f) == b"y\n" and len(notes) == 2  # growth is growth
        f.close()
    finally:
        os.close(fd)


def test_a_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path):
    log, notes = tmp_path / "server.log", []
    log.write_bytes(b"first\n")
    fd = os.open(log, os.O_RDONLY)
    try:
        f = Followed(fd, str(log), notes.append)
        assert _all(f) == b"first\n"
        with log.open("ab") as out:
            out.write(b"last words, no newline")  # written before the rename, not read yet
        log.rename(tmp_path / "server.log.1")
        assert _all(f) == b"last words, no newline" and notes == []  # nothing at the name yet: the old one
        log.write_bytes(b"second\n")
        assert _all(f) == b"\nsecond\n" and "rotated" in notes[0]  # the cut line ends before the new file
        f.close()
    finally:
        os.close(fd)
