"""Stream log input and yield only the lines worth matching, numbered as in the original.

Input can be a path, `-` for stdin, a FIFO, gzip (source.py opens and repairs it), of any size.
Memory stays flat: the input is read into one reused buffer, the prefilter finds candidate lines
in the raw bytes a region at a time, newlines are counted once, in C, and only the candidate
lines (plus context either side, to undo terminal hard-wraps) are decoded and cleaned, the
context lines only if a rule reads them; a long line is cut into pieces around every anchor in
place. 1 GiB is read in about a second. The access and stats lines of a serving log, most of
its bytes, are read a region at a time by their rules' forms (bulk.py), not line by line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, BinaryIO

from vllm_doctor.data import Line
from vllm_doctor.read import bulk, candidates, lineparse
from vllm_doctor.read.budget import Budget
from vllm_doctor.read.candidates import ContextLine
from vllm_doctor.read.prefilter import Prefilter
from vllm_doctor.read.source import Holes, ReadError, Source, open_input

__all__ = ["ReadError", "ReadStats", "read", "holds_any", "ChunkLines", "Bulk"]

BLOCK = 16 << 20  # bytes read at a time
REGION = 1 << 20  # bytes of whole lines scanned and selected at a time (bounds the hits held at once)
FIRST_BLOCK = 1 << 20  # the buffer starts this small, so a short log costs no 16 MiB allocation
# Longer lines (and lines a progress bar redrew with CRs) are matched in pieces, one around
# every anchor hit, cut at the CRs either side (_spans). This bounds what a rule pattern ever
# searches (real vLLM lines stay under 4 KiB); every pattern is linear in it (RE2: matching/linear.py).
MAX_LINE = 16 << 10
WINDOW = 8 << 10  # half-width of such a piece
MARGIN = 1 << 10  # bytes a piece holds at least either side of each anchor hit in it
OVERLAP = 256  # bytes of a line longer than the buffer kept for the next fill (anchors are shorter)
CONTEXT_BEFORE = 1
CONTEXT_AFTER = 5  # lines a wrapped or split message may continue on (the engine joins as many)


@dataclass(slots=True)
class Bulk:
    """A hit line the prefilter's `take` read whole (an access or stats line): what it made of it,
    in place of a Line; it pulls in no context, and is a neighbour of nothing (a hit beside it reads it as context)."""

    no: int
    source: int
    taken: Any


@dataclass
class ReadStats:
    lines: int = 0  # physical lines over all inputs
    bytes: int = 0
    warnings: list[str] = field(default_factory=list)


def read(paths: list[str], prefilter: Prefilter, stats: ReadStats, budget: Budget | None = None
         ) -> Iterator[Line | Bulk]:  # fmt: skip
    """Candidate lines (and their context) of every input, in order (within `budget`, if any)."""
    for index, path in enumerate(paths):
        stream, owned = open_input(path)
        try:
            yield from _read_one(stream, path, index, prefilter, stats, budget)
        finally:
            if owned:
                stream.close()


def holds_any(paths: list[str], anchors: list[str]) -> bool:
    """Whether a line of the inputs holds one of the anchors, found as `read` finds them (the
    same repairs of the bytes, the same prefilter): a pass at the prefilter's speed, which stops
    at the first such line. A rule can match only on a line that holds one of its anchors."""
    stats = ReadStats()
    return bool(anchors) and any(isinstance(line, Bulk) or line.hit for line in read(paths, Prefilter(anchors), stats))


def _read_one(stream: BinaryIO, name: str, source: int, pf: Prefilter, stats: ReadStats, budget: Budget | None = None
              ) -> Iterator[Line | Bulk]:  # fmt: skip
    """One input, through one reused buffer: [0:have) holds the bytes not yet split into lines.

    Each fill is cut after its last newline; the whole lines before the cut are scanned, the
    partial line after it moves to the front for the next fill. No block is copied, so memory
    stays at the buffer's size however large the input is.
    """
    src = Source(stream, name, stats.warnings)
    buf = bytearray(min(BLOCK, FIRST_BLOCK))  # grown to BLOCK once the input proves larger
    view = memoryview(buf)
    have = 0
    base = 0  # lines before the buffer
    tail: list[tuple[int, bytes]] = []  # the last lines of the previous region, for context
    need_after = 0  # context lines still owed to the previous region's last hit
    emitted = 0  # highest line number yielded so far
    long_head: bytes | None = None  # the collector prefix of a line longer than the buffer, once cut
    while True:
        free = len(buf) - have
        n = src.fill(buf, have)
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
            # one line longer than the buffer: match what we have in pieces, keep an overlap
            yield from _fragment(buf, end, base + 1, source, pf, long_head)
            if long_head is None:
                long_head = _head(buf, 0, end)
            have = min(OVERLAP, BLOCK // 4)
            view[:have] = view[end - have : end]
            continue
        lo = 0
        if long_head is not None:  # the rest of a line longer than the buffer: in pieces, as the rest of it
            lo = buf.find(b"\n", 0, cut) + 1
            yield from _fragment(buf, lo - 1, base + 1, source, pf, long_head)
            base, emitted, long_head = base + 1, base + 1, None
        skipped = None
        while lo < cut:  # in regions of about REGION bytes: what a region's hits hold is bounded
            if budget is not None and n and budget.due(stats.bytes - (end - lo)):
                skipped, budget = _jump(src, budget, buf, lo, cut, end, base, stats), None
                if skipped is not None:
                    break
            hi = buf.find(b"\n", min(lo + REGION, cut - 1), cut) + 1
            selected, need_after, count = _select(buf, lo, hi, base, pf, tail, need_after)
            for no, raw, anchors, hit in selected:
                if hit is None:
                    yield Bulk(no, source, raw)
                elif no > emitted:
                    emitted = no
                    yield from _line(no, raw, source, anchors, hit, pf)
            tail = _tail(buf, lo, hi, base + count)
            base += count
            lo = hi
        if skipped is not None:  # read on from the file's tail
            base, have, tail, need_after = base + skipped, 0, [], 0
            continue
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
    src.warn()


def _jump(src: Source, budget: Budget, buf: bytearray, lo: int, cut: int, end: int, base: int, stats: ReadStats
          ) -> int | None:  # fmt: skip
    """Past the rest of this fill (buf[lo:end]) and the middle of the file to the tail the budget
    can read: the lines skipped (counted, not read), said in a warning; None where it cannot."""
    jumped = src.jump(budget.tail(stats.bytes - (end - lo)))
    if jumped is None:
        return None
    at, goes_on, newlines = jumped
    skipped = buf.count(b"\n", lo, cut) + newlines
    head = at - (end - lo)
    stats.warnings.append(budget.said(src.name, base + 1, base + skipped, head, goes_on - head, src.size() - goes_on))
    stats.bytes += goes_on - at
    budget.jumped = True
    return skipped


class ChunkLines:
    """Candidate lines of a stream that arrives in chunks (a pipe passed through live): the
    prefilter runs over each chunk's whole lines, only hit lines are decoded, a line longer
    than MAX_LINE (or with CRs inside) is matched in pieces around its anchors, one longer than
    HOLD as it comes, and NUL holes are dropped, as `read` does. No context lines. Holds only
    the bytes of an unfinished line (at most HOLD).
    """

    HOLD = 1 << 20

    def __init__(self, prefilter: Prefilter, source: int = 0):
        self.pf = prefilter
        self.source = source
        self.lines = 0  # lines before the held bytes
        self._buf = bytearray()
        self._skip = False
        self._head: bytes | None = None  # the collector prefix of a line longer than HOLD, once cut
        self._holes = Holes()

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
        held = len(buf)
        buf += chunk
        with memoryview(buf) as view:  # NUL holes dropped as a file's are (a run cut between chunks too)
            end = self._holes.drop(buf, view, 0, held, len(buf))
        del buf[end:]
        cut = buf.rfind(b"\n") + 1
        if not cut:
            if len(buf) <= self.HOLD:
                return []
            out = _fragment(buf, len(buf), self.lines + 1, self.source, pf, self._head)
            if self._head is None:
                self._head = _head(buf, 0, len(buf))
            del buf[: len(buf) - OVERLAP]
            return out
        self._head = None
        hits, counted_to, newlines = _hit_lines(buf, 0, cut, self.lines, pf)
        out = []
        for no, start, end, anchor_ids in hits:
            raw = bytes(buf[start:end])
            ids = anchor_ids if pf.exact else pf.anchors_in(raw)
            out.extend(_line(no, raw, self.source, tuple(sorted(set(ids))), True, pf))
        self.lines += newlines + buf.count(b"\n", counted_to, cut)
        del buf[:cut]
        return out


def _select(buf: bytearray, lo: int, cut: int, base: int, pf: Prefilter, tail: list[tuple[int, bytes]],
            need_after: int):  # fmt: skip
    """Hit lines and their context in buf[lo:cut], which ends with a newline.

    Returns ([(line no, bytes, anchors, hit)] sorted by line, context lines owed by the next
    region, the number of lines in the region). A hit line the prefilter's `take` reads whole
    comes as (line no, what it made of it, (), None), and pulls in no context.
    """
    picked: dict[int, tuple[Any, tuple[int, ...], bool]] = {}  # bytes, or what cuts a long line (_cut)
    spans: dict[int, tuple[int, int, bool]] = {}  # line no -> (start, end, hit) of the lines picked here
    pos = lo
    owed = 0
    for i in range(need_after):  # context owed to a hit at the end of the previous region
        end = buf.find(b"\n", pos, cut)
        if end < 0:  # a region of fewer lines than owed passes the rest on
            owed = need_after - i
            break
        picked[base + i + 1] = (_visible(buf, pos, end), (), False)
        spans[base + i + 1] = (pos, end, False)
        pos = end + 1
    present = bulk.covered(buf, lo, cut, pf.families) if pf.families and pf.exact else None
    if present is not None and present.strays and any(_taken(buf, s, e, pf) for s, e in present.strays):
        present = None  # a stray line a family reads after all: the region line by line, as always
    fast = present is not None
    hits, counted_to, newlines = _hit_lines(buf, lo, cut, base, pf, fast)
    if present is not None and present.strays:  # hit lines too, as the line-by-line path finds them
        known = {start for _, start, _, _ in hits}
        hits += [(base + buf.count(b"\n", lo, s) + 1, s, e, set()) for s, e in present.strays if s not in known]
        hits.sort(key=_start)
    taken: list[tuple[int, Any, tuple[int, ...], bool | None]] = []
    for no, start, end, anchor_ids in hits:
        spans[no] = (start, end, True)
        if fast:  # the families' anchors this line holds too (the general scan left them out)
            anchor_ids.update(i for i in pf.bulk_ids if pf._encoded[i] in buf[start:end])
        elif pf.take is not None and pf.exact and end - start <= MAX_LINE and anchor_ids <= pf.bulk_ids:
            read = pf.take(bytes(buf[start:end]), anchor_ids)
            if read is not None:
                taken.append((no, read, (), None))
                continue
        if end - start > MAX_LINE:  # cut in place, as it is read: a line of megabytes is never copied whole
            picked[no] = (partial(_cut, buf, start, end, pf), (), True)
        else:
            raw = bytes(buf[start:end])
            picked[no] = (raw, tuple(sorted(anchor_ids if pf.exact else pf.anchors_in(raw))), True)
        s, n = start, no
        for _ in range(CONTEXT_BEFORE):
            if s == lo:  # the line before sits in the previous region
                for tno, traw in tail:
                    if tno == n - 1:
                        picked.setdefault(tno, (traw, (), False))
                break
            ps = (buf.rfind(b"\n", lo, s - 1) + 1) or lo
            n -= 1
            if n not in picked:
                picked[n] = (_visible(buf, ps, s - 1), (), False)
                spans[n] = (ps, s - 1, False)
            s = ps
        e, n = end + 1, no
        for k in range(CONTEXT_AFTER):
            if e >= cut:
                owed = max(owed, CONTEXT_AFTER - k)
                break
            ne = buf.find(b"\n", e, cut)
            n += 1
            if n not in picked:
                picked[n] = (_visible(buf, e, ne), (), False)
                spans[n] = (e, ne, False)
            e = ne + 1
    lines: list[tuple[int, Any, tuple[int, ...], bool | None]] = sorted((no, *v) for no, v in picked.items())
    if present:
        taken, (at, before) = bulk.entries(buf, lo, cut, base, present, spans)
        counted_to, newlines = (at, before) if at > counted_to else (counted_to, newlines)  # the further count
    newlines += buf.count(b"\n", counted_to, cut)
    if taken:  # a line read as context and in bulk: the context line first
        lines = sorted(lines + taken, key=lambda e: (e[0], e[3] is None)) if lines else taken
    return lines, owed, newlines


def _taken(buf: bytearray, start: int, end: int, pf: Prefilter) -> bool:
    """Whether the line-by-line path would have a family read this line (pf.take)."""
    if pf.take is None or end - start > MAX_LINE:
        return False
    raw = bytes(buf[start:end])
    ids = set(pf.anchors_in(raw))
    return ids <= pf.bulk_ids and pf.take(raw, ids) is not None


def _start(hit: tuple) -> int:
    return hit[1]


def _hit_lines(buf: bytearray, lo: int, cut: int, base: int, pf: Prefilter, general: bool = False):
    """(line no, start, end, anchor ids) of each line of buf[lo:cut] holding an anchor, and how
    far newlines were counted (offset, count), so that the caller counts each newline once."""
    counted_to = lo
    newlines = 0
    line_start = line_end = -1
    line_no = 0
    ids: set[int] = set()
    out = []
    for hit_end, anchor in _scan(buf, lo, cut, pf, general):
        at = hit_end - 1
        if line_start <= at < line_end:
            ids.add(anchor)
            continue
        if ids:
            out.append((line_no, line_start, line_end, ids))
        line_start = (buf.rfind(b"\n", lo, at) + 1) or lo
        line_end = buf.find(b"\n", at, cut)
        newlines += buf.count(b"\n", counted_to, line_start)
        counted_to = line_start
        line_no = base + newlines + 1
        ids = {anchor}
    if ids:
        out.append((line_no, line_start, line_end, ids))
    return out, counted_to, newlines


def _tail(buf: bytearray, lo: int, cut: int, total: int) -> list[tuple[int, bytes]]:
    """The last CONTEXT_BEFORE lines of buf[lo:cut], numbered (total = number of its last line)."""
    out = []
    end = cut - 1  # the final newline
    no = total
    for _ in range(CONTEXT_BEFORE):
        if end < lo:  # (end == lo is an empty line at the region's start)
            break
        start = (buf.rfind(b"\n", lo, end) + 1) or lo
        out.append((no, _visible(buf, start, end)))
        end = start - 1
        no -= 1
    return out


def _fragment(buf: bytearray, end: int, no: int, source: int, pf: Prefilter, head: bytes | None) -> list[Line]:
    """The pieces around the anchors in buf[:end], a piece of a line too long to hold whole;
    head is the line's collector prefix when buf does not start the line (None when it does)."""
    start = 0 if head is None else -1
    pieces = _pieces(buf, _spans(buf, 0, end, pf), pf, start, _head(buf, 0, end) if head is None else head)
    return [candidates.hit(no, piece, source, ids) for piece, ids in pieces]


def _scan(data: bytes | bytearray, lo: int, hi: int, pf: Prefilter, general: bool = False
          ) -> Iterator[tuple[int, int]]:  # fmt: skip
    """pf.scan over data[lo:hi] in REGION steps, offsets absolute: the hits held at once stay
    bounded however many anchors a megabyte line repeats. Each step overlaps the one before by
    the longest anchor, and the hits that ended in the overlap were yielded before."""
    longest = max(pf.lengths, default=0)
    with memoryview(data) as view:
        for pos in range(lo, hi, REGION):
            seen_to = pos + longest if pos > lo else lo
            piece = view[pos : min(hi, pos + REGION + longest)]
            for hit_end, anchor in pf.scan_general(piece) if general else pf.scan(piece):
                if pos + hit_end > seen_to:
                    yield pos + hit_end, anchor


def _spans(data: bytes | bytearray, lo: int, end: int, pf: Prefilter) -> Iterator[tuple[int, int, set[int]]]:
    """(start, end, anchor ids) of the pieces of data[lo:end] to match, each at most 2 * WINDOW
    long and cut at the CRs either side (after a CR a terminal starts the line again: a progress
    bar redraws itself, and a record glued after the last redraw starts there). Every anchor hit
    lies in a piece with MARGIN bytes either side of it (or the line's edge): a hit too near the
    end of the piece before starts the next one, which overlaps it by 2 * MARGIN."""
    span: tuple[int, int, set[int]] | None = None
    for hit_end, anchor in _scan(data, lo, end, pf):
        if span:
            e = span[1]
            if hit_end + MARGIN <= e or (hit_end <= e and (e == end or data[e] == 0x0D)):
                span[2].add(anchor)
                continue
            yield span
        begin = hit_end - pf.lengths[anchor]
        cr = data.rfind(b"\r", max(lo, hit_end - WINDOW), begin)
        s = max(cr + 1, lo, hit_end - WINDOW, min(span[1] - 2 * MARGIN, begin - MARGIN) if span else lo)
        cr = data.find(b"\r", hit_end, min(end, s + 2 * WINDOW))
        span = (s, cr if cr >= 0 else min(end, s + 2 * WINDOW), {anchor})
    if span:
        yield span


def _pieces(data: bytes | bytearray, spans, pf: Prefilter, line_start: int, head: bytes
            ) -> Iterator[tuple[bytes, tuple[int, ...]]]:  # fmt: skip
    """Each distinct piece's bytes and anchors, as they are cut: a line that repeats itself (a
    hostile one, a message pasted in a loop) has a few distinct pieces however many anchors it
    holds, and matching the same bytes again finds nothing new. A piece that does not start the
    line (at line_start) starts with head, the line's collector prefix."""
    seen: set[int] = set()
    for s, e, ids in spans:
        piece = bytes(data[s:e]) if s == line_start or not head else head + data[s:e]
        if hash(piece) not in seen:
            if len(seen) > 4096:  # bounded: a repeat is near the piece it repeats
                seen.clear()
            seen.add(hash(piece))
            yield piece, tuple(sorted(ids)) if pf.exact else tuple(pf.anchors_in(piece))


def _cut(buf: bytes | bytearray, start: int, end: int, pf: Prefilter) -> Iterator[tuple[bytes, tuple[int, ...]]]:
    """The pieces of the hit line buf[start:end] (its CRs at the end aside), each a piece cut
    from inside the line given the line's collector prefix back (_head)."""
    while end > start and buf[end - 1] == 0x0D:
        end -= 1
    empty = True
    for piece in _pieces(buf, _spans(buf, start, end, pf), pf, start, _head(buf, start, end)):
        empty = False
        yield piece
    if empty:  # (only the fallback engine can report a hit that a rescan does not see)
        yield bytes(buf[start : start + MAX_LINE]), ()


def _head(buf: bytes | bytearray, start: int, end: int) -> bytes:
    """The collector prefixes (docker compose, kubectl, CRI, syslog, CI) the line buf[start:end]
    starts with, colour codes undone (compose colours its service names): what every piece cut
    from inside the line is given back, so that it keeps its container as the line does."""
    text = lineparse.strip_colour(bytes(buf[start : min(end, start + 256)]).decode("utf-8", "replace"))
    return lineparse.collector_prefix(text).encode()


def _visible(buf: bytes | bytearray, start: int, end: int) -> bytes:
    """A context line as a terminal shows it: the part after its last CR (its CRs at the end
    aside), at most MAX_LINE bytes of it; a short line without CRs inside as it is."""
    body_end = end
    while body_end > start and buf[body_end - 1] == 0x0D:
        body_end -= 1
    cr = buf.rfind(b"\r", start, body_end)
    if cr < 0 and end - start <= MAX_LINE:
        return bytes(buf[start:end])
    start = max(start, cr + 1)
    return bytes(buf[start : min(body_end, start + MAX_LINE)])


def _line(no: int, raw, source: int, anchors: tuple[int, ...], hit: bool, pf: Prefilter) -> Iterator[Line]:
    """The Lines of one line read: a context line as it is (_visible made it); a hit line
    longer than MAX_LINE (raw is then what cuts it in place), or with CRs inside it, as the
    pieces _spans cuts around its anchors, each numbered as the line; a short one as it is."""
    if not hit:
        yield ContextLine(no, raw, source)
        return
    if callable(raw):
        pieces = raw()
    elif len(raw) > MAX_LINE or b"\r" in raw.rstrip(b"\r"):
        pieces = _cut(raw, 0, len(raw), pf)
    else:
        pieces = [(raw, anchors)]
    for piece, ids in pieces:
        yield candidates.hit(no, piece, source, ids)
