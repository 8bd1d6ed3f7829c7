"""The bytes a follow diagnoses, held bounded (explain --follow of an endless or fast input).

One temp file holds the first HEAD bytes of the stream and a rolling tail: once it passes
HEAD + 2 * TAIL, the middle goes and the last TAIL bytes (from a line's start) move up behind
the head, so the file never holds more than that and each move is paid by as many bytes read.
A start's lines (version, model, arguments) sit in the head and a failure in the tail; what was
cut is said in one note. Signals wait while the tail moves, so an interrupt never leaves it half
moved.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

HEAD = 1 << 20
TAIL = 4 << 20  # what one diagnosis of the tail costs bounds how soon a follow reports
BLOCK = 1 << 20


class Spool:
    def __init__(self, head: int = HEAD, tail: int = TAIL):
        self._file = tempfile.NamedTemporaryFile(prefix="vllm-doctor-follow-", suffix=".log", buffering=0)
        self.name = self._file.name
        self.head, self.tail = head, tail
        self.size = 0  # bytes in the file
        self.read = 0  # bytes written to it all told
        self.lines = 0  # newlines written to it all told
        self._head_end: int | None = None  # where the head ends (after a newline), once a cut was made
        self._head_lines = 0
        self._kept_lines = 0  # newlines in the file after the head, as of the last cut
        self._cut_lines = 0

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def write(self, chunk: bytes) -> None:
        fd = self._file.fileno()
        with memoryview(chunk) as view:
            done = 0
            while done < len(chunk):
                done += os.write(fd, view[done:])
        self.size += len(chunk)
        self.read += len(chunk)
        self.lines += chunk.count(b"\n")
        if self.size > self.head + 2 * self.tail:
            self.trim(self.tail)

    def trim(self, keep: int) -> None:
        """Keep the head and the last `keep` bytes, from the start of a line; the rest goes."""
        fd = self._file.fileno()
        self.size = os.fstat(fd).st_size  # an interrupted write may have left part of a chunk
        if self.size <= self.head + keep:
            return
        with _signals_held():
            if self._head_end is None:
                head = os.pread(fd, self.head, 0)
                self._head_end = head.rfind(b"\n") + 1 or self.head
                self._head_lines = head.count(b"\n", 0, self._head_end)
            start = self.size - keep
            nl = os.pread(fd, min(keep, BLOCK), start).find(b"\n")
            start += nl + 1 if 0 <= nl < keep - 1 else 0
            to, kept = self._head_end, 0
            for at in range(start, self.size, BLOCK):  # forward: each block is read before it is written over
                block = os.pread(fd, BLOCK, at)
                os.pwrite(fd, block, to)
                to += len(block)
                kept += block.count(b"\n")
            os.ftruncate(fd, to)
            os.lseek(fd, to, os.SEEK_SET)
            self.size = to
            self._cut_lines = self.lines - self._head_lines - kept
            self._kept_lines = kept

    def notes(self) -> list[str]:
        """What the diagnosis left out, if anything: one line."""
        if self._head_end is None or not self._cut_lines and self.read == self.size:
            return []
        cut = self.read - self.size
        return [
            f"the follow read {_mb(self.read)} ({self.lines} lines); it diagnosed the first {_mb(self._head_end)} "
            f"and the last {_mb(self.size - self._head_end)}: {_mb(cut)} ({self._cut_lines} lines) between them "
            f"were left out, so the line numbers after line {self._head_lines} count without them"
        ]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (they are delivered after it)."""
    held = {signal.SIGINT, signal.SIGTERM}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
