"""The Lines a read yields (logread.py): a hit line cleaned and parsed at once, a context line
(read only to join a wrapped message) decoded and parsed on first use."""

from __future__ import annotations

from vllm_doctor.data import Line
from vllm_doctor.read import lineparse


def hit(no: int, raw: bytes, source: int, anchors: tuple[int, ...]) -> Line:
    text, message, process, level = clean(raw)
    return Line(no=no, text=message, raw=text, source=source, process=process, level=level, hit=True, anchors=anchors)


def clean(raw: bytes) -> tuple[str, str, str | None, str | None]:
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


class ContextLine(Line):
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
        self.raw, self.text, self.process, self.level = clean(data)
