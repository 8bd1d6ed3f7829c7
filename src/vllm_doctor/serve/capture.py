"""The capture file: both streams' output in arrival order, whole lines, written as each chunk
arrives, which the explain pipeline reads when the server ends badly. It is raw (unredacted):
a wrapper killed before the report leaves none behind (the guardian deletes a temporary one).

A chunk is cut after its last newline: the bytes before go to the file at once, the unfinished
line after waits for the rest of itself, so stdout and stderr never splice mid-line. A line
longer than HELD is written as it is rather than held longer: memory stays bounded.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from vllm_doctor.serve.options import TAG

HELD = 1 << 20  # bytes of one unfinished line held back at most


def write_all(fd: int, pieces: list) -> None:
    """Every byte of the pieces (bytes or memoryviews), in one writev when the fd takes them."""
    pieces = [memoryview(p) for p in pieces if len(p)]
    while pieces:
        n = os.writev(fd, pieces)
        while pieces and n >= len(pieces[0]):
            n -= len(pieces[0])
            pieces.pop(0)
        if n:
            pieces[0] = pieces[0][n:]


def may_fail(path: Path, rules: list) -> bool:
    """Whether the explain of the capture can fail the report: only when a line holds the anchor
    of a blocker rule, or of a traceback record that the fallback (unrecognised-failure) reads.
    A healthy server's capture of tens of MB then skips the explain, which reads and parses
    every line (seconds) only to say healthy and be discarded; this pass runs at the
    prefilter's speed and stops at the first such line."""
    from vllm_doctor.read.logread import holds_any

    blockers = [r for r in rules if r.kind == "diagnosis" and r.severity == "blocker"]
    if any(not r.anchors and not r.fallback for r in blockers):
        return True  # a rule tried on facts alone: only the explain can tell
    anchors = {a for r in blockers for a in r.anchors}
    if any(not r.anchors for r in blockers):
        anchors |= {a for r in rules if r.series == "traceback" for a in r.anchors}
    return holds_any([str(path)], sorted(anchors))


def last_lines(path: Path | None, count: int = 10, window: int = 64 << 10) -> list[str]:
    """The capture's last `count` lines (of its last `window` bytes, colour codes left as they
    are, each cut at 400 characters): what the server said last, for a report whose diagnosis
    failed. [] when there is no capture or it cannot be read."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - window))
            tail = f.read(window)
    except OSError:
        return []
    lines = tail.decode("utf-8", "replace").splitlines()[-count:]
    return [line if len(line) <= 400 else line[:400] + "…" for line in lines]


def open_nofollow(path: Path | str) -> int:
    """A file opened for writing (created 0600 or truncated), never through a symlink at its
    name: one planted there would aim our write at another file (O_NOFOLLOW; ELOOP then)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, 0o600)


def why(e: OSError) -> str:
    """The reason of a failed open_nofollow, as a person would say it."""
    if e.errno == errno.ELOOP:
        return "a symbolic link, not followed"
    return str(e.strerror or e)


class Capture:
    def __init__(self, note: Callable[[str], None], errors: list[str]):
        self.note = note  # one line for the operator
        self.errors = errors  # internal errors, for the report
        self.path: Path | None = None
        self.temporary = True  # False when the capture is the operator's --log-file
        self._fd: int | None = None
        self._failed = False
        self._partial: dict[int, bytearray] = {}  # per stream: bytes after its last newline

    def open(self, log_file: Path | None) -> None:
        if log_file is not None:
            try:
                self._fd = open_nofollow(log_file)
                self.path = Path(log_file)
                self.temporary = False
                return
            except OSError as e:
                self.note(f"{TAG} note: cannot write {log_file} ({why(e)}); capturing to a temporary file")
        try:
            fd, name = tempfile.mkstemp(prefix="vllm-doctor-serve-", suffix=".log")
            self.path, self._fd = Path(name), fd
        except OSError as e:  # no capture at all: the output still passes through
            self.errors.append(f"capture: {e}")
            self.note(f"{TAG} note: cannot create a capture file ({e.strerror or e}); there will be no report")

    def add(self, stream: int, data: bytes) -> list:
        """Take one chunk of a stream; returns the pieces that went to the file (whole lines,
        or a line longer than HELD), which the live watch reads too."""
        partial = self._partial.setdefault(stream, bytearray())
        cut = data.rfind(b"\n") + 1
        if not cut:
            partial += data
            if len(partial) <= HELD:
                return []
            pieces: list = [bytes(partial)]
            partial.clear()
        else:
            pieces = [bytes(partial)] if partial else []
            pieces.append(data if cut == len(data) else memoryview(data)[:cut])
            partial[:] = memoryview(data)[cut:]
        self.write(pieces)
        return pieces

    def write(self, pieces: list) -> None:
        if self._fd is None or self._failed:
            return
        try:
            write_all(self._fd, pieces)
        except OSError as e:
            self._failed = True
            self.errors.append(f"capture: {e}")
            self.note(
                f"{TAG} note: cannot write the capture file {self.path} ({e.strerror or e}); output still passes through"
            )

    def finish(self) -> list:
        """The unfinished lines, each given a newline; the file closed. Returns those pieces."""
        pieces = [bytes(rest) + b"\n" for rest in self._partial.values() if rest]
        self._partial.clear()
        if pieces:
            self.write(pieces)
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
        return pieces

    def discard(self) -> None:
        """Close the capture and delete it when it is a temporary file."""
        self.finish()
        if self.temporary and self.path is not None:
            try:
                self.path.unlink()
            except OSError:
                pass
