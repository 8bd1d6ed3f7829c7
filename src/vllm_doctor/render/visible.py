"""Text from the input is shown, never obeyed: what a log line, a model path, a /metrics body or a
`check --` argument holds reaches a reader as characters, not as commands to the terminal or the
Markdown renderer.

* `visible`: every control character but tab and newline (C0, DEL, the 8-bit C1 set U+0080-U+009F:
  `\\x9b` is a CSI to many terminals), every bidi control (U+202A-U+202E, U+2066-U+2069,
  U+200E, U+200F, U+061C) and every lone surrogate (U+D800-U+DFFF: a `\\udfff` escape in an
  argument dump or a JSON string decodes to one, and no UTF-8 writer takes it) written as its
  escape, `\\x1b`, `\\x9b`, `\\u202e`, `\\udfff`. Applied at the edge of
  every human-readable format (the terminal's report before rich adds its own colour, Markdown,
  HTML, plans, stderr's notes and errors, --follow's live lines) after secrets are masked: the
  masking reads colour codes, the reader gets their escapes.
* `json_visible`: JSON text with the same characters as `\\u` escapes: json.dumps escapes C0
  already, not DEL, C1 or bidi; the value a parser reads is the same.
* `visible_doc`: a copy of a Report (any dataclass tree) with every string made visible.
* `md`, `cell`, `code`, `fence`: a word from the input in Markdown outside code, CommonMark's
  backslash escape for every punctuation mark that starts markup (an image, a link, raw HTML,
  emphasis, an entity, a list or heading at a line's start; in a table cell a "|"); in a code span
  or a fenced block, one backtick longer than any run inside.

The character class is written out for the stdlib `re` (the cold start pays for no `regex`);
tests/hostile/test_output_escapes.py holds it to `regex`'s `\\p{Cc}`, `\\p{Bidi_Control}` and `\\p{Cs}`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

# \p{Cc} (C0, DEL, C1) less tab and newline, \p{Bidi_Control}, and \p{Cs} (the surrogates)
HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# CommonMark's markup that text from the input could start anywhere in a line: an image or link
# ([, ]: "![" is no image once "[" is escaped), raw HTML and autolinks (<, >), an entity (&, as
# in &#x202e;), emphasis (*, _), code (`), strikethrough (~), and the backslash that would undo an
# escape. A table cell's "|" is cell()'s; the rest only acts at a line's start (_LEAD)
_MARKUP = re.compile(r"[\\`*\[\]<>~&]|_+")
# what starts a block at a line's start: a list item ("- ", "+ ", "1. ", "1) "), a heading ("# "),
# a setext underline or thematic break ("---", "==="); the escape goes before the punctuation mark
_LEAD = re.compile(r"\A(?:\d{1,9}(?=[.)](?:\s|\Z))|(?=[-+](?:\s|\Z))|(?=#{1,6}(?:\s|\Z))|(?=(?:-+|=+)\s*\Z))")
_TICKS = re.compile(r"`+")
# a code span as CommonMark reads one: a run of backticks, then text, then a run of the same length
_SPAN = re.compile(r"(?<!`)(`+)(?!`)[^\n]*?[^`\n](?<!`)\1(?!`)")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: str) -> str:
    """`text` with every control (but tab and newline) and bidi character as its escape."""
    return HIDDEN.sub(_escape, text)


def json_visible(text: str) -> str:
    """JSON text with DEL, C1, bidi controls and lone surrogates (raw under ensure_ascii=False) as
    \\u escapes."""
    return HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def visible_doc(doc: Any) -> Any:
    """A copy of `doc` (a Report, a dict, a list) with every string in it made visible."""

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return visible(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: walk(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            return dataclasses.replace(value, **fields)
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        return value

    return walk(doc)


def md(text: str) -> str:
    """`text` as Markdown that renders as itself: markup characters backslash-escaped (an `_`
    inside a word, as in max_model_len, stays: it cannot start emphasis there). A whole code span
    (`dmesg`, as our own texts write a command) stays one: nothing inside a code span is markup."""
    text = str(text)
    out, at = [], 0
    for span in _SPAN.finditer(text):
        out += [_escaped(text, at, span.start()), span.group()]
        at = span.end()
    out.append(_escaped(text, at, len(text)))
    done = "".join(out)
    lead = _LEAD.match(done)
    return done if lead is None else f"{done[: lead.end()]}\\{done[lead.end() :]}"


def _escaped(text: str, start: int, end: int) -> str:
    """text[start:end] with its markup characters escaped (an `_` between two letters stays)."""
    out, at = [], start
    for m in _MARKUP.finditer(text, start, end):
        s = m.group()
        inside = s[0] == "_" and text[m.start() - 1 : m.start()].isalnum() and text[m.end() : m.end() + 1].isalnum()
        out += [text[at : m.start()], s if inside else "".join("\\" + c for c in s)]
        at = m.end()
    out.append(text[at:end])
    return "".join(out)


def cell(text: str) -> str:
    """`text` in a table cell: escaped as md() does, and a "|" would end the cell (GitHub, GitLab, Jira)."""
    return md(text).replace("|", "\\|").replace("\n", " ")


def _ticks(text: str) -> int:
    return max((len(t) for t in _TICKS.findall(text)), default=0)


def code(text: str) -> str:
    """`text` as an inline code span, its backticks one more than the longest run in it."""
    text = str(text).replace("\n", " ")
    ticks = "`" * (_ticks(text) + 1)
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fence(lines: list[str]) -> str:
    """The fence of a code block holding `lines`: three backticks, or one more than the longest run."""
    return "`" * max(3, max((_ticks(line) for line in lines), default=0) + 1)
