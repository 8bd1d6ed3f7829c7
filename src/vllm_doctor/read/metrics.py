"""Read a running server's Prometheus endpoint (`GET /metrics`, or a saved scrape) into facts.

One scrape or a series of them becomes the same stats series the log's periodic stats lines fill
(facts.StatsSeries); pipeline.from_metrics then runs the same rules: the queue_kind check tells a full KV cache from
the sequence cap and from a stall whether the numbers came from a log or from /metrics.

The exposition is parsed with prometheus_client's parser, imported only here. Names follow
shared/vllm-reference/metrics.md: KV usage is `vllm:kv_cache_usage_perc` (V1 0.9.2+) or
`vllm:gpu_cache_usage_perc` (V0, V1 up to 0.11), a fraction 0-1; counters are exposed with `_total`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_doctor.errors import DoctorError
from vllm_doctor.knowledge.facts import Facts

KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
QUEUE_TIME = "vllm:request_queue_time_seconds"
DEFAULT_TIMEOUT = 10.0


class MetricsError(DoctorError):
    """A scrape that cannot be had or read; the message is one line for the user."""


@dataclass
class Histogram:
    count: float = 0.0
    sum: float = 0.0
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (le, cumulative count)

    def quantile_le(self, q: float) -> float | None:
        """The smallest bucket bound at or under which a q share of the observations fell."""
        if self.count <= 0:
            return None
        want = q * self.count
        for le, cumulative in sorted(self.buckets):
            if cumulative >= want:
                return le
        return None

    def minus(self, earlier: Histogram | None) -> Histogram:
        """The observations made since an earlier scrape (the whole thing after a reset)."""
        if earlier is None or earlier.count > self.count:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            self.count - earlier.count,
            self.sum - earlier.sum,
            [(le, c - before.get(le, 0.0)) for le, c in self.buckets],
        )

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": int(self.count)}
        if self.count > 0:
            out["mean_s"] = round(self.sum / self.count, 3)
            for q in (0.5, 0.9, 0.99):
                le = self.quantile_le(q)
                out[f"p{int(q * 100)}_le_s"] = None if le is None or le == float("inf") else le
        return out


@dataclass
class Scrape:
    """The numbers of one /metrics exposition that tell how the queue and the cache are doing."""

    source: str
    at: float  # time.monotonic() when it was read
    lines: int = 0
    vllm_series: int = 0  # vllm:* samples seen; 0 means this is not a vLLM server
    running: float | None = None
    waiting: float | None = None
    waiting_by_reason: dict[str, float] = field(default_factory=dict)
    swapped: float | None = None
    kv_usage: float | None = None  # fraction 0-1, the highest over engines
    kv_metric: str | None = None
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    queue_time: Histogram | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    engines: set[str] = field(default_factory=set)

    @property
    def kv_usage_pct(self) -> float | None:
        return None if self.kv_usage is None else round(self.kv_usage * 100, 1)


def _add(a: float | None, b: float) -> float:
    return b if a is None else a + b


def parse(text: str, source: str = "", at: float | None = None) -> Scrape:
    """Read the vLLM numbers out of a Prometheus text exposition."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise MetricsError(f"prometheus_client is not installed ({e})") from None
    s = Scrape(source=source, at=time.monotonic() if at is None else at, lines=text.count("\n"))
    kv: dict[str, float] = {}
    buckets: dict[float, float] = {}
    hist = Histogram()
    have_hist = False
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name, labels, value = sample.name, sample.labels, float(sample.value)
                if not name.startswith("vllm:"):
                    continue
                s.vllm_series += 1
                if "engine" in labels:
                    s.engines.add(labels["engine"])
                if labels.get("model_name") and s.model is None:
                    s.model = labels["model_name"]
                if name == "vllm:num_requests_running":
                    s.running = _add(s.running, value)
                elif name == "vllm:num_requests_waiting":
                    s.waiting = _add(s.waiting, value)
                elif name == "vllm:num_requests_waiting_by_reason":
                    reason = labels.get("reason", "unknown")
                    s.waiting_by_reason[reason] = s.waiting_by_reason.get(reason, 0.0) + value
                elif name == "vllm:num_requests_swapped":
                    s.swapped = _add(s.swapped, value)
                elif name in KV_NAMES:
                    kv[name] = max(kv.get(name, 0.0), value)
                elif name == "vllm:num_preemptions_total":
                    s.preemptions_total = _add(s.preemptions_total, value)
                elif name == "vllm:prompt_tokens_total":
                    s.prompt_tokens_total = _add(s.prompt_tokens_total, value)
                elif name == "vllm:generation_tokens_total":
                    s.generation_tokens_total = _add(s.generation_tokens_total, value)
                elif name == QUEUE_TIME + "_bucket":
                    le = float(labels.get("le", "inf").replace("+Inf", "inf"))
                    buckets[le] = buckets.get(le, 0.0) + value
                    have_hist = True
                elif name == QUEUE_TIME + "_count":
                    hist.count += value
                    have_hist = True
                elif name == QUEUE_TIME + "_sum":
                    hist.sum += value
                elif name == "vllm:cache_config_info" and not s.cache_config:
                    s.cache_config = {k: v for k, v in labels.items() if k not in ("engine", "model_name")}
    except ValueError as e:
        raise MetricsError(f"{source or 'metrics'}: not a Prometheus text exposition ({e})") from None
    for name in KV_NAMES:  # the current name first; V0 and older V1 have only the old one
        if name in kv:
            s.kv_usage, s.kv_metric = kv[name], name
            break
    if have_hist:
        hist.buckets = sorted(buckets.items())
        s.queue_time = hist
    return s


def metrics_url(url: str) -> str:
    """A server address as its /metrics URL (`http://host:8000` -> `http://host:8000/metrics`)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urlunsplit(parts)


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def fetch(source: str, timeout: float = DEFAULT_TIMEOUT) -> Scrape:
    """One scrape of a URL, or a saved exposition when `source` is a file path."""
    if not is_url(source):
        try:
            text = Path(source).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise MetricsError(f"{source}: cannot read ({e.strerror or e})") from None
        return parse(text, source)
    import http.client
    import urllib.error
    import urllib.request

    url = metrics_url(source)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - the operator's own server
            text = r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        raise MetricsError(f"{url}: HTTP {e.code} {e.reason}") from None
    except http.client.HTTPException as e:  # a server that breaks HTTP: no status line, a short body, ...
        detail = " ".join(str(e).split())[:120]  # BadStatusLine holds the line it got, newline and all
        raise MetricsError(f"{url}: not a valid HTTP response ({type(e).__name__}: {detail})") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise MetricsError(f"{url}: cannot connect ({reason})") from None
    return parse(text, url)


def sample(cur: Scrape, prev: Scrape | None = None) -> dict[str, Any]:
    """A scrape as one sample of the stats series, the fields a stats line would give."""
    out: dict[str, Any] = {}
    if cur.running is not None:
        out["running"] = int(cur.running)
    if cur.waiting is not None:
        out["waiting"] = int(cur.waiting)
    if cur.swapped is not None:
        out["swapped"] = int(cur.swapped)
    if "deferred" in cur.waiting_by_reason:
        out["deferred"] = int(cur.waiting_by_reason["deferred"])
    if cur.kv_usage_pct is not None:
        out["kv_usage_pct"] = cur.kv_usage_pct
    if cur.preemptions_total is not None:
        before = prev.preemptions_total if prev is not None else None
        if before is None or before > cur.preemptions_total:  # first scrape, or a restart
            out["preemptions"] = int(cur.preemptions_total)
        else:
            out["preemptions"] = int(cur.preemptions_total - before)
    if prev is not None and cur.at > prev.at:
        dt = cur.at - prev.at
        for key, attr in (("prompt_tps", "prompt_tokens_total"), ("gen_tps", "generation_tokens_total")):
            a, b = getattr(prev, attr), getattr(cur, attr)
            if a is not None and b is not None and b >= a:
                out[key] = round((b - a) / dt, 1)
    return out


def describe(cur: Scrape, index: int, prev: Scrape | None = None) -> str:
    """One line for a scrape, as evidence and for `watch`."""
    parts = [f"scrape {index}:"]
    if cur.running is not None:
        parts.append(f"running {int(cur.running)},")
    if cur.waiting is not None:
        reasons = ", ".join(f"{k} {int(v)}" for k, v in sorted(cur.waiting_by_reason.items()) if v)
        parts.append(f"waiting {int(cur.waiting)}" + (f" ({reasons})," if reasons else ","))
    if cur.kv_usage_pct is not None:
        parts.append(f"KV cache {cur.kv_usage_pct}% ({cur.kv_metric}),")
    s = sample(cur, prev)
    if "preemptions" in s:
        parts.append(f"preemptions {'+' if prev else ''}{s['preemptions']},")
    if "gen_tps" in s:
        parts.append(f"generation {s['gen_tps']} tokens/s,")
    if cur.queue_time is not None and cur.queue_time.count:
        parts.append(
            f"queue time mean {cur.queue_time.sum / cur.queue_time.count:.2f} s over {int(cur.queue_time.count)},"
        )
    return " ".join(parts).rstrip(",")


def _facts_from_config(facts: Facts, scrape: Scrape) -> None:
    cfg = scrape.cache_config
    if scrape.model:
        facts.set("model", scrape.model)
    for label, name in (
        ("block_size", "kv_cache.block_size"),
        ("num_gpu_blocks", "kv_cache.gpu_blocks"),
        ("num_cpu_blocks", "kv_cache.cpu_blocks"),
        ("kv_cache_size_tokens", "kv_cache.tokens"),
        ("gpu_memory_utilization", "gpu_memory_utilization"),
        ("cache_dtype", "kv_cache_dtype"),
        ("enable_prefix_caching", "enable_prefix_caching"),
    ):
        if cfg.get(label) not in (None, "None", ""):
            facts.set(name, cfg[label])


def to_facts(scrapes: list[Scrape]) -> Facts:
    """The facts of a scrape series: each scrape one stats sample, the last one's cache config."""
    facts = Facts()
    prev = None
    for i, cur in enumerate(scrapes, 1):
        if cur.running is not None or cur.waiting is not None:
            facts.stats.add(sample(cur, prev), i, 0, describe(cur, i, prev))
        prev = cur
    _facts_from_config(facts, scrapes[-1])
    if facts.get("kv_cache.tokens") is not None:
        facts.set("kv_cache.tokens_from", "metrics")
    return facts


def warnings(last: Scrape) -> list[str]:
    """What the report should say about an exposition that is not (all) vLLM's."""
    if not last.vllm_series:
        return [f"{last.source}: no vllm:* metrics in this exposition; is it a vLLM server?"]
    if last.kv_usage is None:
        return [f"{last.source}: neither {' nor '.join(KV_NAMES)} is exposed"]
    return []


def summary(scrapes: list[Scrape]) -> dict[str, Any]:
    """facts.metrics of the report: the last scrape's numbers and what changed over the series."""
    first, last = scrapes[0], scrapes[-1]
    out: dict[str, Any] = {
        "scrapes": len(scrapes),
        "running": last.running,
        "waiting": last.waiting,
        "waiting_by_reason": dict(sorted(last.waiting_by_reason.items())) or None,
        "kv_usage_pct": last.kv_usage_pct,
        "kv_usage_metric": last.kv_metric,
        "preemptions_total": last.preemptions_total,
        "engines": len(last.engines) or None,
        "queue_time": last.queue_time.summary() if last.queue_time is not None else None,
    }
    if len(scrapes) > 1:
        out["seconds"] = round(last.at - first.at, 1)
        if last.queue_time is not None:
            out["queue_time_during"] = last.queue_time.minus(first.queue_time).summary()
    return out
