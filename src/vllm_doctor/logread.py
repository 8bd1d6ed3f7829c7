"""Stream log input and yield only the lines worth matching, numbered as in the original.

Input can be a path, `-` for stdin, gzip (detected by its magic bytes, so a gzipped stdin works
too), of any size. Memory stays flat: the input is read in fixed blocks, the prefilter finds
candidate lines in raw bytes, and only those lines (plus a line of context either side, to undo
terminal hard-wraps) are decoded and cleaned.
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
from typing import BinaryIO

from . import lineparse
from .data import Line
from .prefilter import Prefilter

BLOCK = 16 << 20  # bytes read at a time
MAX_LINE = 64 << 10  # longer lines are matched in windows around each anchor
WINDOW = 4 << 10  # half-width of such a window
CONTEXT_BEFORE = 1
CONTEXT_AFTER = 2


class ReadError(Exception):
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


def _blocks(stream: BinaryIO, name: str, stats: ReadStats) -> Iterator[bytes]:
    """Raw blocks of the (decompressed) input, with gzip damage turned into a warning."""
    head = stream.read(2)
    if head == b"\x1f\x8b":
        stream = gzip.GzipFile(fileobj=_Prepend(head, stream))  # type: ignore[assignment]
        head = b""
    try:
        first = True
        while True:
            block = stream.read(BLOCK)
            if first:
                block = head + block
                if _looks_binary(block):
                    raise ReadError(f"{name}: does not look like a text log (binary data)")
                first = False
            if not block:
                return
            yield block
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        stats.warnings.append(f"{name}: gzip stream is damaged or truncated ({e}); read what came before")
    except OSError as e:
        raise ReadError(f"{name}: read failed ({e.strerror or e})") from None


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
    base = 0  # lines before the current chunk
    carry = b""
    tail: list[tuple[int, bytes]] = []  # the last lines of the previous chunk, for context
    need_after = 0  # context lines still owed to the previous chunk's last hit
    emitted = 0  # highest line number yielded so far

    def chunk_lines(chunk: bytes) -> Iterator[Line]:
        nonlocal base, tail, need_after, emitted
        selected, need_after = _select(chunk, base, pf, tail, need_after)
        for no, raw, anchors, hit in selected:
            if no > emitted:
                emitted = no
                yield _line(no, raw, source, anchors, hit, pf)
        count = chunk.count(b"\n")
        tail = _tail(chunk, base + count)
        base += count

    for block in _blocks(stream, name, stats):
        stats.bytes += len(block)
        buf = carry + block if carry else block
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) < MAX_LINE * 16:
                carry = buf
                continue
            # one enormous line: match what we have as a fragment, keep a short overlap
            yield from _fragment(buf, base + 1, source, pf)
            carry = buf[-256:]
            continue
        carry = buf[cut:]
        yield from chunk_lines(buf[:cut])
    if carry:  # the last line has no newline
        yield from chunk_lines(carry + b"\n")
    stats.lines += base


def _select(chunk: bytes, base: int, pf: Prefilter, tail: list[tuple[int, bytes]], need_after: int):
    """Hit lines and their context in a chunk that ends with a newline.

    Returns ([(line no, bytes, anchors, hit)] sorted by line, context lines owed by the next chunk).
    """
    picked: dict[int, tuple[bytes, tuple[int, ...], bool]] = {}
    pos = 0
    for i in range(need_after):  # context owed to a hit at the end of the previous chunk
        end = chunk.find(b"\n", pos)
        if end < 0:
            break
        picked[base + i + 1] = (chunk[pos:end], (), False)
        pos = end + 1
    owed = 0
    for no, start, end, anchor_ids in _hit_lines(chunk, base, pf):
        raw = chunk[start:end]
        if not pf.exact:
            anchor_ids = pf.anchors_in(raw)
        picked[no] = (raw, tuple(sorted(set(anchor_ids))), True)
        s, n = start, no
        for _ in range(CONTEXT_BEFORE):
            if s == 0:  # the line before sits in the previous chunk
                for tno, traw in tail:
                    if tno == n - 1:
                        picked.setdefault(tno, (traw, (), False))
                break
            ps = chunk.rfind(b"\n", 0, s - 1) + 1
            n -= 1
            picked.setdefault(n, (chunk[ps : s - 1], (), False))
            s = ps
        e, n = end + 1, no
        for k in range(CONTEXT_AFTER):
            if e >= len(chunk):
                owed = max(owed, CONTEXT_AFTER - k)
                break
            ne = chunk.find(b"\n", e)
            n += 1
            picked.setdefault(n, (chunk[e:ne], (), False))
            e = ne + 1
    return sorted((no, *v) for no, v in picked.items()), owed


def _hit_lines(chunk: bytes, base: int, pf: Prefilter) -> Iterator[tuple[int, int, int, list[int]]]:
    """(line no, start, end, anchor ids) of each line holding an anchor; newlines counted once."""
    counted_to = newlines = 0
    line_start = line_end = -1
    line_no = 0
    ids: list[int] = []
    for end_off, anchor in pf.scan(chunk):
        at = end_off - 1
        if line_start <= at < line_end:
            ids.append(anchor)
            continue
        if ids:
            yield line_no, line_start, line_end, ids
        line_start = chunk.rfind(b"\n", 0, at) + 1
        line_end = chunk.find(b"\n", at)
        newlines += chunk.count(b"\n", counted_to, line_start)
        counted_to = line_start
        line_no = base + newlines + 1
        ids = [anchor]
    if ids:
        yield line_no, line_start, line_end, ids


def _tail(chunk: bytes, total: int) -> list[tuple[int, bytes]]:
    """The last CONTEXT_BEFORE lines of a chunk, numbered (total = number of its last line)."""
    out = []
    end = len(chunk) - 1  # the final newline
    no = total
    for _ in range(CONTEXT_BEFORE):
        if end <= 0:
            break
        start = chunk.rfind(b"\n", 0, end) + 1
        out.append((no, chunk[start:end]))
        end = start - 1
        no -= 1
    return out


def _fragment(buf: bytes, no: int, source: int, pf: Prefilter) -> Iterator[Line]:
    """Windows around the anchors of a line too long to hold whole."""
    last_end = -1
    for end_off, _anchor in pf.scan(buf):
        if end_off <= last_end:
            continue
        start = max(0, end_off - WINDOW)
        last_end = min(len(buf), end_off + WINDOW)
        raw = buf[start:last_end]
        yield _line(no, raw, source, tuple(pf.anchors_in(raw)), True, pf)


def _line(no: int, raw: bytes, source: int, anchors: tuple[int, ...], hit: bool, pf: Prefilter) -> Line:
    if len(raw) > MAX_LINE:
        raw = _window(raw, pf)
        anchors = tuple(pf.anchors_in(raw)) if hit else ()
    text = lineparse.strip_colour(raw.decode("utf-8", "replace"))
    message, process, level = lineparse.parse(text)
    return Line(no=no, text=message, raw=text, source=source, process=process, level=level, hit=hit, anchors=anchors)


def _window(raw: bytes, pf: Prefilter) -> bytes:
    """The part of an overlong line around its first anchor (or its head when it has none)."""
    hits = pf.scan(raw)
    if not hits:
        return raw[:MAX_LINE]
    end = hits[0][0]
    return raw[max(0, end - WINDOW) : end + WINDOW]
