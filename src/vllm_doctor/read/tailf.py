"""A log file followed by its name, as `tail -F` follows one (explain --follow server.log).

The name is what is followed, not the file first opened: a rotation (the file renamed away and
a new one created at the name, a new inode) and a symlink pointed at another file are followed
to the new file, read from its start once the old one is read to its end (as far as it reached
when the change was seen). A truncation (copytruncate) is read again from the start, including
one the writer has already grown past the old size by the time it is seen: the bytes just
before the read offset, and the file's first bytes, are compared with what was read there.
Each such event is said once, through `note`.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable

PRINT = 64  # bytes compared at the file's start and before the offset to tell a rewrite from growth
RECHECK = 1.0  # seconds between looks at the name while the file keeps growing (at its end: every read)


class Followed:
    """The bytes of whatever file `path` names, in order; read() returns b"" at its end for now."""

    def __init__(self, fd: int, path: str, note: Callable[[str], None]):
        self.fd, self.path, self.note = fd, path, note
        self._first_fd = fd  # the caller's: closed by the caller
        self._ident = _ident(os.fstat(fd))
        self._target = _target(path)
        self.pos = os.lseek(fd, 0, os.SEEK_CUR)  # then read at it (pread): an interrupt between a read and
        # its count would leave the file's offset past what was counted
        self._head = os.pread(fd, min(PRINT, self.pos), 0)
        self._last = os.pread(fd, min(PRINT, self.pos), self.pos - min(PRINT, self.pos))
        self._checked = time.monotonic()
        self._next: tuple[int, str] | None = None  # the file now at the name, once the old one is read
        self._switch_at = 0  # how far the old one is read before the switch
        self._line_open = bool(self._last) and not self._last.endswith(b"\n")

    def read(self, size: int) -> bytes:
        """Up to `size` bytes; after a switch or a truncation, a newline first if a line was cut."""
        sep = self._rewound()
        if self._next is not None and self.pos >= self._switch_at:
            sep = self._switch() or sep
        chunk = os.pread(self.fd, size, self.pos)
        now = time.monotonic()
        if self._next is None and (not chunk or now - self._checked >= RECHECK):
            self._checked = now
            self._look_at_name()
            if not chunk and self._next is not None:
                sep = self._switch() or sep
                chunk = os.pread(self.fd, size, self.pos)
        if chunk:
            head = self._head if len(self._head) == PRINT else (self._head + chunk)[:PRINT]
            last, line_open = (self._last + chunk[-PRINT:])[-PRINT:], not chunk.endswith(b"\n")
            # in one statement, no call between: an interrupt leaves all of it as it was, or none
            self.pos, self._head, self._last, self._line_open = self.pos + len(chunk), head, last, line_open
            os.lseek(self.fd, self.pos, os.SEEK_SET)  # the offset says how far it read (/proc/PID/fdinfo)
            return sep + chunk
        return sep

    def close(self) -> None:
        for fd in {self.fd, *(self._next[:1] if self._next else ())} - {self._first_fd}:
            os.close(fd)

    def _rewound(self) -> bytes:
        """Whether the file was truncated (or truncated and written again) under the offset: if
        so, read it again from its start."""
        if not self.pos:
            return b""
        size = os.fstat(self.fd).st_size
        if size >= self.pos:
            last = os.pread(self.fd, len(self._last), self.pos - len(self._last))
            if last == self._last and os.pread(self.fd, len(self._head), 0) == self._head:
                return b""
        how = "truncated" if size < self.pos else "truncated and written again"
        self.note(f"{self.path} was {how} (copytruncate?): reading it again from its start")
        return self._restart(self.fd)

    def _look_at_name(self) -> None:
        """A new file at the name (rotation, or a symlink pointed elsewhere): switch to it once
        the old one is read as far as it reaches now."""
        try:
            st = os.stat(self.path)
        except OSError:  # renamed away, none at the name yet: the old one may still grow
            return
        if _ident(st) == self._ident or not stat.S_ISREG(st.st_mode):
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        target = _target(self.path)
        if target is not None and target != self._target:
            what = f"now points to {target}"
        else:
            what = "was rotated (a new file at that name)"
        self.note(f"{self.path} {what}: following it from its start")
        self._target = target
        self._next = (fd, what)
        self._switch_at = os.fstat(self.fd).st_size

    def _switch(self) -> bytes:
        assert self._next is not None
        fd, _ = self._next
        if self.fd != self._first_fd:
            os.close(self.fd)
        self.fd, self._next = fd, None
        self._ident = _ident(os.fstat(fd))
        return self._restart(fd)

    def _restart(self, fd: int) -> bytes:
        os.lseek(fd, 0, os.SEEK_SET)
        self.pos, self._head, self._last = 0, b"", b""
        sep, self._line_open = (b"\n" if self._line_open else b""), False
        return sep


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _target(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:  # not a symlink
        return None
