"""The bytes of one log input: a path, `-` for stdin, a FIFO, gzip (detected by its magic bytes,
so a gzipped stdin works too). Reads fill the reader's buffer in place, and repair what a log's
life does to it: a damaged gzip keeps what came before the damage, NUL holes are dropped, CR-only
line ends become LF. Each repair is a warning; input that is no text log is a ReadError.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import sys
import zlib
from typing import Any, BinaryIO

from vllm_doctor.errors import DoctorError

NUL_RUN = 16  # NULs in a row that are a hole in the file, not data (UTF-16 and binaries have single ones)
_NUL_RUNS = re.compile(rb"\0{%d,}" % NUL_RUN)
_NULS = re.compile(rb"\0+")
_HOLE = b"\0" * NUL_RUN
_CR_TO_LF = bytes.maketrans(b"\r", b"\n")
MAX_HOLES = 16  # NUL runs in the first block beyond which the input is binary, not a log with holes
CR_SAMPLE = 4096  # bytes (or the whole input) the first block must hold to tell CR-only input
LONG_LINE = 16 << 10  # LF lines this long on average are no lines: the line ends are elsewhere


class ReadError(DoctorError):
    """Input that cannot be read at all; the message is one line for the user."""


STDIN_HINT = "vllm-doctor: reading stdin… (Ctrl-D to end)"
QUIET_S = 1.5  # a pipe that holds no data this long gets the hint: `kubectl logs -f` that stays open


def stdin_hint(quiet: float = QUIET_S) -> None:
    """Say once on stderr that stdin is being read: at once from a terminal, after `quiet`
    seconds without data from a pipe (or socket) that stays open; never for a file or when data
    is there. Only the command line calls it: a library caller's stderr stays its own."""
    import select

    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
        if os.isatty(fd):
            ready = False
        elif stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            ready = bool(select.select([fd], [], [], quiet)[0])  # readable: data, or the writer closed it
        else:
            return
    except (OSError, ValueError, AttributeError):  # stdin closed or replaced (`<&-`, a test runner)
        return
    if not ready:
        print(STDIN_HINT, file=sys.stderr, flush=True)


def open_input(path: str) -> tuple[BinaryIO, bool]:
    """Open a path or stdin as a byte stream; the flag says whether to close it."""
    if path == "-":
        stdin = getattr(sys.stdin, "buffer", None)  # None when the shell closed it (`<&-`)
        if stdin is None:
            raise ReadError("-: standard input is closed; pass a log file, or pipe the log in")
        return stdin, False
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ReadError(f"{path}: no such file") from None
    except OSError as e:
        raise ReadError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:  # a NUL in the name
        raise ReadError(f"{path!r}: cannot read ({e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ReadError(f"{path}: is a directory, not a log file")
    try:
        return open(path, "rb"), True  # noqa: SIM115 - closed by the caller
    except OSError as e:
        raise ReadError(f"{path}: cannot read ({e.strerror or e})") from None


def _looks_binary(head: bytes) -> bool:
    """A log is text; a file that is mostly NULs or undecodable bytes is not one. (NUL runs, the
    holes of a truncated file, were dropped before: scattered NULs are UTF-16 or binary data.)"""
    if not head:
        return False
    sample = head[: 64 << 10]
    if sample.count(0) > len(sample) // 100 + 8:
        return True
    text = sample.decode("utf-8", "replace")
    return text.count("\ufffd") > len(text) // 5


def without_holes(data: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    """The bytes (or a memoryview of them) with their NUL runs of NUL_RUN or more dropped; the
    same object when there are none, found by one memchr-speed search of the bytes under it
    (a regex search is 30 times slower), so only a piece with a hole is copied."""
    under = data.obj if isinstance(data, memoryview) else data
    if isinstance(under, (bytes, bytearray)) and under.find(_HOLE) < 0:
        return data
    whole = bytes(data)
    return _NUL_RUNS.sub(b"", whole) if _HOLE in whole else data


class Holes:
    """Drops NUL holes (runs of NUL_RUN or more NULs) from bytes as they arrive, in place: a file
    or stdin read (Source) and a stream read in chunks (logread.ChunkLines: serve's live watch,
    explain --follow) alike. A run cut between two reads is dropped whole."""

    def __init__(self) -> None:
        self.nuls = self.holes = 0  # NUL bytes dropped, in how many runs
        self._in_hole = False  # the last bytes read ended in a dropped NUL run, which may go on

    def drop(self, buf: bytearray, view: memoryview, lo: int, p: int, e: int) -> int:
        """Drop the NUL runs in the bytes just read, buf[p:e] (buf[lo:p] came before them in
        this fill); returns their new end."""
        if self._in_hole:  # a run cut by the previous read goes on: its rest is hole too
            m = _NULS.match(buf, p, e)
            if m:
                view[p : e - m.end() + p] = view[m.end() : e]
                self.nuls += m.end() - p
                e -= m.end() - p
            self._in_hole = e == p
        if buf.find(0, p, e) < 0:
            return e
        runs = [r.span() for r in _NUL_RUNS.finditer(buf, max(lo, p - NUL_RUN + 1), e)]
        if not runs:
            return e
        out = runs[0][0]
        for (_, prev), (nxt, _) in zip(runs, [*runs[1:], (e, e)], strict=True):
            view[out : out + nxt - prev] = view[prev:nxt]
            out += nxt - prev
        self.nuls += sum(b - a for a, b in runs)
        self.holes += len(runs)
        self._in_hole = runs[-1][1] == e
        return out


class Source:
    """Fills a buffer from a stream, gzip undone (detected by its magic bytes, so a gzipped
    stdin works too); gzip damage becomes a warning, other read errors a ReadError.

    Two repairs as the bytes arrive, each said in a warning: runs of NUL_RUN or more NULs are
    dropped (logrotate's copytruncate leaves the writer's old offset as a hole that reads as
    NULs, a thousand or megabytes of them, before the text), and input whose lines end in bare
    CRs (no LF in its first block) gets LF line ends, one for each CR.
    """

    PIECE = 1 << 20  # bytes asked of the stream at a time (bounds the copies gzip makes)

    def __init__(self, stream: BinaryIO, name: str, warnings: list[str]):
        self.name, self.warnings = name, warnings
        self.done = False
        self.checked = False  # the binary and line-end checks, made on the first text read
        self.cr_only = False
        self.dropped = Holes()
        try:
            head = stream.read(2)
        except OSError as e:
            raise ReadError(f"{name}: read failed ({e.strerror or e})") from None
        self.done = not head  # ended already (Ctrl-D on a terminal): no second read to wait on
        self.stream: Any = stream  # a binary file, stdin's buffer, or a GzipFile: all have readinto
        if head == b"\x1f\x8b":
            self.stream = gzip.GzipFile(fileobj=_Prepend(head, stream))
            head = b""
        self.head = head

    def fill(self, buf: bytearray, start: int) -> int:
        """Read into buf[start:] until it is full or the input ends; returns the bytes placed
        there (fewer than asked only at the end, 0 once it is over)."""
        if self.done:
            return 0
        end = start
        with memoryview(buf) as view:
            try:
                while end < len(buf):
                    n = self._read_into(view[end : end + self.PIECE])
                    if not n:
                        self.done = True
                        break
                    new_end = self.dropped.drop(buf, view, start, end, end + n)
                    if self.cr_only:
                        view[end:new_end] = buf[end:new_end].translate(_CR_TO_LF)
                    end = new_end
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                self.warnings.append(f"{self.name}: gzip stream is damaged or truncated ({e}); read what came before")
                self.done = True
            except OSError as e:
                raise ReadError(f"{self.name}: read failed ({e.strerror or e})") from None
            if end > start and not self.checked:
                self._check(buf, start, end)
                if self.cr_only:
                    view[start:end] = buf[start:end].translate(_CR_TO_LF)
        return end - start

    def jump(self, keep: int) -> tuple[int, int, int] | None:
        """Past the middle of a regular file to about its last `keep` bytes, from a line's start
        (read/budget.py: a diagnosis with a deadline): (where the bytes read so far end, where
        reading goes on, the newlines between: counted, in C, so that lines keep their numbers).
        None where it cannot (gzip, a pipe, CR line ends) or less than twice `keep` is left."""
        if self.done or self.head or self.cr_only or isinstance(self.stream, gzip.GzipFile):
            return None
        try:
            pos = self.stream.tell()
            start = self.size() - keep
            if start - pos < keep:
                return None
            newlines, at = 0, pos
            while at < start:
                piece = self.stream.read(min(self.PIECE * 16, start - at))
                if not piece:
                    break
                newlines += piece.count(b"\n")
                at += len(piece)
            nl = self.stream.read(1 << 16).find(b"\n")  # the end of the line the tail starts inside of
            if at < start or nl < 0:
                self.stream.seek(pos)  # (the file shrank, or a line of 64 KiB: read on from where it was)
                return None
            self.stream.seek(start + nl + 1)
            return pos, start + nl + 1, newlines + 1
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            return None

    def size(self) -> int:
        return os.fstat(self.stream.fileno()).st_size

    def _check(self, buf: bytearray, start: int, end: int) -> None:
        self.checked = True
        # a log has a hole or a few; an archive or a disk image has NUL padding everywhere
        if self.dropped.holes > MAX_HOLES or _looks_binary(bytes(buf[start : min(end, start + (64 << 10))])):
            raise ReadError(f"{self.name}: does not look like a text log (binary data)")
        lf = buf.count(b"\n", start, end)
        bare_cr = buf.count(b"\r", start, end) - buf.count(b"\r\n", start, end)
        # CR-only input has (almost) no LF at all; a progress bar's CRs sit inside an LF line,
        # one before each redraw ("...| 3/8 [00:01<00:02, 2.5it/s]"), and stay there
        bars = max(buf.count(b"/s]", start, end), buf.count(b"s/it]", start, end), buf.count(b"%|", start, end))
        seen_enough = self.done or end - start >= CR_SAMPLE
        if seen_enough and bare_cr > 8 * lf and lf * LONG_LINE < end - start and 2 * bars < bare_cr:
            self.cr_only = True
            self.warnings.append(f"{self.name}: lines end in a bare CR, not LF; each CR is read as a line end")

    def _read_into(self, view: memoryview) -> int:
        """One read. Gzip goes through read1, one decompressed piece at a time: readinto asks
        for the whole view and, when damage follows, raises with everything before it unread."""
        if self.head:
            n = min(len(view), len(self.head))
            view[:n] = self.head[:n]
            self.head = self.head[n:]
            return n
        if isinstance(self.stream, gzip.GzipFile):
            data = self.stream.read1(len(view))
            view[: len(data)] = data
            return len(data)
        return self.stream.readinto(view)

    def warn(self) -> None:
        if self.dropped.nuls:
            self.warnings.append(
                f"{self.name}: skipped {self.dropped.nuls:,} NUL bytes in {self.dropped.holes} run(s) (the hole a truncated "
                "and rewritten file leaves, as logrotate's copytruncate does); read the text around them"
            )


class _Prepend(io.RawIOBase):
    """A stream with bytes already read put back in front (stdin cannot seek)."""

    def __init__(self, head: bytes, rest: BinaryIO):
        self._head = head
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        if self._head:
            n = min(len(buf), len(self._head))
            buf[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(buf))
        buf[: len(data)] = data
        return len(data)
