"""The redacted copy of a log (server.log of a serve report): line by line as `Redactor.line`
masks each against its neighbours, but for the runs of lines that can hold nothing to mask,
told from their bytes (one RE2 scan a block for the forms' quick words), which go out as they
are, a block at a time: most lines of a serving log, at the speed of the bytes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from vllm_doctor.render.forms import _QUICK
from vllm_doctor.render.redact import WINDOW, Redactor


def copy(red: Redactor, fin: BinaryIO, fout: BinaryIO) -> int:
    """Copy a log with every line redacted, each line held against its neighbours (a value
    split over a line break), a long line in windows; returns the number of lines. A run of
    lines that can hold nothing to mask (what `slow` tells from their bytes) is copied as
    it is, a block at a time: most lines of a serving log."""
    c = _Copy(red, fout)
    src = _Reader(fin)
    while True:
        if c.held is not None and (block := src.block()):
            c.block(block, slow(red, c.held_raw, block))
            continue
        raw = src.readline(WINDOW)
        if not raw:
            break
        if len(raw) == WINDOW and not raw.endswith(b"\n"):
            c.flush()
            red._copy_long(src, fout, raw)
            c.lines += 1
            continue
        c.line(raw)
    c.flush()
    return c.lines


def slow(red: Redactor, held: bytes, block: bytes) -> list[int] | None:
    """Where the lines start, in these whole lines, that masking may change, whatever their
    neighbours (None: any of them): those holding one of the forms' quick words (every form
    and cut token holds one), an escape or a piece of a known value, and the line after each
    (a token cut at the line before's end). Any, in a block not all ASCII (where str.lower
    differs from bytes.lower) or holding a known value whole once the line breaks are taken
    out (one split over them, `held` being the line before)."""
    if not block.isascii():
        return None
    raw: list[bytes] = [b"\x1b"]  # looked for as they are (the quick words: case aside)
    if red._lit_bytes:
        joined = (held + block).translate(None, b"\r\n")  # one pass, the line breaks taken out
        for lit, pieces in red._lit_bytes:
            if lit in joined:
                return None
            raw += pieces
    hot = {block.rfind(b"\n", 0, at) + 1 for at in _quick_at(block)}
    for w in raw:
        at = block.find(w)
        while at >= 0:
            hot.add(block.rfind(b"\n", 0, at) + 1)
            at = block.find(w, at + 1)
    after = {e + 1 for e in (block.find(b"\n", h) for h in hot) if e + 1 < len(block)}
    return sorted(hot | after)


_QUICK_BYTES = tuple(w.encode() for w in _QUICK)
BLOCK = 1 << 20  # bytes read at once by the copy
INERT = 64 << 10  # bytes of whole lines looked through at once by the copy (fewer than WINDOW)


class _Copy:
    """The copy's state: the line held for the next one to be read, and the raw text before it."""

    def __init__(self, red: Redactor, fout: BinaryIO):
        self.red, self.fout = red, fout
        self.lines = 0
        self.before = ""  # the raw text of the line before the held one
        self.held: tuple[str, bytes] | None = None  # a line waiting for the next one to be read
        self.held_raw = b""

    def line(self, raw: bytes) -> None:
        """A line of WINDOW bytes at most, ending with its newline (or the file's last)."""
        body = raw.rstrip(b"\r\n")
        text = body.decode("utf-8", "surrogateescape")
        if self.held is not None:
            self.fout.write(self.red._out(self.held, self.before, text))
            self.before = self.held[0]
        self.held, self.held_raw = (text, raw[len(body) :]), raw
        self.lines += 1

    def block(self, block: bytes, slow: list[int] | None) -> None:
        """Whole lines, the held one before them: the lines at `slow` (all when None) and the
        first are masked one by one, each run of lines between goes out as it is (masking would
        not change them: `slow`), but for its last, held for the next line."""
        if slow is None:
            for raw in block[:-1].split(b"\n"):  # lines as readline splits them: at \n only
                self.line(raw + b"\n")
            return
        pos = 0
        for start in (0, *slow):
            if start < pos:
                continue
            if start > pos:
                self._run(block[pos:start])
            pos = block.index(b"\n", start) + 1
            self.line(block[start:pos])
        if pos < len(block):
            self._run(block[pos:])

    def _run(self, run: bytes) -> None:
        """Whole lines of which none can change, nor the first by the held one (not a slow one):
        the held line is masked against the first, the others go out as they are, the last is held."""
        assert self.held is not None
        last = run.rfind(b"\n", 0, len(run) - 1) + 1  # where the run's last line starts
        if last == 0:
            self.line(run)
            return
        prev = run.rfind(b"\n", 0, last - 1) + 1  # and the line before it
        self.fout.write(self.red._out(self.held, self.before, _text(run[: run.index(b"\n") + 1])))
        self.fout.write(run[:last])
        self.before, raw = _text(run[prev:last]), run[last:]
        body = raw.rstrip(b"\r\n")
        self.held, self.held_raw = (body.decode("utf-8", "surrogateescape"), raw[len(body) :]), raw
        self.lines += run.count(b"\n")

    def flush(self) -> None:
        """Before a long line, and at the end: the held line has no next one."""
        if self.held is not None:
            self.fout.write(self.red._out(self.held, self.before, ""))
        self.held, self.before, self.held_raw = None, "", b""


_QUICK_RX: Any = None


def _quick_at(block: bytes) -> Iterator[int]:
    """Where the forms' quick words are in an ASCII block, case aside: at least one in each line
    that holds any (matches hold no newline). One RE2 scan (a DFA: the bytes' speed, where `re`
    tries each word at each byte), or, without google-re2, `re` over the lower-cased block."""
    global _QUICK_RX
    if _QUICK_RX is None:
        # "token" then "s" ("tokens/s" in every stats line, max_num_batched_tokens) or a name's
        # next part ("prompt_token_ids" in every request log line) starts no form: each form's
        # name ends at "token", then a quote, "=", ":" or a space (a name that goes on ends at
        # another quick word: token_key, token_secret)
        token = rb"(?:[^s_\-]|[_\-][^A-Za-z0-9])"
        words = b"|".join(re.escape(w) + (token if w == b"token" else b"") for w in _QUICK_BYTES)
        try:
            import re2

            options = re2.Options()
            options.case_sensitive = False
            _QUICK_RX = (re2.compile(words, options), False)
        except ImportError:  # pragma: no cover - google-re2 has no wheel for musllinux
            _QUICK_RX = (re.compile(words), True)
    rx, lower = _QUICK_RX
    return (m.start() for m in rx.finditer(block.lower() if lower else block))


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\r\n").decode("utf-8", "surrogateescape")


class _Reader:
    """A file read a block at a time, for the copy: `readline` as a file's, and `block`, the
    next whole lines (two or more, INERT bytes at most)."""

    def __init__(self, fin: BinaryIO):
        self.fin = fin
        self.buf = b""
        self.pos = 0

    def _more(self) -> bool:
        more = self.fin.read(BLOCK)
        self.buf = self.buf[self.pos :] + more
        self.pos = 0
        return bool(more)

    def readline(self, limit: int) -> bytes:
        while True:
            end = self.buf.find(b"\n", self.pos, self.pos + limit)
            if end >= 0 or len(self.buf) - self.pos >= limit:
                stop = end + 1 if end >= 0 else self.pos + limit
                out, self.pos = self.buf[self.pos : stop], stop
                return out
            if not self._more():
                out, self.buf, self.pos = self.buf[self.pos :], b"", 0
                return out

    def block(self) -> bytes:
        if len(self.buf) - self.pos < INERT:
            self._more()
        end = self.buf.rfind(b"\n", self.pos, self.pos + INERT)
        if end < 0 or self.buf.find(b"\n", self.pos, end) < 0:
            return b""  # fewer than two whole lines
        out, self.pos = self.buf[self.pos : end + 1], end + 1
        return out
