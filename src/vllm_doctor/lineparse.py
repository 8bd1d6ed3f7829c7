"""Undo what terminals, launchers and log collectors do to a vLLM log line.

Colour codes come in three forms (real ESC sequences, caret text copied from a pager, syslog's
#033 escapes); prefixes stack up (collector timestamp, compose service, Ray or vLLM process,
torch rank, logger level/date/file). What is left is the message vLLM wrote.
"""

from __future__ import annotations

import html
import re

_COLOUR = re.compile(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]"  # real ESC CSI sequences
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC (terminal titles, links)
    r"|\^\[\[[0-9;]*[A-Za-z]"  # caret text from a pager: ^[[0;36m
    r"|#033\[[0-9;]*[A-Za-z]"  # syslog / CloudWatch: #033[1;36m
    r"|#015|\r"
)

# Each prefix is tried at the start of what is left; they stack in any order.
_COLLECTOR = re.compile(
    r"(?:"
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s+(?:stdout|stderr)?\s*[FP]?\s+"  # docker/k8s RFC3339
    r"|\[\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?\]\s*(?:\|\s)?"  # CI: [2026-01-01T00:00:00Z]  |
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.\-/]+(?:\[\d+\])?:\s"  # syslog: Nov 30 01:53:24 host vllm[12]:
    r"|[\w.\-]+(?:[-_]\d+)?\s+\|\s"  # docker compose: vllm-1  |
    r"|\s*\|\s"  # a bare CI gutter
    r")"
)
_PROCESS = re.compile(
    r"\(?(?P<name>[A-Za-z_][\w\-]*(?: [\w\-]+)?)(?: rank=\d+)? pid=(?P<pid>\d+)(?:, ip=[\d.]+)?\)\s*"
)
_RANK = re.compile(r"\[rank(?P<rank>\d+)\]:\s*")
_LOGGER = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?:\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?"  # vLLM: 11-30 01:53:24
    r"(?:\[[^\]\s]+:\d+\]|[\w.\-/]+:\d+\])\s?"  # [core.py:1510] (0.8+) or core.py:1510] (older)
)
_APP_LOGGER = re.compile(  # 2024-05-01 10:00:00 - vllm.engine.metrics - INFO - msg
    r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)? - [\w.]+ - (?P<level>[A-Z]+) - "
)
_UVICORN = re.compile(r"(?P<level>INFO|ERROR|WARNING|DEBUG|CRITICAL):\s+")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_INSERTED = re.compile(r"\[address=[^\]]*\]\s*")  # servers that insert [address=…, pid=…]
_TQDM_HEAD = re.compile(r".*?(?:\d+/\d+ \[[^\]]*\]|it/s\]|s/it\])")


def strip_colour(text: str) -> str:
    if "\x1b" in text or "^[[" in text or "#0" in text or "\r" in text:
        return _COLOUR.sub("", text)
    return text


def parse(raw: str) -> tuple[str, str | None, str | None]:
    """Return (message, process, level) for one colour-stripped line."""
    text = raw
    if "&" in text and ";" in text:
        text = html.unescape(text)
    if "[repeated" in text:
        text = _RAY_REPEAT.sub("", text)
    if "[address=" in text:
        text = _INSERTED.sub("", text)
    process = level = None
    # tqdm bars are glued to the next record with no newline between them
    if "%|" in text or "it/s]" in text or "s/it]" in text:
        head = _TQDM_HEAD.match(text)
        if head and _PROCESS.match(text, head.end()):
            text = text[head.end():]
    pos = 0
    for _ in range(8):  # prefixes stack; each pass strips one
        stripped = text[pos:]
        if not stripped:
            break
        lead = len(stripped) - len(stripped.lstrip(" \t"))
        if lead and not stripped[lead:lead + 1].isalpha() and stripped[lead:lead + 1] not in "([":
            break  # an indented traceback line: keep its indentation
        m = (
            _PROCESS.match(text, pos)
            or _RANK.match(text, pos)
            or _LOGGER.match(text, pos)
            or _APP_LOGGER.match(text, pos)
            or _COLLECTOR.match(text, pos)
        )
        if m is None and level is None:
            m = _UVICORN.match(text, pos)
        if m is None or m.end() == pos:
            break
        groups = m.groupdict()
        if groups.get("name"):
            process = groups["name"].replace(" ", "_")
        elif groups.get("rank") is not None and process is None:
            process = f"rank{groups['rank']}"
        if groups.get("level"):
            level = "WARNING" if groups["level"] == "WARN" else groups["level"]
        pos = m.end()
    return text[pos:], process, level
