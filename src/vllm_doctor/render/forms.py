"""The library of forms a secret takes (FORMS), each with an example line that
tests/render/test_redact.py holds it to; render/redact.py runs them over every line.

* tokens that look like one wherever they are: Hugging Face (`hf_…`), AWS key ids (`AKIA…`),
  OpenAI-style keys (`sk-…`), GitHub tokens (`ghp_…`, `github_pat_…`), `Bearer …` (also
  URL-encoded, `Bearer%20…`) and `Authorization: <scheme> …`;
* such a token cut at the end of a line (a terminal's hard-wrap goes on with it below);
* the password of a URL (`https://user:pass@host`) and secret-looking query values (`&sig=…`);
* the value after a secret-looking command-line flag (`--api-key`, `--hf-token`, any
  `--…-key/-token/-secret/-password`), bare or quoted (`--api-key "a b"` loses both words);
* the value of a secret-looking entry in a printed argument dump, dict form
  (`'api_key': 'sk-…'`, bytes `b'…'`, lists, a JSON record inside JSON: `{\\"password\\": …}`)
  and Namespace form (`api_key='sk-…'`, `hf_token=…`);
* the value of HF_TOKEN, OPENAI_API_KEY, VLLM_API_KEY, PGPASSWORD, MYSQL_PWD and any *_TOKEN,
  *_KEY, *_SECRET, *_PASSWORD, *_PASS or *_PWD variable, in `NAME=value` and `NAME: value` form;
* headers and assignments of a password, secret, API key or token (`password: x`,
  `x-api-key: x`, `aws_secret_access_key = x`, `"client_secret" = "x"`, YAML's `hf_token: x`).

A line holding none of the words of _QUICK (lower-cased) holds no form: most lines of a log are
skipped by a few substring searches; the others run only the forms whose words they hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

MASK = "[REDACTED]"

# a secret-looking name: api_key, hf_token, MY_SECRET, DB_PASSWORD, ... (not max_num_batched_tokens)
_NAME = r"(?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|key|token|secret|password|passwd|access[_-]?token)"
# names that are a secret even in prose-like "name = value" / "name: value" (not token, key)
_STRONG = (
    r"(?:[A-Za-z0-9]+[_-])*(?:api[_-]?key|secret(?:[_-]access)?[_-]?key|access[_-]?key|private[_-]?key|secret"
    r"|password|passwd|auth[_-]?token|access[_-]?token|session[_-]?token|hf[_-]?token|api[_-]?token"
    r"|refresh[_-]?token)"
)
# upper-case variable names whose value is a secret (env dumps, docker compose, shell lines)
_ENV = r"(?:HF_TOKEN|OPENAI_API_KEY|VLLM_API_KEY|[A-Z][A-Z0-9_]*_(?:TOKEN|KEY|SECRET|PASSWORD))"
_VALUE_END = r"""[^\s,;'"`})\]]"""  # a bare value runs until whitespace or punctuation that closes it
_NOT_DONE = r"(?!\[?['\"]?\[REDACTED\])"  # a value masked already (a known literal went first)
_VAR_REF = re.compile(r"""(['"]?)\$\{?[A-Za-z_][A-Za-z0-9_]*\}?\1\Z""")  # the corrected command's secrets
_QUOTED = r"b?'[^'\n]*'|b?\"[^\"\n]*\""  # quoted values: '…', "…", and bytes b'…'
_NO_EMPTY = r"(?!None\b|null\b|True\b|False\b)"
_TOKEN = r"[A-Za-z0-9._~+/=%\-]"  # the characters of a bearer token (URL-encoded too)
_SPACE = r"(?:\s+|%20|\+)"  # a space, or as a URL encodes it
# the token forms that may be cut by a line wrap (the first piece ends the line)
_CUT = r"(?:\bhf_|\bsk-|\bgh[opsur]_|\bgithub_pat_|\b(?:AKIA|ASIA))"
_QUICK = (
    "hf_", "key", "token", "secret", "passw", "bearer", "authoriz", "://", "akia", "asia", "sk-",
    "ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_", "_pass", "_pwd",
)  # fmt: skip


def _masked(m: re.Match[str]) -> str:
    """The name part kept, the value masked in the value's own quoting."""
    value = m.group(m.lastindex or 0)
    head = m.group(1)
    if MASK in value or _VAR_REF.match(value):  # masked already, or a reference ("$VLLM_API_KEY"), no secret
        return m.group(0)
    if value[:2] == '\\"':
        return f'{head}\\"{MASK}\\"'
    if value[:2] in ("b'", 'b"'):
        return f"{head}b{value[1]}{MASK}{value[1]}"
    if value[:1] in ("'", '"'):
        return f"{head}{value[0]}{MASK}{value[0]}"
    if value[:1] == "[":
        return f"{head}['{MASK}']"
    return head + MASK


@dataclass(frozen=True)
class Form:
    """One shape a secret takes: its pattern, what replaces it, and a line that shows it."""

    name: str
    regex: str
    repl: Any
    example: str  # a line holding the form (tests/render/test_redact.py)
    secret: str  # the part of the example that must not survive
    need: tuple[tuple[str, ...], ...]  # the lower-cased line holds one of each group, or no match

    @cached_property
    def pattern(self) -> re.Pattern[str]:  # compiled on first use: most runs meet few forms, many none
        return re.compile(self.regex)

    def applies(self, low: str) -> bool:
        return all(any(q in low for q in group) for group in self.need)


_NAMES = ("key", "token", "secret", "passw")
_GITHUB = ("ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_")
_NEED = {
    "bearer": (("bearer",),),
    "authorization": (("authoriz",),),
    "url-credentials": (("://",), ("@",)),
    "url-query": (("://",), ("sig", "auth", "credential", "pass", "pwd")),
    "flag": (("--",), _NAMES),
    "dict-entry": (("'", '"'), _NAMES),
    "assignment": (("=",), _NAMES),
    "env-colon": ((":",), ("_token", "_key", "_secret", "_password")),
    "env-assignment": (("=",), ("pgpassword", "_pwd", "_pass")),
    "escaped-entry": (('\\"',), _NAMES),
    "secret-header": (("=", ":"), _NAMES),
    "aws-key-id": (("akia", "asia"),),
    "openai-key": (("sk-",),),
    "hf-token": (("hf_",),),
    "github-token": (_GITHUB,),
    "cut-token": (("hf_", "sk-", "akia", "asia", *_GITHUB),),
}


def _form(name: str, pattern: str, repl: Any, example: str, secret: str) -> Form:
    return Form(name, pattern, repl, example, secret, _NEED[name])


FORMS: list[Form] = [
    _form(
        "bearer",
        r"(?i)(\bBearer" + _SPACE + r")" + _TOKEN + r"{4,}",
        r"\1" + MASK,
        "curl -H 'Authorization: Bearer eyJhbGciOi.c2VjcmV0.sig' http://x/v1",
        "eyJhbGciOi.c2VjcmV0.sig",
    ),
    _form(
        "authorization",
        r"(?i)(\bauthorization[\"']?\s*(?:[:=]|%3A)(?:\s|%20)*[\"']?(?!Bearer\b)[A-Za-z]+"
        + _SPACE
        + r")"
        + _NOT_DONE
        + _TOKEN
        + r"{4,}",
        r"\1" + MASK,
        "Authorization: Basic dXNlcjpodW50ZXIy",
        "dXNlcjpodW50ZXIy",
    ),  # fmt: skip
    _form(
        "url-credentials",
        r"(?i)(\b[a-z][a-z0-9+.\-]{0,20}://[^\s:/@'\"]{0,256}:)" + _NOT_DONE + r"([^\s@/'\"]{1,1024})(?=@)",
        r"\1" + MASK,
        "Downloading from https://user:hunter2pass@mirror.internal/models",
        "hunter2pass",
    ),
    _form(
        # query values the other forms do not name (token=, api_key= are assignments)
        "url-query",
        r"(?i)([?&;][A-Za-z0-9_.\-]{0,64}(?:sig|signature|auth|credential|pass|pwd)=)" + _NOT_DONE + r"([^\s&#'\"]+)",
        r"\1" + MASK,
        "fetching https://bucket.s3/x?X-Amz-Credential=AKID%2F2026&X-Amz-Signature=9f8e7d6c5b4a",
        "9f8e7d6c5b4a",
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
        r"(?<![\w-])(" + _ENV + r"[\"']?\s*:\s*)(?!None\b|null\b)" + _NOT_DONE + r"(" + _QUOTED + "|"
        r"" + _VALUE_END + r"+)",
        _masked,
        "  GITHUB_TOKEN: ghp-env-colon-value",
        "ghp-env-colon-value",
    ),
    _form(
        # NAME=value for the variables the assignment form does not know by their name's end
        "env-assignment",
        r"(?<![\w-])((?:PGPASSWORD|MYSQL_PWD|[A-Z][A-Z0-9_]*_(?:PASS|PWD))=)" + _NOT_DONE + r"(" + _QUOTED + "|"
        r"" + _VALUE_END + r"+)",
        _masked,
        "PGPASSWORD=pg-secret-value MYSQL_PWD=my-secret-value psql -h db",
        "pg-secret-value",
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
        # a JSON record printed inside a JSON string: {\"password\": \"v\"}
        "escaped-entry",
        r"(?i)(\\\"" + _NAME + r"\\\"\s*:\s*)" + _NO_EMPTY + _NOT_DONE + r"(\\\"[^\"\n]*\\\"|" + _VALUE_END + r"+)",
        _masked,
        '{"msg": "request {\\"model\\": \\"m\\", \\"password\\": \\"hunter2-inner\\"}"}',
        "hunter2-inner",
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
    _form(
        "github-token",
        r"\b(?:gh[opsur]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})",
        MASK,
        "remote: Invalid username or token ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "ghp_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    ),
    _form(
        # the first piece of a token a line wrap cut: too short for its own form, at the line's
        # end, with a capital or a digit in it (not a word such as hf_overrides)
        "cut-token",
        _CUT + r"(?=[a-z_\-]*[A-Z0-9])[A-Za-z0-9_\-]{4,}\Z",
        MASK,
        "INFO loading the model with token hf_AbCdEfGh",
        "hf_AbCdEfGh",
    ),
]
CUT_TAIL = re.compile(_CUT + r"[A-Za-z0-9_\-]*\Z")  # a line's end in a token: the next line may go on with it
CUT_END = re.compile(CUT_TAIL.pattern + r"|(?i:\bBearer" + _SPACE + _TOKEN + r"*)\Z")  # or in a bearer's
FULL = {"hf_": 34, "akia": 16, "asia": 16, "ghp_": 36, "gho_": 36, "ghs_": 36, "ghu_": 36, "ghr_": 36}
