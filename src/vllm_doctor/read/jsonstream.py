"""A large JSON document read as it arrives, one small value at a time, in flat memory.

Prometheus' range-query answer is one object holding an array of series; json.loads of a 250 MB
answer built 3.75 GB of objects. Here the bytes stream in pieces (at most `max_bytes` in all),
the reader walks the containers the caller descends into (`items`, `members`) and hands every
other value to json's C decoder whole, each at most `max_value` bytes; a value nested too deeply
for the decoder, a value over its bound, an answer over its bound and text that is not JSON each
raise `error` with one line, never RecursionError or MemoryError.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
CHUNK = 1 << 20


class Reader:
    """The document of `f`: peek, expect, value, members (an object's keys) and items (an array's)."""

    def __init__(self, f: BinaryIO, name: str, error: type[Exception], max_bytes: int, max_value: int):
        self.f, self.name, self.error = f, name, error
        self.max_bytes, self.max_value = max_bytes, max_value
        self.text, self.pos, self.total, self.eof = "", 0, 0, False
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._read = getattr(f, "read1", f.read)

    def _more(self) -> bool:
        """Another piece of the stream; False at its end."""
        if self.eof:
            return False
        data = self._read(CHUNK)
        self.total += len(data)
        if self.total > self.max_bytes:
            raise self.error(
                f"{self.name}: an answer over {self.max_bytes >> 20} MB; narrow the window or the selector"
            )
        self.text = self.text[self.pos :] + self._utf8.decode(data, final=not data)
        self.pos = 0
        self.eof = not data
        return True

    def peek(self) -> str:
        """The next character past white space ("" at the end)."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.text) or not self._more():
                return self.text[self.pos : self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.bad(f"expected {char!r}")
        self.pos += 1

    def bad(self, what: str) -> Exception:
        got = self.text[self.pos : self.pos + 20]
        return self.error(f"{self.name}: the answer is not the JSON expected ({what} at {got!r})")

    def value(self) -> Any:
        """The next value, decoded whole: at most max_value bytes of text."""
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.text, self.pos)
            except RecursionError:
                raise self.error(f"{self.name}: the answer is nested too deeply to be Prometheus'") from None
            except ValueError:
                end = -1
            if end >= 0 and (end < len(self.text) or self.eof):  # a number at the end may go on
                self.pos = end
                return obj
            if len(self.text) - self.pos > self.max_value:
                raise self.error(f"{self.name}: a value over {self.max_value >> 20} MB in the answer; not Prometheus'")
            if not self._more():
                raise self.bad("not JSON, or cut short")

    def members(self) -> Iterator[str]:
        """An object's keys, one at a time: the caller reads (or walks) each key's value."""
        self.expect("{")
        first = True
        while self.peek() != "}":
            if not first:
                self.expect(",")
            first = False
            if self.peek() != '"':
                raise self.bad("expected a key")
            key = self.value()
            self.expect(":")
            yield key
        self.pos += 1

    def items(self) -> Iterator[None]:
        """An array's items, one at a time: the caller reads (or walks) each."""
        self.expect("[")
        first = True
        while self.peek() != "]":
            if not first:
                self.expect(",")
            first = False
            if not self.peek():
                raise self.error(f"{self.name}: the answer ends early")
            yield None
        self.pos += 1
