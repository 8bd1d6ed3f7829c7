"""Take secrets out of what vllm-doctor writes, so a report can be attached to a ticket as it is.

Redaction works line by line and never adds or removes a newline, so evidence keeps its line
numbers. What counts as a secret is a library of forms (FORMS), each with an example line that
tests/render/test_redact.py holds it to:

* tokens that look like one wherever they are: Hugging Face (`hf_…`), AWS key ids (`AKIA…`),
  OpenAI-style keys (`sk-…`), `Bearer …` and `Authorization: <scheme> …`;
* the password of a URL (`https://user:pass@host`);
* the value after a secret-looking command-line flag (`--api-key`, `--hf-token`, any
  `--…-key/-token/-secret/-password`), bare or quoted (`--api-key "a b"` loses both words);
* the value of a secret-looking entry in a printed argument dump, dict form
  (`'api_key': 'sk-…'`, also lists) and Namespace form (`api_key='sk-…'`, `hf_token=…`);
* the value of HF_TOKEN, OPENAI_API_KEY, VLLM_API_KEY and any *_TOKEN, *_KEY, *_SECRET or
  *_PASSWORD variable, in `NAME=value` and `NAME: value` form;
* headers and assignments of a password, secret or API key, with or without spaces and quotes
  (`password: x`, `x-api-key: x`, `aws_secret_access_key = x`, `"client_secret" = "x"`);
* literal values a caller knows are secret (the wrapper passes those of its environment and
  its command line), wherever they appear, and their pieces when a line break split one (the
  end of one line and the start of the next; a piece of 6 characters or more also on its own).

A line with colour codes is also read without them, so a token glued to one (`\\x1b[32mhf_…`) is
found; such a line loses its colour codes when something on it is masked. `copy` streams a log
in bounded windows (WINDOW): memory does not grow with the longest line, and a window is only
cut where cutting changes nothing of what is masked.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

MASK = "[REDACTED]"
_MIN_LITERAL = 6  # shorter known values ("1", "true") would mask ordinary text
WINDOW = 1 << 20  # characters of one line redacted at a time (copy)
OVERLAP = 64 << 10  # a window's tail kept for the next one: no form is longer than this

# a secret-looking name: api_key, hf_token, MY_SECRET, DB_PASSWORD, ... (not max_num_batched_tokens)
_NAME = r"(?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|key|token|secret|password|passwd|access[_-]?token)"
# names that are a secret even in prose-like "name = value" / "name: value" (not token, key)
_STRONG = (
    r"(?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|secret(?:[_-]access)?[_-]?key|access[_-]?key|private[_-]?key|secret"
    r"|password|passwd|auth[_-]?token|access[_-]?token|session[_-]?token)"
)
_ENV_NAME = re.compile(r"(?:HF_TOKEN|OPENAI_API_KEY|VLLM_API_KEY|[A-Z][A-Z0-9_]*_(?:TOKEN|KEY|SECRET|PASSWORD))\Z")
_VALUE_END = r"""[^\s,;'"`})\]]"""  # a bare value runs until whitespace or punctuation that closes it
_NOT_DONE = r"(?!\[?['\"]?\[REDACTED\])"  # a value masked already (a known literal went first)
_VAR_REF = re.compile(r"""(['"]?)\$\{?[A-Za-z_][A-Za-z0-9_]*\}?\1\Z""")  # the corrected command's secrets
_QUOTED = r"'[^'\n]*'|\"[^\"\n]*\""
_NO_EMPTY = r"(?!None\b|null\b|True\b|False\b)"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
# a line without any of these (lower-cased) holds no form: most lines of a log are skipped by
# a few substring searches, several times faster than one case-insensitive regex alternation;
# the others run only the forms whose words they hold (Form.need)
_QUICK = ("hf_", "key", "token", "secret", "passw", "bearer", "authoriz", "://", "akia", "asia", "sk-")
_AFTER = frozenset(" \t\r\n'\"`|,;)]}>")  # what may follow a piece of a known value
_BEFORE = frozenset(" \t\r\n'\"`|,;([{<=:")  # what may come before one


def _masked(m: re.Match[str]) -> str:
    """The name part kept, the value masked in the value's own quoting."""
    value = m.group(m.lastindex or 0)
    head = m.group(1)
    if MASK in value or _VAR_REF.match(value):  # masked already, or a reference ("$VLLM_API_KEY"), no secret
        return m.group(0)
    if value[:1] in ("'", '"'):
        return f"{head}{value[0]}{MASK}{value[0]}"
    if value[:1] == "[":
        return f"{head}['{MASK}']"
    return head + MASK


@dataclass(frozen=True)
class Form:
    """One shape a secret takes: its pattern, what replaces it, and a line that shows it."""

    name: str
    pattern: re.Pattern[str]
    repl: Any
    example: str  # a line holding the form (tests/render/test_redact.py)
    secret: str  # the part of the example that must not survive
    need: tuple[tuple[str, ...], ...]  # the lower-cased line holds one of each group, or no match

    def applies(self, low: str) -> bool:
        return all(any(q in low for q in group) for group in self.need)


_NAMES = ("key", "token", "secret", "passw")
_NEED = {
    "bearer": (("bearer",),),
    "authorization": (("authoriz",),),
    "url-credentials": (("://",), ("@",)),
    "flag": (("--",), _NAMES),
    "dict-entry": (("'", '"'), _NAMES),
    "assignment": (("=",), _NAMES),
    "env-colon": ((":",), ("_token", "_key", "_secret", "_password")),
    "secret-header": (("=", ":"), _NAMES),
    "aws-key-id": (("akia", "asia"),),
    "openai-key": (("sk-",),),
    "hf-token": (("hf_",),),
}


def _form(name: str, pattern: str, repl: Any, example: str, secret: str) -> Form:
    return Form(name, re.compile(pattern), repl, example, secret, _NEED[name])


FORMS: list[Form] = [
    _form(
        "bearer",
        r"(?i)(\bBearer\s+)[A-Za-z0-9._~+/=\-]{4,}",
        r"\1" + MASK,
        "curl -H 'Authorization: Bearer eyJhbGciOi.c2VjcmV0.sig' http://x/v1",
        "eyJhbGciOi.c2VjcmV0.sig",
    ),
    _form(
        "authorization",
        r"(?i)(\bauthorization[\"']?\s*[:=]\s*[\"']?(?!Bearer\b)[A-Za-z]+\s+)" + _NOT_DONE + r"[A-Za-z0-9._~+/=\-]{4,}",
        r"\1" + MASK,
        "Authorization: Basic dXNlcjpodW50ZXIy",
        "dXNlcjpodW50ZXIy",
    ),
    _form(
        "url-credentials",
        r"(?i)(\b[a-z][a-z0-9+.\-]{0,20}://[^\s:/@'\"]{0,256}:)" + _NOT_DONE + r"([^\s@/'\"]{1,1024})(?=@)",
        r"\1" + MASK,
        "Downloading from https://user:hunter2pass@mirror.internal/models",
        "hunter2pass",
    ),
    _form(
        "flag",
        r"(?i)(--" + _NAME + r"(?:=|\s+))(?!--)" + _NOT_DONE + r"(" + _QUOTED + "|" + _VALUE_END + r"+)",
        _masked,
        'vllm serve /m --api-key "two words" --port 8000',
        "two words",
    ),
    _form(
        "dict-entry",
        r"(?i)((['\"])" + _NAME + r"\2\s*:\s*)" + _NO_EMPTY + _NOT_DONE + r"(\[[^\]\n]*\]|" + _QUOTED + "|"
        r"" + _VALUE_END + r"+)",
        _masked,
        "non-default args: {'model': '/m', 'api_key': ['sk-one', 'sk-two-value']}",
        "sk-two-value",
    ),
    _form(
        # Namespace form / env assignments: api_key='v', hf_token=['a'], HF_TOKEN=v (no spaces
        # around '=': prose such as "per token = 7,936" is not an assignment)
        "assignment",
        r"(?i)(?<![\w-])(" + _NAME + r"=)" + _NO_EMPTY + _NOT_DONE + r"(\[[^\]\n]*\]|" + _QUOTED + "|"
        r"" + _VALUE_END + r"+)",
        _masked,
        "args: Namespace(model='/m', api_key='sk-namespace-value', port=8000)",
        "sk-namespace-value",
    ),
    _form(
        # env in "NAME: value" form (docker compose, k8s env dumps): upper-case names only
        "env-colon",
        r"(?<![\w-])((?:HF_TOKEN|OPENAI_API_KEY|VLLM_API_KEY|[A-Z][A-Z0-9_]*_(?:TOKEN|KEY|SECRET|PASSWORD))"
        r"[\"']?\s*:\s*)(?!None\b|null\b)" + _NOT_DONE + r"(" + _QUOTED + "|" + _VALUE_END + r"+)",
        _masked,
        "  GITHUB_TOKEN: ghp-env-colon-value",
        "ghp-env-colon-value",
    ),
    _form(
        # password / secret / API key headers and assignments, spaces and quotes allowed
        "secret-header",
        r"(?i)(?<![\w-])([\"']?" + _STRONG + r"[\"']?\s*[:=]\s*)" + _NO_EMPTY + _NOT_DONE + r"(" + _QUOTED + "|"
        r"" + _VALUE_END + r"+)",
        _masked,
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG; x-api-key: abc123xyz; password: 'pa ss'",
        "wJalrXUtnFEMI/K7MDENG",
    ),
    _form(
        "aws-key-id",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
        MASK,
        "Found credentials AKIAIOSFODNN7EXAMPLE in shared file",
        "AKIAIOSFODNN7EXAMPLE",
    ),
    _form(
        "openai-key",
        r"\bsk-(?:proj-|live-|test-)?[A-Za-z0-9_\-]{20,}",
        MASK,
        "OpenAI error for key sk-proj-AbCdEfGhIjKlMnOpQrStUv",
        "sk-proj-AbCdEfGhIjKlMnOpQrStUv",
    ),
    _form(
        "hf-token",
        r"\bhf_[A-Za-z0-9]{20,}",
        MASK,
        "401 Client Error with hf_AbCdEfGhIjKlMnOpQrStUvWxYz01",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01",
    ),
]
_FLAG = re.compile(r"(?i)--" + _NAME)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's value is a secret."""
    return bool(_ENV_NAME.match(name))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the secret-named variables of an environment (os.environ by default)."""
    env = os.environ if environ is None else environ
    return sorted({v for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_LITERAL}, key=len, reverse=True)


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


class Redactor:
    """Redacts text line by line; `literals` are known secret values to mask wherever they occur."""

    def __init__(self, literals: Iterable[str] = ()):
        self.literals = sorted(
            {s for s in literals if s and len(s) >= _MIN_LITERAL and "\n" not in s}, key=len, reverse=True
        )
        # for the pieces of a value split over two lines: where each character starts a piece
        self._starts = [_positions(lit, 0) for lit in self.literals]
        self._ends = [_positions(lit, 1) for lit in self.literals]

    def line(self, text: str, before: str = "", after: str = "") -> str:
        """One line (or a fragment without newlines); `before` and `after` are the raw lines
        around it, when known, for a known value split over the line breaks."""
        if self.literals:
            text = self._literals(text, before, after)
        out = _patterns(text)
        if "\x1b" in out:  # a token glued to a colour code: read the line without them
            plain = _ANSI.sub("", out)
            masked = _patterns(plain)
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
        """A JSON-like structure with every string redacted (keys too)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.obj(v) for v in value]
        return value

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
        split over a line break), a long line in windows; returns the number of lines."""
        lines = 0
        before = ""  # the raw text of the line before the held one
        held: tuple[str, bytes] | None = None  # a line waiting for the next one to be read
        while raw := fin.readline(WINDOW):
            if len(raw) == WINDOW and not raw.endswith(b"\n"):
                if held is not None:
                    fout.write(self._out(held, before, ""))
                held, before = None, ""
                self._copy_long(fin, fout, raw)
                lines += 1
                continue
            body = raw.rstrip(b"\r\n")
            text = body.decode("utf-8", "surrogateescape")
            if held is not None:
                fout.write(self._out(held, before, text))
                before = held[0]
            held = (text, raw[len(body) :])
            lines += 1
        if held is not None:
            fout.write(self._out(held, before, ""))
        return lines

    def _out(self, held: tuple[str, bytes], before: str, after: str) -> bytes:
        text, end = held
        return self.line(text, before, after).encode("utf-8", "surrogateescape") + end

    def _copy_long(self, fin: BinaryIO, fout: BinaryIO, first: bytes) -> None:
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
