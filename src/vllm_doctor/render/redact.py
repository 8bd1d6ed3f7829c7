"""Take secrets out of what vllm-doctor writes, so a report can be attached to a ticket as it is.

Redaction works line by line and never adds or removes a newline, so evidence keeps its line
numbers. What counts as a secret is the library of forms in render/forms.py (FORMS), and
literal values a caller knows are secret (the wrapper passes those of its environment and its
command line), wherever they appear, and their pieces when a line break split one (the end of
one line and the start of the next; a piece of 6 characters or more also on its own). A token
form a terminal's hard-wrap cut goes on being masked on the next line (its first piece is a
form of its own).

A line with colour codes (any CSI, colon SGR `\\x1b[38:5:196m` too, 8-bit CSI U+009B, OSC,
charset designations `\\x1b(B`) or zero-width characters (U+200B-U+200D, U+2060, U+FEFF) is
also read without them, so a token glued to or split by one is found; such a line loses them
when something on it is masked. `copy` streams a log in bounded windows (WINDOW): memory does
not grow with the longest line, and a window is only cut where cutting changes nothing of what
is masked.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO

from vllm_doctor.data import Evidence
from vllm_doctor.render.forms import _NAME, _QUICK, CUT_END, CUT_TAIL, FORMS, FULL, MASK, Form

__all__ = ["FORMS", "MASK", "Form", "Redactor", "flag_values", "is_secret", "is_secret_name", "redact", "report"]

WRAPPED = 40  # a terminal hard-wraps a line at its width, 40 columns or more: a shorter line ended itself
_MIN_LITERAL = 6  # shorter known values ("1", "true") would mask ordinary text
WINDOW = 1 << 20  # characters of one line redacted at a time (copy)
OVERLAP = 64 << 10  # a window's tail kept for the next one: no form is longer than this
# what hides a token from the forms: escape sequences (CSI with colons, 8-bit CSI decoded or as a
# lone byte, OSC, charset designation and other two-byte escapes) and zero-width characters
_HIDING = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]|[\x9b\udc9b][0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
    r"|\x1b[ -/]*[0-~]|[\u200b-\u200d\u2060\ufeff]"
)
_INVISIBLE = re.compile(r"[\x9b\udc9b\u200b-\u200d\u2060\ufeff]")  # looked for only in a non-ASCII line
# any variable name holding one of these words is a secret (not TOKENS, a count, nor TOKENIZER)
_ENV_NAME = re.compile(
    r"(?:HF_TOKEN|OPENAI_API_KEY|VLLM_API_KEY|PGPASSWORD|MYSQL_PWD|[A-Z][A-Z0-9_]*_(?:KEY|PASS|PWD|AUTH)"
    r"|[A-Z0-9_]*(?:TOKEN(?!IZ|S)|SECRET|PASSWORD|PASSWD|CREDENTIAL)[A-Z0-9_]*)\Z"
)
_PLAIN_VALUE = re.compile(r"(?i)[0-9.]*|true|false|yes|no|on|off|none|null|auto|enabled|disabled")
_AFTER = frozenset(" \t\r\n'\"`|,;)]}>")  # what may follow a piece of a known value
_BEFORE = frozenset(" \t\r\n'\"`|,;([{<=:")  # what may come before one
_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.~+/=%")  # a token's characters
_CONTINUED = re.compile(r"[A-Za-z0-9_\-.~+/=%]+")  # the rest of a cut token, at the next line's start
_FLAG = re.compile(r"(?i)--" + _NAME)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's value is a secret, by its name."""
    return bool(_ENV_NAME.match(name.upper()))


def is_secret(name: str, value: str) -> bool:
    """Whether a variable's value is a secret: by its name, or by its value's shape (a token,
    a URL with a password: what a form masks), whatever the name."""
    return is_secret_name(name) or _patterns(value) != value


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the secret variables of an environment (os.environ by default), but for
    plain ones ("true", "8000") that would mask ordinary text."""
    env = os.environ if environ is None else environ
    return sorted(
        {v for k, v in env.items() if len(v) >= _MIN_LITERAL and not _PLAIN_VALUE.fullmatch(v) and is_secret(k, v)},
        key=len,
        reverse=True,
    )


def flag_values(args: Iterable[str]) -> list[str]:
    """The values given to secret-looking flags of a command line (`--api-key V`, `--hf-token=V`)."""
    out, secret_next = [], False
    for a in args:
        if secret_next and not a.startswith("--"):
            out.append(a)
        elif "=" in a and _FLAG.fullmatch(a.split("=", 1)[0]):
            out.append(a.split("=", 1)[1])
        secret_next = bool(_FLAG.fullmatch(a))
    return [v for v in out if len(v) >= _MIN_LITERAL]


def _patterns(text: str) -> str:
    low = text.lower()
    if not any(q in low for q in _QUICK):
        return text
    for form in FORMS:
        if form.applies(low):
            text = form.pattern.sub(form.repl, text)
    return text


def _positions(lit: str, shift: int) -> dict[str, list[int]]:
    """For each character: the cuts k (1 <= k < len) of `lit` where lit[k - shift] is that character."""
    out: dict[str, list[int]] = {}
    for k in range(1, len(lit)):
        out.setdefault(lit[k - shift], []).append(k)
    return out


def _pieces(text: str, lit: str) -> list[tuple[int, int]]:
    """Pieces of 6 characters or more of a known value: its start before the end of the text or
    a word's end, its end after the text's start or a word's start (a line break split it there;
    evidence quoted in a report shows one line alone)."""
    out = []
    n, m = len(text), len(lit)
    p = text.find(lit[:_MIN_LITERAL])
    while p >= 0:
        j = _MIN_LITERAL
        while j < m and p + j < n and text[p + j] == lit[j]:
            j += 1
        if j < m and (p + j == n or text[p + j] in _AFTER):
            out.append((p, p + j))
        p = text.find(lit[:_MIN_LITERAL], p + 1)
    e = text.find(lit[-_MIN_LITERAL:])
    while e >= 0:
        end, i = e + _MIN_LITERAL, _MIN_LITERAL
        while i < m and end - i > 0 and text[end - i - 1] == lit[m - i - 1]:
            i += 1
        if i < m and (end - i == 0 or text[end - i - 1] in _BEFORE):
            out.append((end - i, end))
        e = text.find(lit[-_MIN_LITERAL:], e + 1)
    return out


_CUT_WORDS = ("hf_", "sk-", "gh", "akia", "asia")


def _cut(text: str) -> str:
    """The line less the start of a token it ends in, the next line going on with the rest."""
    if not any(q in text[-100:].lower() for q in _CUT_WORDS):
        return text
    m = CUT_TAIL.search(text, max(0, len(text) - 200))
    return text[: m.start()] + MASK if m else text


def _continued(text: str, before: str) -> str:
    """The line less the rest of a token the line before ended in (a hard-wrap cut it there):
    any token form, but for one that already had its whole length there."""
    tail = before[-200:]
    low = tail.lower()
    if not any(q in low for q in (*_CUT_WORDS, "bearer")):
        return text
    m = CUT_END.search(tail)
    if m is None:
        return text
    word = m.group(0).lower()
    if any(word.startswith(p) and len(word) - len(p) >= n for p, n in FULL.items()):
        return text
    rest = _CONTINUED.match(text)
    return MASK + text[rest.end() :] if rest else text


class Redactor:
    """Redacts text line by line; `literals` are known secret values to mask wherever they occur."""

    def __init__(self, literals: Iterable[str] = ()):
        self.literals = sorted(
            {s for s in literals if s and len(s) >= _MIN_LITERAL and "\n" not in s}, key=len, reverse=True
        )
        # for the pieces of a value split over two lines: where each character starts a piece
        self._starts = [_positions(lit, 0) for lit in self.literals]
        self._ends = [_positions(lit, 1) for lit in self.literals]
        # for the block copy: each value as bytes, with its first and last 6 characters
        self._lit_bytes = [
            (b, (b[:_MIN_LITERAL], b[-_MIN_LITERAL:]))
            for b in (lit.encode("utf-8", "surrogateescape") for lit in self.literals)
        ]

    def line(self, text: str, before: str = "", after: str = "") -> str:
        """One line (or a fragment without newlines); `before` and `after` are the raw lines
        around it, when known, for a value split over the line breaks."""
        if self.literals:
            text = self._literals(text, before, after)
        out = _patterns(text)
        if len(before) >= WRAPPED and out and out[0] in _WORD and before[-1] in _WORD:
            out = _continued(out, before)
        if after and len(out) >= WRAPPED and out[-1] in _WORD and after[0] in _WORD:
            out = _cut(out)
        if "\x1b" in out or (not out.isascii() and _INVISIBLE.search(out)):
            # a token glued to or split by an escape or a zero-width character: read it without them
            plain = _HIDING.sub("", out)
            masked = _patterns(self._literals(plain, before, after) if self.literals else plain)
            if masked != plain:
                return masked
        return out

    def _literals(self, text: str, before: str, after: str) -> str:
        for lit in self.literals:
            if lit in text:
                text = text.replace(lit, MASK)
        if not text:
            return text
        spans: list[tuple[int, int]] = []  # pieces of a known value to mask
        for lit, starts, ends in zip(self.literals, self._starts, self._ends, strict=True):
            if before:  # the rest of a value the line before ended with
                for k in starts.get(text[0], ()):
                    if text.startswith(lit[k:]) and before.endswith(lit[:k]):
                        spans.append((0, len(lit) - k))
            if after:  # the start of a value the next line goes on with
                for k in ends.get(text[-1], ()):
                    if text.endswith(lit[:k]) and after.startswith(lit[k:]):
                        spans.append((len(text) - k, len(text)))
            if len(text) >= _MIN_LITERAL:
                spans += _pieces(text, lit)
        if not spans:
            return text
        out, at = [], 0
        for a, b in sorted(spans):
            if b <= at:
                continue
            if a >= at:  # else it overlaps the piece masked last: that mask covers it
                out += [text[at:a], MASK]
            at = b
        return "".join(out) + text[at:]

    def text(self, text: str) -> str:
        """Any text; newlines stay exactly where they were."""
        if "\n" not in text:
            return self.line(text)
        parts = text.split("\n")
        return "\n".join(
            self.line(p, parts[i - 1] if i else "", parts[i + 1] if i + 1 < len(parts) else "")
            for i, p in enumerate(parts)
        )

    def obj(self, value: Any) -> Any:
        """A JSON-like structure with every string redacted (keys too); evidence rows
        ({"line", "text"}) each held against the rows of the lines next to it."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            if value and all(isinstance(v, dict) and isinstance(v.get("text"), str) and "line" in v for v in value):
                texts = self.rows([(v["line"], v["text"], v.get("source", v.get("path"))) for v in value])
                return [{self.text(k): t if k == "text" else self.obj(x) for k, x in v.items()}
                        for v, t in zip(value, texts, strict=True)]  # fmt: skip
            return [self.obj(v) for v in value]
        return value

    def rows(self, rows: list[tuple[Any, str, Any]]) -> list[str]:
        """Evidence texts (line number, text, source): a line's neighbours in the list are the
        lines around it, for a value a wrap split."""
        by = {(src, no): text for no, text, src in rows}
        out = []
        for no, text, src in rows:
            if "\n" in text or not isinstance(no, int):
                out.append(self.text(text))
            else:
                out.append(self.line(text, by.get((src, no - 1), ""), by.get((src, no + 1), "")))
        return out

    def argv(self, args: list[str]) -> list[str]:
        """A command line as a list: the value after a secret flag is its own element."""
        out = []
        secret_next = False
        for a in args:
            if secret_next and not a.startswith("--"):
                out.append(MASK)
            else:
                out.append(self.line(a))
            secret_next = bool(_FLAG.fullmatch(a))
        return out

    def bytes_line(self, raw: bytes) -> bytes:
        """A raw log line (with its line ending, if any); undecodable bytes stay as they were."""
        body = raw.rstrip(b"\r\n")
        end = raw[len(body) :]
        text = body.decode("utf-8", "surrogateescape")
        out = self.line(text)
        if out == text:
            return raw
        return out.encode("utf-8", "surrogateescape") + end

    def copy_file(self, src: str, dst: str) -> int:
        """Copy a log with every line redacted, streaming; returns the number of lines."""
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            return self.copy(fin, fout)

    def copy(self, fin: BinaryIO, fout: BinaryIO) -> int:
        """Copy a log with every line redacted, each line held against its neighbours (a value
        split over a line break), a long line in windows; returns the number of lines. Runs of
        lines that hold nothing to mask go out as they are (render/logcopy.py)."""
        from vllm_doctor.render.logcopy import copy

        return copy(self, fin, fout)

    def _out(self, held: tuple[str, bytes], before: str, after: str) -> bytes:
        text, end = held
        return self.line(text, before, after).encode("utf-8", "surrogateescape") + end

    def _copy_long(self, fin: Any, fout: BinaryIO, first: bytes) -> None:
        """One line longer than WINDOW, a window at a time: at most about two windows held."""
        carry = first.decode("utf-8", "surrogateescape")
        while True:
            more = fin.readline(WINDOW)
            carry += more.decode("utf-8", "surrogateescape")
            if not more or more.endswith(b"\n"):
                body = carry.rstrip("\r\n")
                fout.write((self.line(body) + carry[len(body) :]).encode("utf-8", "surrogateescape"))
                return
            if len(carry) > WINDOW + OVERLAP:
                cut = self._cut(carry)
                fout.write(self.line(carry[:cut]).encode("utf-8", "surrogateescape"))
                carry = carry[cut:]

    def _cut(self, window: str) -> int:
        """Where a window can be cut without changing what is masked: at a space, OVERLAP or more
        before its end, where masking the two parts apart gives what masking it whole gives."""
        whole = self.line(window)
        limit = cut = len(window) - OVERLAP
        for _ in range(8):
            space = window.rfind(" ", 0, cut)
            at = space + 1 if space > 0 else cut
            if self.line(window[:at]) + self.line(window[at:]) == whole:
                return at
            cut = at - 4096
            if cut <= OVERLAP:
                break
        return limit


_DEFAULT = Redactor()


def redact(text: str) -> str:
    """Text with the secrets taken out by pattern (no known literals)."""
    return _DEFAULT.text(text)


def report(doc: Any, redactor: Redactor | None = None) -> Any:
    """A copy of a Report (or any dataclass tree) with every string in it masked: what the text
    renderer prints, so the terminal text is as safe to paste as the ticket."""
    red = redactor or _DEFAULT

    def walk(value: Any) -> Any:
        if isinstance(value, list) and value and all(isinstance(v, Evidence) for v in value):
            texts = red.rows([(e.line, e.text, e.source) for e in value])
            return [dataclasses.replace(e, text=t) for e, t in zip(value, texts, strict=True)]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.replace(
                value, **{f.name: walk(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            )
        if isinstance(value, str):
            return red.text(value)
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value] if isinstance(value, list) else tuple(walk(v) for v in value)
        return value

    return walk(doc)
