"""Prometheus as the fleet's store: the vLLM series of a time window, read through Prometheus'
documented HTTP API (GET /api/v1/query_range), as one scrape series per replica.

One range query fetches every series this tool reads (`{__name__=~"vllm:(...)"}` and the
operator's label matchers); each step of the answer, per replica (its `instance`, `pod` and
`model_name` labels), is read as the scrape at that time would have been (read/metrics.py's
from_samples, straight from the JSON): the same numbers, the same window maths (read/window.py),
the same rules. A `--selector` is parsed as a label matcher set and written again with every value
quoted; user text never reaches PromQL unparsed.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from typing import Any

from vllm_doctor.errors import DoctorError, in_range
from vllm_doctor.read import metrics
from vllm_doctor.read.httpget import Deadline, opener

REPLICA_LABELS = ("instance", "pod", "model_name")
MAX_POINTS = 240  # steps per window: the step grows with the window
MIN_STEP = 1.0
TIMEOUT = 30.0
MAX_BYTES = 256 << 20
_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_MATCHER = re.compile(rf'\s*({_NAME})\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_DURATION = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_WINDOW = 100 * 365 * 86400  # seconds of --since
MAX_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: --start and --end within the unix times there are


class PromError(DoctorError):
    """Prometheus cannot be asked or its answer read; one line for the user."""


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), value)


def _quote(value: str) -> str:
    """A PromQL string literal: backslashes, quotes and newlines escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def parse_selector(text: str | None) -> list[tuple[str, str, str]]:
    """`{namespace="llm", pod=~"vllm-.*"}` as (label, operator, value) triples; anything else refused."""
    if not text or not text.strip():
        return []
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise PromError(f"--selector {text!r}: give label matchers in braces, e.g. '{{namespace=\"llm\"}}'")
    body, out, pos = body[1:-1].strip(), [], 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        if not m or m.end() == pos:
            raise PromError(f'--selector {text!r}: not a label matcher at {body[pos:][:40]!r} (label="value")')
        if m[1] == "__name__":
            raise PromError(f"--selector {text!r}: the metric names are the doctor's; match labels only")
        out.append((m[1], m[2], _unescape(m[3])))
        pos = m.end()
    return out


def promql(selector: list[tuple[str, str, str]]) -> str:
    """The one query: every vLLM series the doctor reads, under the operator's matchers."""
    names = sorted({n.removeprefix("vllm:") for n in metrics.WANTED})
    name_re = "vllm:(" + "|".join(re.escape(n) for n in names) + ")"
    matchers = [f"__name__=~{_quote(name_re)}"] + [f"{k}{op}{_quote(v)}" for k, op, v in selector]
    return "{" + ", ".join(matchers) + "}"


def parse_time(text: str) -> float:
    """A unix timestamp or an RFC 3339 time (2026-12-01T10:00:00Z)."""
    from datetime import datetime

    try:
        when = float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise PromError(f"{text!r}: give a unix time or an RFC 3339 time (2026-12-01T10:00:00Z)") from None
    return float(in_range(when, "the time", 0, MAX_TIME, error=PromError))  # nan, inf: not int()'s crash


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `1h`, `1h30m`, `2d`."""
    parts = _DURATION.findall(text) if len(text) <= 64 else []  # 10**5000s: past int()'s digit limit
    if not parts or "".join(a + b for a, b in parts) != text.strip():
        shown = text if len(text) <= 64 else f"{text[:24]}...({len(text):,} characters)"
        raise PromError(f"--since {shown!r}: give a duration such as 30m, 1h or 2d")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds > MAX_WINDOW:
        raise PromError(
            f"--since {text}: longer than {MAX_WINDOW // 86400 // 365} years, past any Prometheus' retention"
        )
    return float(seconds)


def window_times(
    since: str | None, start: str | None, end: str | None, now: float | None = None
) -> tuple[float, float]:
    """The window [start, end] from --since or --start/--end (default: the last hour)."""
    if since and (start or end):
        raise PromError("give --since or --start/--end, not both")
    stop = parse_time(end) if end else (now if now is not None else time.time())
    begin = parse_time(start) if start else stop - parse_duration(since or "1h")
    if begin >= stop:
        raise PromError("the window's start is not before its end")
    return begin, stop


def query_range(url: str, query: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """GET /api/v1/query_range; the matrix of its answer."""
    import urllib.error
    from urllib.parse import urlencode

    base = url.rstrip("/")
    full = f"{base}/api/v1/query_range?" + urlencode({"query": query, "start": start, "end": end, "step": step})
    deadline = Deadline(TIMEOUT)
    try:
        with opener(full, deadline, PromError).open(full, timeout=TIMEOUT) as r:
            body = r.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as e:
        detail = _error_of(e.read(4096))
        raise PromError(f"{base}: HTTP {e.code} {e.reason}{': ' + detail if detail else ''}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PromError(f"{base}: cannot connect ({getattr(e, 'reason', None) or e})") from None
    finally:
        deadline.cancel()
    if deadline.expired:
        raise PromError(f"{base}: no complete answer within {TIMEOUT:g} s")
    if len(body) > MAX_BYTES:
        raise PromError(f"{base}: an answer over {MAX_BYTES >> 20} MB; narrow the window or the selector")
    try:
        doc = json.loads(body)
    except ValueError:
        raise PromError(f"{base}: the answer is not JSON; is this a Prometheus server?") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise PromError(f"{base}: the query failed ({_error_of(body) or 'no status'})")
    data = doc.get("data") or {}
    if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
        raise PromError(f"{base}: not a range-query answer")
    return data["result"]


def _error_of(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    return str(doc.get("error", ""))[:200] if isinstance(doc, dict) else ""


def _replica_key(labels: dict[str, str]) -> str:
    """A replica by its instance and pod; by model_name where neither is there (a series such as
    cache_config_info carries no model_name, so the model cannot split an instance)."""
    keys = [k for k in REPLICA_LABELS[:2] if labels.get(k)] or [k for k in REPLICA_LABELS[2:] if labels.get(k)]
    return " ".join(f"{k}={labels[k]}" for k in keys) or "prometheus"


def replicas(result: list[dict[str, Any]]) -> dict[str, list[metrics.Scrape]]:
    """Each replica's samples, step by step, as the scrapes that would have given them."""
    samples: dict[str, dict[float, list[tuple[str, dict[str, str], float]]]] = defaultdict(lambda: defaultdict(list))
    for series in result:
        labels = dict(series.get("metric") or {})
        name = str(labels.pop("__name__", ""))
        key = _replica_key(labels)
        kept = {str(k): str(v) for k, v in sorted(labels.items()) if k != "job"}
        for ts, value in series.get("values") or []:
            samples[key][float(ts)].append((name, kept, _value(value)))
    out: dict[str, list[metrics.Scrape]] = {}
    for key, steps in sorted(samples.items()):
        out[key] = [metrics.from_samples(body, key, at=ts) for ts, body in sorted(steps.items())]
    return out


def _value(value: Any) -> float:
    """A sample's value as the API writes it ("1.5", "NaN", "+Inf")."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PromError(f"Prometheus answered a sample value that is no number: {str(value)[:40]!r}") from None


def fetch(url: str, start: float, end: float, selector: str | None = None) -> dict[str, list[metrics.Scrape]]:
    """The window's scrape series per replica, from Prometheus at `url`."""
    step = max(MIN_STEP, round((end - start) / MAX_POINTS))
    result = query_range(url, promql(parse_selector(selector)), start, end, step)
    found = replicas(result)
    if not found:
        raise PromError(f"{url}: no vllm:* series in this window (and selector); is Prometheus scraping vLLM?")
    return found
