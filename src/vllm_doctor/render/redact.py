"""Take secrets out of what vllm-doctor writes, so a report can be attached to a ticket as it is.

Redaction works line by line and never adds or removes a newline, so evidence keeps its line
numbers. What counts as a secret:

* Hugging Face tokens (`hf_` + 20 or more letters and digits), wherever they appear;
* the value after a secret-looking command-line flag (`--api-key`, `--hf-token`, any
  `--…-key/-token/-secret/-password`);
* the value of a secret-looking entry in a printed argument dump, dict form
  (`'api_key': 'sk-…'`, also lists) and Namespace form (`api_key='sk-…'`, `hf_token=…`);
* `Authorization: Bearer …` and any `Bearer <token>`;
* the value of HF_TOKEN, OPENAI_API_KEY, VLLM_API_KEY and any *_TOKEN, *_KEY, *_SECRET or
  *_PASSWORD variable, in `NAME=value` and `NAME: value` form;
* literal values a caller knows are secret (the wrapper passes those of its environment),
  wherever they appear.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "[REDACTED]"
_MIN_LITERAL = 6  # shorter known values ("1", "true") would mask ordinary text

# a secret-looking name: api_key, hf_token, MY_SECRET, DB_PASSWORD, ... (not max_num_batched_tokens)
_NAME = r"(?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|key|token|secret|password|passwd|access[_-]?token)"
_ENV_NAME = re.compile(r"(?:HF_TOKEN|OPENAI_API_KEY|VLLM_API_KEY|[A-Z][A-Z0-9_]*_(?:TOKEN|KEY|SECRET|PASSWORD))\Z")
_VALUE_END = r"""[^\s,;'"})\]]"""  # a bare value runs until whitespace or punctuation that closes it
_NOT_DONE = r"(?!\[?['\"]?\[REDACTED\])"  # a value masked already (a known literal went first)


def _masked(m: re.Match[str]) -> str:
    """The name part kept, the value masked in the value's own quoting."""
    value = m.group(m.lastindex or 0)
    head = m.group(1)
    if MASK in value:  # masked already (a known literal went first)
        return m.group(0)
    if value[:1] in ("'", '"'):
        return f"{head}{value[0]}{MASK}{value[0]}"
    if value[:1] == "[":
        return f"{head}['{MASK}']"
    return head + MASK


_PATTERNS: list[tuple[re.Pattern[str], Any]] = [
    # Authorization: Bearer xyz / "Bearer xyz"
    (re.compile(r"(?i)(\bBearer\s+)[A-Za-z0-9._~+/=\-]{4,}"), r"\1" + MASK),
    # --api-key VALUE, --api-key=VALUE, --hf-token 'VALUE'
    (
        re.compile(
            r"(?i)(--" + _NAME + r"(?:=|\s+))(?!--)" + _NOT_DONE + r"('[^'\n]*'|\"[^\"\n]*\"|" + _VALUE_END + r"+)"
        ),
        _masked,
    ),
    # dict form: 'api_key': 'v', "hf_token": "v", 'api_key': ['a', 'b']  (None/True/False stay)
    (
        re.compile(
            r"(?i)((['\"])"
            + _NAME
            + r"\2\s*:\s*)(?!None\b|null\b|True\b|False\b)"
            + _NOT_DONE
            + r"(\[[^\]\n]*\]|'[^'\n]*'|\"[^\"\n]*\"|"
            + _VALUE_END
            + r"+)"
        ),
        _masked,
    ),
    # Namespace form / env assignments: api_key='v', hf_token=['a'], HF_TOKEN=v, export X_SECRET="v"
    # (no spaces around '=': prose such as "per token = 7,936" is not an assignment)
    (
        re.compile(
            r"(?i)(?<![\w-])("
            + _NAME
            + r"=)(?!None\b|null\b|True\b|False\b)"
            + _NOT_DONE
            + r"(\[[^\]\n]*\]|'[^'\n]*'|\"[^\"\n]*\"|"
            + _VALUE_END
            + r"+)"
        ),
        _masked,
    ),
    # env in "NAME: value" form (docker compose, k8s env dumps): upper-case names only
    (
        re.compile(
            r"(?<![\w-])((?:HF_TOKEN|OPENAI_API_KEY|VLLM_API_KEY|[A-Z][A-Z0-9_]*_(?:TOKEN|KEY|SECRET|PASSWORD))"
            r"[\"']?\s*:\s*)(?!None\b|null\b)" + _NOT_DONE + r"('[^'\n]*'|\"[^\"\n]*\"|" + _VALUE_END + r"+)"
        ),
        _masked,
    ),
    # Hugging Face tokens anywhere
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), MASK),
]
_FLAG = re.compile(r"(?i)--" + _NAME)
_QUICK = re.compile(r"(?i)hf_|bearer|key|token|secret|passw")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's value is a secret."""
    return bool(_ENV_NAME.match(name))


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the secret-named variables of an environment (os.environ by default)."""
    env = os.environ if environ is None else environ
    return sorted({v for k, v in env.items() if is_secret_name(k) and len(v) >= _MIN_LITERAL}, key=len, reverse=True)


class Redactor:
    """Redacts text line by line; `literals` are known secret values to mask wherever they occur."""

    def __init__(self, literals: Iterable[str] = ()):
        self.literals = sorted(
            {s for s in literals if s and len(s) >= _MIN_LITERAL and "\n" not in s}, key=len, reverse=True
        )

    def line(self, text: str) -> str:
        """One line (or a fragment without newlines)."""
        for lit in self.literals:
            if lit in text:
                text = text.replace(lit, MASK)
        if not _QUICK.search(text):
            return text
        for rx, repl in _PATTERNS:
            text = rx.sub(repl, text)
        return text

    def text(self, text: str) -> str:
        """Any text; newlines stay exactly where they were."""
        if "\n" not in text:
            return self.line(text)
        return "\n".join(self.line(part) for part in text.split("\n"))

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
        n = 0
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            for raw in fin:
                fout.write(self.bytes_line(raw))
                n += 1
        return n


_DEFAULT = Redactor()


def redact(text: str) -> str:
    """Text with the secrets taken out by pattern (no known literals)."""
    return _DEFAULT.text(text)
