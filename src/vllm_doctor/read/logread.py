"""Stream log input and yield only the lines worth matching, numbered as in the original.

Input can be a path, `-` for stdin, a FIFO, gzip (detected by its magic bytes, so a gzipped
stdin works too), of any size. Memory stays flat: the input is read into one reused buffer, the
prefilter finds candidate lines in the raw bytes, newlines are counted once, in C, and only the
candidate lines (plus context either side, to undo terminal hard-wraps) are decoded and
cleaned, the context lines only if a rule reads them. 1 GiB is read in about a second.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from vllm_doctor.data import Line
from vllm_doctor.errors import DoctorError
from vllm_doctor.read import lineparse
from vllm_doctor.read.prefilter import Prefilter

BLOCK = 16 << 20  # bytes read at a time
FIRST_BLOCK = 1 << 20  # the buffer starts this small, so a short log costs no 16 MiB allocation
# Longer lines are matched in a window around their first anchor. This bounds what a rule
# pattern ever searches (real vLLM lines stay under 4 KiB): `rules check` times every pattern
# on hostile lines of this size (redos.py), so no line can make one backtrack for long.
MAX_LINE = 16 << 10
WINDOW = 8 << 10  # half-width of such a window
OVERLAP = 256  # bytes of a line longer than the buffer kept for the next fill (anchors are shorter)
CONTEXT_BEFORE = 1
CONTEXT_AFTER = 5  # lines a wrapped or split message may continue on (the engine joins as many)


class ReadError(DoctorError):
    """Input that cannot be read at all; the message is one line for the user."""


@dataclass
class ReadStats:
    lines: int = 0  # physical lines over all inputs
    bytes: int = 0
    warnings: list[str] = field(default_factory=list)


def _open(path: str) -> tuple[BinaryIO, bool]:
    """Open a path or stdin as a byte stream; the flag says whether to close it."""
    if path == "-":
        return sys.stdin.buffer, False
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
    """A log is text; a file that is mostly NULs or undecodable bytes is not one."""
    if not head:
        return False
    sample = head[: 64 << 10]
    if sample.count(0) > len(sample) // 100 + 8:
        return True
    text = sample.decode("utf-8", "replace")
    return text.count("\ufffd") > len(text) // 5


class _Source:
    """Fills a buffer from a stream, gzip undone (detected by its magic bytes, so a gzipped
    stdin works too); gzip damage becomes a warning, other read errors a ReadError."""

    PIECE = 1 << 20  # bytes asked of the stream at a time (bounds the copies gzip makes)

    def __init__(self, stream: BinaryIO, name: str, stats: ReadStats):
        self.name, self.stats = name, stats
        self.done = False
        self.first = True
        try:
            head = stream.read(2)
        except OSError as e:
            raise ReadError(f"{name}: read failed ({e.strerror or e})") from None
        self.stream: Any = stream  # a binary file, stdin's buffer, or a GzipFile: all have readinto
        if head == b"\x1f\x8b":
            self.stream = gzip.GzipFile(fileobj=_Prepend(head, stream))
            head = b""
        self.head = head

    def fill(self, view: memoryview) -> int:
        """Read until the view is full or the input ends; returns the bytes read (0 at the end)."""
        if self.done:
            return 0
        got = 0
        if self.head:
            got = len(self.head)
            view[:got] = self.head
            self.head = b""
        try:
            while got < len(view):
                n = self._read_into(view[got : got + self.PIECE])
                if not n:
                    self.done = True
                    break
                got += n
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            self.stats.warnings.append(f"{self.name}: gzip stream is damaged or truncated ({e}); read what came before")
            self.done = True
        except OSError as e:
            raise ReadError(f"{self.name}: read failed ({e.strerror or e})") from None
        if self.first:
            self.first = False
            if _looks_binary(bytes(view[: min(got, 64 << 10)])):
                raise ReadError(f"{self.name}: does not look like a text log (binary data)")
        return got

    def _read_into(self, view: memoryview) -> int:
        """One read. Gzip goes through read1, one decompressed piece at a time: readinto asks
        for the whole view and, when damage follows, raises with everything before it unread."""
        if isinstance(self.stream, gzip.GzipFile):
            data = self.stream.read1(len(view))
            view[: len(data)] = data
            return len(data)
        return self.stream.readinto(view)


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


def read(paths: list[str], prefilter: Prefilter, stats: ReadStats) -> Iterator[Line]:
    """Candidate lines (and their context) of every input, in order."""
    for index, path in enumerate(paths):
        stream, owned = _open(path)
        try:
            yield from _read_one(stream, path, index, prefilter, stats)
        finally:
            if owned:
                stream.close()


def _read_one(stream: BinaryIO, name: str, source: int, pf: Prefilter, stats: ReadStats) -> Iterator[Line]:
    """One input, through one reused buffer: [0:have) holds the bytes not yet split into lines.

    Each fill is cut after its last newline; the whole lines before the cut are scanned, the
    partial line after it moves to the front for the next fill. No block is copied, so memory
    stays at the buffer's size however large the input is.
    """
    src = _Source(stream, name, stats)
    buf = bytearray(min(BLOCK, FIRST_BLOCK))  # grown to BLOCK once the input proves larger
    view = memoryview(buf)
    have = 0
    base = 0  # lines before the buffer
    tail: list[tuple[int, bytes]] = []  # the last lines of the previous region, for context
    need_after = 0  # context lines still owed to the previous region's last hit
    emitted = 0  # highest line number yielded so far
    while True:
        free = len(buf) - have
        n = src.fill(view[have:])
        stats.bytes += n
        if n:
            end = have + n
            cut = buf.rfind(b"\n", have, end) + 1  # the bytes kept from before hold no newline
        elif have:  # the end: a last line without a newline gets one (a full buffer is never kept)
            buf[have] = 0x0A
            cut = end = have + 1
        else:
            break
        if cut == 0 and end == BLOCK:
            # one line longer than the buffer: match what we have in windows, keep an overlap
            yield from _fragment(buf, end, base + 1, source, pf)
            have = min(OVERLAP, BLOCK // 4)
            view[:have] = view[end - have : end]
            continue
        if cut:
            selected, need_after, count = _select(buf, cut, base, pf, tail, need_after)
            for no, raw, anchors, hit in selected:
                if no > emitted:
                    emitted = no
                    yield _line(no, raw, source, anchors, hit, pf)
            tail = _tail(buf, cut, base + count)
            base += count
        have = end - cut
        if n == 0:
            break
        if n == free and len(buf) < BLOCK:  # the input fills the buffer: give it the full size
            bigger = bytearray(min(BLOCK, len(buf) * 4))
            bigger[:have] = view[cut:end]
            view.release()
            buf, view = bigger, memoryview(bigger)
        else:
            view[:have] = view[cut:end]  # memoryview assignment is a memmove: overlap is safe
    stats.lines += base


class ChunkLines:
    """Candidate lines of a stream that arrives in chunks (a pipe passed through live): the
    prefilter runs over each chunk's whole lines, only hit lines are decoded, a line longer
    than MAX_LINE is matched in its window and one longer than HOLD is matched in pieces, as
    `read` does. No context lines. Holds only the bytes of an unfinished line (at most HOLD).
    """

    HOLD = 1 << 20

    def __init__(self, prefilter: Prefilter, source: int = 0):
        self.pf = prefilter
        self.source = source
        self.lines = 0  # lines before the held bytes
        self._buf = bytearray()
        self._skip = False

    def gap(self) -> None:
        """Bytes of the stream were lost: drop the unfinished line and the rest of it."""
        self._buf.clear()
        self._skip = True

    def feed(self, chunk) -> list[Line]:
        """The candidate lines completed by this chunk (bytes, bytearray or memoryview)."""
        if self._skip:
            nl = bytes(chunk).find(b"\n") if isinstance(chunk, memoryview) else chunk.find(b"\n")
            if nl < 0:
                return []
            self._skip = False
            self.lines += 1
            chunk = memoryview(chunk)[nl + 1 :]
        buf, pf = self._buf, self.pf
        buf += chunk
        cut = buf.rfind(b"\n") + 1
        if not cut:
            if len(buf) <= self.HOLD:
                return []
            out = list(_fragment(buf, len(buf), self.lines + 1, self.source, pf))
            del buf[: len(buf) - OVERLAP]
            return out
        hits, counted_to, newlines = _hit_lines(buf, cut, self.lines, pf)
        out = []
        for no, start, end, anchor_ids in hits:
            raw = bytes(buf[start:end])
            ids = anchor_ids if pf.exact else pf.anchors_in(raw)
            out.append(_line(no, raw, self.source, tuple(sorted(set(ids))), True, pf))
        self.lines += newlines + buf.count(b"\n", counted_to, cut)
        del buf[:cut]
        return out


def _select(buf: bytearray, cut: int, base: int, pf: Prefilter, tail: list[tuple[int, bytes]], need_after: int):
    """Hit lines and their context in buf[:cut], which ends with a newline.

    Returns ([(line no, bytes, anchors, hit)] sorted by line, context lines owed by the next
    region, the number of lines in the region).
    """
    picked: dict[int, tuple[bytes, tuple[int, ...], bool]] = {}
    pos = 0
    owed = 0
    for i in range(need_after):  # context owed to a hit at the end of the previous region
        end = buf.find(b"\n", pos, cut)
        if end < 0:  # a region of fewer lines than owed passes the rest on
            owed = need_after - i
            break
        picked[base + i + 1] = (bytes(buf[pos:end]), (), False)
        pos = end + 1
    hits, counted_to, newlines = _hit_lines(buf, cut, base, pf)
    for no, start, end, anchor_ids in hits:
        raw = bytes(buf[start:end])
        if not pf.exact:
            anchor_ids = pf.anchors_in(raw)
        picked[no] = (raw, tuple(sorted(set(anchor_ids))), True)
        s, n = start, no
        for _ in range(CONTEXT_BEFORE):
            if s == 0:  # the line before sits in the previous region
                for tno, traw in tail:
                    if tno == n - 1:
                        picked.setdefault(tno, (traw, (), False))
                break
            ps = buf.rfind(b"\n", 0, s - 1) + 1
            n -= 1
            if n not in picked:
                picked[n] = (bytes(buf[ps : s - 1]), (), False)
            s = ps
        e, n = end + 1, no
        for k in range(CONTEXT_AFTER):
            if e >= cut:
                owed = max(owed, CONTEXT_AFTER - k)
                break
            ne = buf.find(b"\n", e, cut)
            n += 1
            if n not in picked:
                picked[n] = (bytes(buf[e:ne]), (), False)
            e = ne + 1
    newlines += buf.count(b"\n", counted_to, cut)
    return sorted((no, *v) for no, v in picked.items()), owed, newlines


def _hit_lines(buf: bytearray, cut: int, base: int, pf: Prefilter):
    """(line no, start, end, anchor ids) of each line of buf[:cut] holding an anchor, and how far
    newlines were counted (offset, count), so that the caller counts each newline once."""
    counted_to = newlines = 0
    line_start = line_end = -1
    line_no = 0
    ids: list[int] = []
    out = []
    for end_off, anchor in pf.scan(memoryview(buf)[:cut]):
        at = end_off - 1
        if line_start <= at < line_end:
            ids.append(anchor)
            continue
        if ids:
            out.append((line_no, line_start, line_end, ids))
        line_start = buf.rfind(b"\n", 0, at) + 1
        line_end = buf.find(b"\n", at, cut)
        newlines += buf.count(b"\n", counted_to, line_start)
        counted_to = line_start
        line_no = base + newlines + 1
        ids = [anchor]
    if ids:
        out.append((line_no, line_start, line_end, ids))
    return out, counted_to, newlines


def _tail(buf: bytearray, cut: int, total: int) -> list[tuple[int, bytes]]:
    """The last CONTEXT_BEFORE lines of buf[:cut], numbered (total = number of its last line)."""
    out = []
    end = cut - 1  # the final newline
    no = total
    for _ in range(CONTEXT_BEFORE):
        if end < 0:  # (end == 0 is an empty line at the very start)
            break
        start = buf.rfind(b"\n", 0, end) + 1
        out.append((no, bytes(buf[start:end])))
        end = start - 1
        no -= 1
    return out


def _fragment(buf: bytearray, end: int, no: int, source: int, pf: Prefilter) -> Iterator[Line]:
    """Windows around the anchors in buf[:end], a piece of a line too long to hold whole."""
    last_end = -1
    for end_off, _anchor in pf.scan(memoryview(buf)[:end]):
        if end_off <= last_end:
            continue
        start = max(0, end_off - WINDOW)
        last_end = min(end, end_off + WINDOW)
        raw = bytes(buf[start:last_end])
        yield _line(no, raw, source, tuple(pf.anchors_in(raw)), True, pf)


def _line(no: int, raw: bytes, source: int, anchors: tuple[int, ...], hit: bool, pf: Prefilter) -> Line:
    if len(raw) > MAX_LINE:
        raw = _window(raw, pf)
        anchors = tuple(pf.anchors_in(raw)) if hit else ()
    if not hit:
        return _ContextLine(no, raw, source)
    text, message, process, level = _clean(raw)
    return Line(no=no, text=message, raw=text, source=source, process=process, level=level, hit=hit, anchors=anchors)


def _clean(raw: bytes) -> tuple[str, str, str | None, str | None]:
    """(line without colour codes, message, process, level)."""
    text = lineparse.strip_colour(raw.decode("utf-8", "replace"))
    message, process, level = lineparse.parse(text)
    return text, message, process, level


def _lazy_field(name: str) -> property:
    slot = Line.__dict__[name]  # the slot descriptor of the dataclass field

    def get(self):
        if self._pending is not None:
            self._parse()
        return slot.__get__(self)

    def set(self, value):
        slot.__set__(self, value)

    return property(get, set)


class _ContextLine(Line):
    """A line read only as context for a hit (to join wrapped messages): most are never looked
    at, so it is decoded and parsed on first use. It reads like any other Line."""

    __slots__ = ("_pending",)
    text = _lazy_field("text")
    raw = _lazy_field("raw")
    process = _lazy_field("process")
    level = _lazy_field("level")

    def __init__(self, no: int, data: bytes, source: int):
        self._pending = None
        super().__init__(no=no, text="", raw="", source=source, hit=False)
        self._pending = data

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Line):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in Line.__dataclass_fields__)

    __hash__ = None  # type: ignore[assignment]  # as for Line: mutable, compared by value

    def _parse(self) -> None:
        data, self._pending = self._pending, None
        assert data is not None  # only called while a parse is pending
        self.raw, self.text, self.process, self.level = _clean(data)


def _window(raw: bytes, pf: Prefilter) -> bytes:
    """The part of an overlong line around its first anchor (or its head when it has none)."""
    hits = pf.scan(raw)
    if not hits:
        return raw[:MAX_LINE]
    end = hits[0][0]
    return raw[max(0, end - WINDOW) : end + WINDOW]
