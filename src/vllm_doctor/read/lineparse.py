"""Undo what terminals, launchers and log collectors do to a vLLM log line.

Colour codes come in four forms (real ESC sequences, caret text copied from a pager, syslog's
#033 escapes, and the bare `[0;36m` left when a paste drops the ESC byte); prefixes stack up
(collector timestamp, compose service, Ray or vLLM process, torch rank, logger level/date/file).
What is left is the message vLLM wrote.
"""

from __future__ import annotations

import json
import re

_COLOUR = re.compile(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]"  # real ESC CSI sequences
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC (terminal titles, links)
    r"|\x1b[()][A-Za-z0-9]"  # charset selection (tput sgr0 emits ESC(B)
    r"|\^\[\[[0-9;]*[A-Za-z]"  # caret text from a pager: ^[[0;36m
    r"|\^\[\([A-Za-z0-9]"  # caret text of a charset selection: ^[(B
    r"|#033\[[0-9;]*[A-Za-z]"  # syslog / CloudWatch: #033[1;36m
    r"|#015|\r"
)
# a paste that lost the ESC byte keeps the rest: "[1;36m(APIServer pid=1)[0;0m INFO ..."
_BARE_SGR = re.compile(r"\[\d{1,3}(?:;\d{1,3})*m")

_LEVELS = r"DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL"
_DATE = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_STAMP = rf"{_DATE}(?:\s+(?:stdout|stderr)\s+[FP])?"  # docker --timestamps; a CRI file's 2024-…Z stdout F

# Each prefix is tried at the start of what is left; they stack in any order.
_COLLECTOR = re.compile(
    r"(?:"
    rf"{_STAMP}(?:\s*\|)?\s+"  # docker --timestamps, k8s CRI, GitHub Actions
    rf"|\[{_DATE}\]\s*(?:\|\s)?"  # CI: [2026-01-01T00:00:00Z]  |
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.\-/]+(?:\[\d+\])?:\s"  # syslog: Nov 30 01:53:24 host vllm[12]:
    r"|\[pod/[^\]\s]+\]\s"  # kubectl logs --prefix: [pod/vllm-0/vllm]
    r"|[\w.\-]+(?:[-_]\d+)?\s+\|\s"  # docker compose: vllm-1  |
    r"|\s*\|\s"  # a bare CI gutter
    r")"
)
_PROCESS = re.compile(  # (APIServer pid=1), (VllmWorker rank=1 pid=2), (RayWorkerWrapper pid=3, ip=10.0.0.2), (pid=4)
    r"\(?(?:(?P<name>[A-Za-z_][\w\-]*(?: (?!pid=)[\w\-]+)?)(?: rank=\d+)? )?pid=(?P<pid>\d+)(?:, ip=[\w.:]+)?\)\s*"
)
_RANK = re.compile(  # torch's [rank0]:, torchrun --tee's [default0]:, mpirun's [1,0]<stderr>:
    r"\[(?:rank(?P<rank>\d+)|default\d+)\]:\s*|\[\d+,\d+\]<std(?:out|err)>:\s*"
)
_LOGGER = re.compile(
    rf"(?P<level>{_LEVELS})\s+"
    r"(?:\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\s+)?"  # vLLM: 11-30 01:53:24
    r"(?:\[[^\]\s]+:\d+\]|[\w.\-/]+:\d+\])\s?"  # [core.py:1510] (0.8+) or core.py:1510] (older)
)
_APP_LOGGER = re.compile(
    r"(?:"
    rf"{_DATE} - [\w.]+ - (?P<level>[A-Z]+) - "  # 2024-05-01 10:00:00 - vllm.engine.metrics - INFO - msg
    rf"|{_DATE} - (?P<level2>{_LEVELS}) - "  # 2024-05-01 10:00:00 - INFO - msg
    rf"|{_DATE} \| (?P<level3>{_LEVELS})\s*\| [\w.<>]+:[\w.<>]+:\d+ - "  # loguru
    rf"|{_DATE}\s+(?P<level4>{_LEVELS})\s+[\w.]+:\s"  # 2024-05-01 10:00:00,123 INFO vllm.core.scheduler: msg
    r")"
)
_UVICORN = re.compile(rf"(?P<level>{_LEVELS}):\s+|\[(?P<level2>{_LEVELS})\]\s*")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]")
_INSERTED = re.compile(r"\[address=[^\]]*\]\s*")  # servers that insert [address=…, pid=…]
_SOURCE_LAST = re.compile(r"\s+\((?:[\w./\-]+/)?\w+\.py:\d+\)\s*$")  # wrappers: "msg (scheduler.py:1558)"
_TQDM_HEAD = re.compile(r"(?<!\d)\d+/\d+ \[[^\]]{0,80}\]|it/s\]|s/it\]")  # searched: linear in the line
_JSON_KEYS = ("log", "message", "msg", "MESSAGE")
# Request logging prints what a client sent and what the model wrote (vllm/entrypoints/logger.py):
# "Received request chatcmpl-1: prompt: '...', params: SamplingParams(...), ...", "Request X details:
# prompt: ...", "Generated response X: output: '...', ...", V0's "Added request X.". That text is a
# user's: it is data, never a message, so the line keeps only its head (nobody who can send a
# request can plant a diagnosis by quoting an error in a prompt).
_PAYLOAD_HEAD = re.compile(
    r"(?:Received request|Generated response|Added request|Finished request|Aborted request) [\w\-.:]{1,200}?(?=[:.,]?(?:\s|$))"
    r"|Request [\w\-.:]{1,200}? details(?=:)"
)
_PAYLOAD_DUMP = re.compile(r"params: (?:Sampling|Pooling|BeamSearch)Params\(")  # a request dump without its head
_PAYLOAD_DONE = re.compile(
    r"(?:lora_request|prompt_adapter_request|prompt_embeds shape|num_prompt_tokens|finish_reason): [^,']{0,200}\.?\s*$"
)
PAYLOAD = " [request payload]"  # what is left of a payload line (the engine joins no neighbour to it)
PAYLOAD_OPEN = " [request payload, cut by a wrap]"  # ... that ends mid-dump: the next bare lines are its rest


PAYLOAD_REST_LINES = 200  # a long prompt hard-wrapped by a terminal: at most this many lines of it


def payload_rest(text: str, bare: bool) -> bool | None:
    """For a line after a payload cut by a wrap: True when it is more of the payload (a bare line
    that is not a traceback's), None when it is the payload's last piece, False when the payload is over."""
    if not bare or text.startswith("Traceback (most recent call last)") or text.lstrip().startswith('File "'):
        return False
    return None if _PAYLOAD_DONE.search(text) else True


def _payload(message: str) -> str | None:
    """The head of a request-logging line, its payload dropped; None for any other line."""
    head = _PAYLOAD_HEAD.match(message)
    if head is None:
        dump = _PAYLOAD_DUMP.search(message)
        if dump is None:
            return None
        start = message.find("prompt", 0, dump.start())
        return message[: start if start >= 0 else dump.start()].rstrip(" :,") + PAYLOAD
    rest = message[head.end() :].strip()
    if not rest or rest in (".", ":"):
        return message.rstrip()  # "Added request X." says nothing a user wrote
    return head.group(0) + (PAYLOAD if _PAYLOAD_DONE.search(rest) or message.rstrip().endswith(")") else PAYLOAD_OPEN)


def collector_prefix(text: str) -> str:
    """The log collectors' prefixes (docker, kubectl, CRI, syslog, CI) at the start of a line, as
    they are: a piece of the line cut after a CR is given them back, so it keeps its container."""
    pos = 0
    while (m := _COLLECTOR.match(text, pos)) is not None and m.end() > pos:
        pos = m.end()
    return text[:pos]


def strip_colour(text: str) -> str:
    if "\x1b" in text or "^[" in text or "#0" in text or "\r" in text:
        text = _COLOUR.sub("", text)
    if "m" in text and "[" in text:
        text = _BARE_SGR.sub("", text)
    return text


def _unwrap_json(text: str) -> str:
    """A collector's JSON record ({"log": "...", "stream": ...}) holds the line as a string."""
    try:
        record = json.loads(text)
    except ValueError:
        return text
    if isinstance(record, dict):
        for key in _JSON_KEYS:
            value = record.get(key)
            if isinstance(value, str):
                return strip_colour(value.rstrip("\n"))
            if isinstance(value, dict) and isinstance(value.get("message"), str):  # {"error": {"message": ...}}
                return value["message"]
        error = record.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    return text


def _prefix(text: str, pos: int, level_known: bool):
    m = (
        _PROCESS.match(text, pos)
        or _RANK.match(text, pos)
        or _LOGGER.match(text, pos)
        or _APP_LOGGER.match(text, pos)
        or _COLLECTOR.match(text, pos)
    )
    if m is None and not level_known:
        m = _UVICORN.match(text, pos)
    return m


def parse(raw: str) -> tuple[str, str | None, str | None]:
    """Return (message, process, level) for one colour-stripped line."""
    text = raw
    if text[:1] == "{" and text.rstrip()[-1:] == "}":
        text = _unwrap_json(text.strip())
    if "&" in text and ";" in text:
        import html  # (its entity table is 2 ms of a start; few logs escape their lines)

        text = html.unescape(text)
    if "[repeated" in text:
        text = _RAY_REPEAT.sub("", text)
    if "[address=" in text:
        text = _INSERTED.sub("", text)
    if ".py:" in text and text.rstrip().endswith(")"):
        text = _SOURCE_LAST.sub("", text)
    process = level = None
    # tqdm bars are glued to the next record with no newline between them
    if "%|" in text or "it/s]" in text or "s/it]" in text:
        head = _TQDM_HEAD.search(text)
        if head and _prefix(text, head.end(), False):
            text = text[head.end() :]
    pos = 0
    for _ in range(8):  # prefixes stack; each pass strips one
        stripped = text[pos:]
        if not stripped:
            break
        lead = len(stripped) - len(stripped.lstrip(" \t"))
        m = _prefix(text, pos + lead, level is not None)
        if lead and m is not None and m.re is _COLLECTOR and text[pos + lead] != "|":
            m = None  # only a gutter may follow indentation; "  name | x" is message text
        if m is None or m.end() == pos + lead:
            break  # no prefix here: an indented traceback line keeps its indentation
        groups = m.groupdict()
        if groups.get("name"):
            process = groups["name"].replace(" ", "_")
        elif groups.get("rank") is not None and process is None:
            process = f"rank{groups['rank']}"
        found = next((groups[k] for k in ("level", "level2", "level3", "level4") if groups.get(k)), None)
        if found:
            level = {"WARN": "WARNING", "FATAL": "CRITICAL"}.get(found, found)
        pos = m.end()
    message = text[pos:]
    if "request" in message or "Request" in message or "response" in message or "Params(" in message:
        message = _payload(message) or message
    return message, process, level


# The two forms that make up most of a serving log: uvicorn's access line and vLLM's own logger
# line, with nothing around them. `plain` reads them without parse()'s general path (the bulk of
# a log is read at the speed of one match a line); a line it declines goes through parse().
# Either may follow collector prefixes parse() strips too: docker's or a CRI log file's timestamp
# (`docker logs -t`, /var/log/pods), which the run key leaves out (it differs on every line), and
# a container's name (`kubectl logs --prefix`, docker compose), which it keeps (lines of two
# containers are two processes' even where their pids are the same).
_PLAIN = re.compile(
    rf"(?:{_STAMP}\s+)?(?P<ctr>\[pod/[^\]\s]+\]\s|[A-Za-z][\w.\-]*\s+\|\s)?(?:{_STAMP}\s+)?"  # [pod/a/b], a-1  |
    r"(?:(?P<lead>(?:\((?P<name0>[A-Za-z_][\w\-]*) pid=\d+\) )?INFO:     )(?=\d)"  # uvicorn, behind V1's API
    # server as most V1 servers write it or bare: (APIServer pid=1) INFO:     127.0.0.1:53938 - "POST /v1/... 200 OK
    r"|(?P<lead2>\((?P<name>[A-Za-z_][\w\-]*) pid=\d+\) (?P<level>DEBUG|INFO|WARNING|ERROR)"
    r" )\d\d-\d\d \d\d:\d\d:\d\d [\[][\w.]+:\d+\] (?=\S))"  # (APIServer pid=1) INFO 11-30 01:53:24 [x.py:9] msg
)
_PLAIN_NOT = re.compile(r"[\x00-\x1f\x7f&#^\[{]|%\||it/s\]|s/it\]|\)\s*$")  # what parse() would change


def plain_key(text: str) -> str | None:
    """The run key plain() gives a line it reads, by its first match only (the bulk reader's lines,
    matching/engine.py, are of a plain form: it needs their key, not the rest)."""
    m = _PLAIN.match(text)
    return None if m is None else (m["ctr"] or "") + (m["lead"] or m["lead2"])


def plain(text: str) -> tuple[str, str, str | None, str | None] | None:
    """(run key, message, process, level) of a line in one of the two plain forms, as parse() reads
    it; the run key is the line's prefix before its time (lines that share it come from one process).
    None for any other line."""
    m = _PLAIN.match(text)
    if m is None or _PLAIN_NOT.search(text, m.end()) or _prefix(text, m.end(), True) is not None:
        return None
    message = text[m.end() :]
    if "request" in message or "Request" in message or "response" in message or "Params(" in message:
        message = _payload(message) or message
    key = (m["ctr"] or "") + (m["lead"] or m["lead2"])
    if m["lead"]:
        return key, message, m["name0"], "INFO"
    return key, message, m["name"], m["level"]
