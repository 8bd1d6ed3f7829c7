"""Prometheus as the fleet's store: the vLLM series of a time window, read through Prometheus'
documented HTTP API (GET /api/v1/query_range), as one scrape series per replica.

One range query fetches every series this tool reads (`{__name__=~"vllm:(...)"}` and the
operator's label matchers); each step of the answer, per replica (its `instance`, `pod` and
`model_name` labels), is read as the scrape at that time would have been (read/metrics.py's
from_samples, straight from the JSON): the same numbers, the same window maths (read/window.py),
the same rules. A `--selector` is parsed as a label matcher set and written again with every value
quoted; user text never reaches PromQL unparsed.

The answer is bounded as a scrape is (read/metrics.py): it streams in and is read a series at a
time (read/jsonstream.py), at most MAX_BYTES (over it: one line, exit 2); each series goes into its
steps' scrapes as it is read, within MAX_SERIES, MAX_REPLICAS, MAX_STEPS and MAX_SAMPLES (past
them the rest is not read, and the report notes it); a point that is not [time, value] with a
finite time is one line.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from vllm_doctor.errors import DoctorError, in_range
from vllm_doctor.read import metrics
from vllm_doctor.read.httpget import Deadline, masked, opener
from vllm_doctor.read.jsonstream import Reader

REPLICA_LABELS = ("instance", "pod", "model_name")
MAX_POINTS = 240  # steps per window: the step grows with the window
MIN_STEP = 1.0
TIMEOUT = 30.0
# an answer is bounded as a scrape is (read/metrics.py): its bytes, and what is kept of it
MAX_BYTES = metrics.MAX_BYTES  # over it: one line, exit 2
MAX_SERIES_BYTES = 4 << 20  # one series' JSON (240 points are a few KiB)
MAX_SERIES = 20_000  # a replica has a few hundred (histogram buckets); more are cut, with a note
MAX_REPLICAS = 64
MAX_STEPS = 2 * MAX_POINTS + 1  # a short window's rounded step gives up to 1.5 x MAX_POINTS
MAX_SAMPLES = 500_000  # points in all (about 5 s of reading them)
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


def query_range(url: str, query: str, start: float, end: float, step: float, notes: list[str] | None = None):
    """GET /api/v1/query_range; its answer read as it arrives, a series at a time (replicas)."""
    import http.client
    import urllib.error
    from urllib.parse import urlencode

    base = url.rstrip("/")
    full = f"{base}/api/v1/query_range?" + urlencode({"query": query, "start": start, "end": end, "step": step})
    deadline = Deadline(TIMEOUT)
    try:
        with opener(full, deadline, PromError).open(full, timeout=TIMEOUT) as r:
            return replicas(_series(Reader(r, base, PromError, MAX_BYTES, MAX_SERIES_BYTES)), notes)
    except PromError:
        if deadline.expired:  # the sockets were shut at the deadline: what came is not the answer
            raise PromError(f"{base}: no complete answer within {TIMEOUT:g} s") from None
        raise
    except urllib.error.HTTPError as e:
        detail = _error_of(e.read(4096))
        raise PromError(f"{base}: HTTP {e.code} {e.reason}{': ' + detail if detail else ''}") from None
    except http.client.HTTPException as e:  # a short body, a broken status line
        raise PromError(f"{base}: not a valid HTTP response ({type(e).__name__})") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        if deadline.expired:
            raise PromError(f"{base}: no complete answer within {TIMEOUT:g} s") from None
        raise PromError(f"{base}: cannot connect ({getattr(e, 'reason', None) or e})") from None
    finally:
        deadline.cancel()


def _series(doc: Reader) -> Iterator[Any]:
    """The series of a range-query answer, one at a time; its status and resultType checked too."""
    seen: dict[str, Any] = {}
    for key in doc.members():
        if key == "data" and doc.peek() == "{":
            for inner in doc.members():
                if inner == "result" and doc.peek() == "[" and seen.get("resultType") == "matrix":
                    seen["result"] = True
                    for _ in doc.items():
                        yield doc.value()
                else:
                    seen[inner] = doc.value()
        else:
            seen[key] = doc.value()
    if seen.get("status") != "success":
        error = seen.get("error")
        raise PromError(f"{doc.name}: the query failed ({str(error)[:200] if error else 'no status'})")
    if seen.get("result") is not True:  # a vector, a scalar, or no result read as a matrix's
        raise PromError(f"{doc.name}: not a range-query answer")


def _error_of(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    return str(doc.get("error", ""))[:200] if isinstance(doc, dict) else ""


def _replica_key(labels: dict[str, str]) -> str:
    """A replica by its instance and pod; by model_name where neither is there (a series such as
    cache_config_info carries no model_name, so the model cannot split an instance)."""
    keys = [k for k in REPLICA_LABELS[:2] if labels.get(k)] or [k for k in REPLICA_LABELS[2:] if labels.get(k)]
    return " ".join(f"{k}={labels[k]}" for k in keys) or "prometheus"


def replicas(result: Iterable[Any], notes: list[str] | None = None) -> dict[str, list[metrics.Scrape]]:
    """Each replica's samples, step by step, as the scrapes that would have given them: each series
    added to its steps' scrapes as it is read, within MAX_SERIES, MAX_REPLICAS, MAX_STEPS steps a
    replica and MAX_SAMPLES points in all; past a bound the rest is not read, and `notes` says so."""
    steps: dict[str, dict[float, Any]] = {}
    cut = {"series": 0, "samples": 0, "replicas": 0, "points": 0}
    points = 0
    for n, series in enumerate(result):
        if n >= MAX_SERIES or points >= MAX_SAMPLES:
            cut["series" if n >= MAX_SERIES else "samples"] += 1
            break
        labels, values = _shape(series)
        name = labels.pop("__name__", "")
        key = _replica_key(labels)
        if key not in steps and len(steps) >= MAX_REPLICAS:
            cut["replicas"] += 1
            continue
        kept = {k: v for k, v in sorted(labels.items()) if k != "job"}
        mine = steps.setdefault(key, {})
        for point in values:
            ts, value = _point(point)
            if points >= MAX_SAMPLES:
                cut["samples"] += 1
                break
            scrape = mine.get(ts)
            if scrape is None:
                if len(mine) >= MAX_STEPS:
                    cut["points"] += 1
                    continue
                scrape = mine[ts] = metrics.builder(key, at=ts)
            scrape.add(name, kept, value)
            points += 1
    if notes is not None:
        notes += _cut_notes(cut)
    return {key: [mine[ts].finish() for ts in sorted(mine)] for key, mine in sorted(steps.items()) if mine}


def _cut_notes(cut: dict[str, int]) -> list[str]:
    out = []
    if cut["series"]:
        out.append(f"Prometheus answered more than {MAX_SERIES:,} series; the rest not read")
    if cut["samples"]:
        out.append(f"Prometheus answered more than {MAX_SAMPLES:,} points; the rest not read")
    if cut["replicas"]:
        out.append(f"more than {MAX_REPLICAS} replicas; {cut['replicas']:,} series of the others not read")
    if cut["points"]:
        out.append(f"more than {MAX_STEPS} steps a replica; {cut['points']:,} points not read")
    return [n + " (narrow the window or the selector)" for n in out]


def _shape(series: Any) -> tuple[dict[str, str], list]:
    """A series' labels and points, or one line saying the answer is not a range query's."""
    metric = series.get("metric") if isinstance(series, dict) else None
    values = series.get("values") if isinstance(series, dict) else None
    if not isinstance(metric, dict) or not isinstance(values, list):
        raise PromError("Prometheus answered a series that is not {metric, values}: not a range-query answer")
    return {str(k): str(v)[:500] for k, v in metric.items()}, values


def _point(point: Any) -> tuple[float, float]:
    """One [time, "value"] pair; a time that is no finite number, or another arity, is refused."""
    if not isinstance(point, list) or len(point) != 2:
        raise PromError(f"Prometheus answered a sample that is not [time, value]: {str(point)[:40]!r}")
    ts = point[0]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise PromError(f"Prometheus answered a sample time that is no time: {str(ts)[:40]!r}")
    return float(ts), _value(point[1])


def _value(value: Any) -> float:
    """A sample's value as the API writes it ("1.5", "NaN", "+Inf")."""
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise PromError(f"Prometheus answered a sample value that is no number: {str(value)[:40]!r}") from None


def fetch(
    url: str, start: float, end: float, selector: str | None = None, notes: list[str] | None = None
) -> dict[str, list[metrics.Scrape]]:
    """The window's scrape series per replica, from Prometheus at `url`; `notes` gets what was cut;
    an error says the URL without its password or secret query values."""
    try:
        return _fetch(url, start, end, selector, notes)
    except PromError as e:
        raise PromError(masked(str(e), url)) from None


def _fetch(
    url: str, start: float, end: float, selector: str | None, notes: list[str] | None
) -> dict[str, list[metrics.Scrape]]:
    step = max(MIN_STEP, round((end - start) / MAX_POINTS))
    found = query_range(url, promql(parse_selector(selector)), start, end, step, notes)
    if not found:
        raise PromError(f"{url}: no vllm:* series in this window (and selector); is Prometheus scraping vLLM?")
    return found
