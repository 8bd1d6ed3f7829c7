"""Read a running server's Prometheus endpoint (`GET /metrics`, or a saved scrape) into facts.

One scrape or a series of them becomes the same stats series the log's periodic stats lines fill
(facts.StatsSeries); pipeline.from_metrics then runs the same rules: the queue_kind check tells a full KV cache from
the sequence cap and from a stall whether the numbers came from a log or from /metrics.

The exposition is parsed with prometheus_client's parser, imported only here. Names follow
shared/vllm-reference/metrics.md: KV usage is `vllm:kv_cache_usage_perc` (V1 0.9.2+) or
`vllm:gpu_cache_usage_perc` (V0, V1 up to 0.11), a fraction 0-1; counters are exposed with `_total`.

Bounded whatever the server sends: the body streams in pieces (at most MAX_BYTES in all, no
line over MAX_LINE), only the samples this module reads go to the parser (MAX_SAMPLES at most;
the first VALIDATE lines go too, so that a page that is not an exposition is still refused),
a URL gets `timeout` seconds in all (connect, headers, body: a server dripping a byte at a
time is cut off), and a redirect is followed only to the same scheme, host and port. A value
that is NaN, infinite or negative is read as missing, with a warning.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from vllm_doctor.errors import DoctorError
from vllm_doctor.facts import Facts
from vllm_doctor.read import histogram
from vllm_doctor.read.histogram import Histogram
from vllm_doctor.read.httpget import Deadline, masked, opener
from vllm_doctor.read.window import MIN_SECONDS, window

KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
DEFAULT_TIMEOUT = 10.0  # seconds for a whole scrape
MAX_BYTES = 64 << 20  # a vLLM exposition is tens of KiB
MAX_LINE = 1 << 20
MAX_SAMPLES = 100_000  # samples of the names read here; more are not read
VALIDATE = 1000  # lines parsed whatever they hold
MAX_KEYS = 64  # engines and waiting reasons kept
WANTED = frozenset(
    (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting_by_reason",
        "vllm:num_requests_swapped",
        *KV_NAMES,
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:cache_config_info",
        *histogram.NAMES,
    )
)


def _number(value: float | int) -> float:
    """A sample's value as a float; an integer past any float (the parser reads "9" * 500 as one)
    is infinite, which _sample reads as missing, as it reads inf."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


class MetricsError(DoctorError):
    """A scrape that cannot be had or read; the message is one line for the user."""


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
    hists: dict[str, Histogram] = field(default_factory=dict)  # histogram.HISTOGRAMS keys: itl, ttft, queue, ...
    counters: dict[str, float] = field(default_factory=dict)  # histogram.COUNTERS keys, finished:<reason>
    cache_config: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    engines: set[str] = field(default_factory=set)
    bad_values: dict[str, str] = field(default_factory=dict)  # name -> a value read as missing
    skipped: int = 0  # samples past MAX_SAMPLES, not read

    @property
    def queue_time(self) -> Histogram | None:
        return self.hists.get("queue")

    @property
    def kv_usage_pct(self) -> float | None:
        return None if self.kv_usage is None else round(self.kv_usage * 100, 1)


def _add(a: float | None, b: float) -> float:
    return b if a is None else a + b


def parse(text: str, source: str = "", at: float | None = None) -> Scrape:
    """Read the vLLM numbers out of a Prometheus text exposition."""
    return parse_chunks([text], source, at)


def parse_chunks(chunks: Iterable[str | bytes], source: str = "", at: float | None = None) -> Scrape:
    """The same, from the exposition in pieces (a streamed body): memory stays flat."""
    p = _Parser(Scrape(source=source, at=time.monotonic() if at is None else at))
    for chunk in chunks:
        p.feed(chunk.encode("utf-8", "replace") if isinstance(chunk, str) else chunk)
    return p.finish()


def from_samples(
    samples: Iterable[tuple[str, dict[str, str], float]], source: str = "", at: float | None = None
) -> Scrape:
    """The same, from samples read already: (name, labels, value), as Prometheus' query API gives them."""
    p = builder(source, at)
    for name, labels, value in samples:
        p.add(name, labels, value)
    return p.finish()


def builder(source: str = "", at: float | None = None) -> _Parser:
    """A scrape filled a sample at a time (add(name, labels, value), then finish()): Prometheus'
    answer, read one series at a time, adds each point to the scrape of its step (read/prom.py)."""
    return _Parser(Scrape(source=source, at=time.monotonic() if at is None else at))


class _Parser:
    def __init__(self, scrape: Scrape):
        self.s = scrape
        self.kv: dict[str, float] = {}
        self.collect = histogram.Collector()
        self.partial = b""
        self.batch: list[str] = []
        self.wanted = 0

    def feed(self, data: bytes) -> None:
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        if len(self.partial) > MAX_LINE:
            raise MetricsError(
                f"{self.s.source or 'metrics'}: a line longer than {MAX_LINE >> 20} MiB; not an exposition"
            )
        for line in data[:cut].split(b"\n")[:-1]:
            self._line(line)

    def _line(self, line: bytes) -> None:
        s = self.s
        s.lines += 1
        name = line.split(b"{", 1)[0].split(None, 1)[0] if line.startswith(b"vllm:") else b""
        if name:
            s.vllm_series += 1
        if name.decode("utf-8", "replace") in WANTED:
            self.wanted += 1
            if self.wanted > MAX_SAMPLES:
                s.skipped += 1
                return
        elif s.lines > VALIDATE:
            return
        self.batch.append(line.decode("utf-8", "replace"))
        if len(self.batch) >= 4096:
            self._parse()

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        """One sample read already, counted and bounded as its line of an exposition would be."""
        s = self.s
        s.lines += 1
        if name.startswith("vllm:"):
            s.vllm_series += 1
        if name in WANTED:
            self.wanted += 1
            if self.wanted > MAX_SAMPLES:
                s.skipped += 1
                return
            self._sample(name, labels, value)

    def finish(self) -> Scrape:
        if self.partial:
            self._line(self.partial)
            self.partial = b""
        self._parse()
        s = self.s
        for name in KV_NAMES:  # the current name first; V0 and older V1 have only the old one
            if name in self.kv:
                s.kv_usage, s.kv_metric = self.kv[name], name
                break
        s.hists, s.counters = self.collect.finish()
        return s

    def _parse(self) -> None:
        if not self.batch:
            return
        try:
            from prometheus_client.parser import text_string_to_metric_families
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise MetricsError(f"prometheus_client is not installed ({e})") from None
        text = "\n".join(self.batch) + "\n"
        self.batch = []
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name.startswith("vllm:"):
                        self._sample(sample.name, sample.labels, _number(sample.value))
        except ValueError as e:
            raise MetricsError(f"{self.s.source or 'metrics'}: not a Prometheus text exposition ({e})") from None

    def _sample(self, name: str, labels: dict[str, str], value: float) -> None:
        s = self.s
        if name not in WANTED:
            return
        if not math.isfinite(value) or value < 0:  # no count, usage or total is; read as missing
            if len(s.bad_values) < MAX_KEYS:
                s.bad_values.setdefault(name, str(value))
            return
        if "engine" in labels and len(s.engines) < MAX_KEYS:
            s.engines.add(labels["engine"])
        if labels.get("model_name") and s.model is None:
            s.model = labels["model_name"][:500]
        if name == "vllm:num_requests_running":
            s.running = _add(s.running, value)
        elif name == "vllm:num_requests_waiting":
            s.waiting = _add(s.waiting, value)
        elif name == "vllm:num_requests_waiting_by_reason":
            reason = labels.get("reason", "unknown")
            if reason in s.waiting_by_reason or len(s.waiting_by_reason) < MAX_KEYS:
                s.waiting_by_reason[reason] = s.waiting_by_reason.get(reason, 0.0) + value
        elif name == "vllm:num_requests_swapped":
            s.swapped = _add(s.swapped, value)
        elif name in KV_NAMES:
            self.kv[name] = max(self.kv.get(name, 0.0), value)
        elif name == "vllm:num_preemptions_total":
            s.preemptions_total = _add(s.preemptions_total, value)
        elif name == "vllm:prompt_tokens_total":
            s.prompt_tokens_total = _add(s.prompt_tokens_total, value)
        elif name == "vllm:generation_tokens_total":
            s.generation_tokens_total = _add(s.generation_tokens_total, value)
        elif name in histogram.NAMES:
            self.collect.add(name, labels, value)
        elif name == "vllm:cache_config_info" and not s.cache_config:
            s.cache_config = {
                k: v[:500] for k, v in list(labels.items())[:MAX_KEYS] if k not in ("engine", "model_name")
            }


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
    """One scrape of a URL, or a saved exposition when `source` is a file path; at most
    MAX_BYTES, and for a URL `timeout` seconds in all. An error says a URL without its password
    or secret query values."""
    try:
        return _fetch(source, timeout)
    except MetricsError as e:
        raise MetricsError(masked(str(e), source)) from None


def _fetch(source: str, timeout: float) -> Scrape:
    if not is_url(source):
        try:
            with open(source, "rb") as f:
                return _stream(f, source)
        except OSError as e:
            raise MetricsError(f"{source}: cannot read ({e.strerror or e})") from None
    import http.client
    import urllib.error

    url = metrics_url(source)
    deadline = Deadline(timeout)
    try:
        with opener(url, deadline, MetricsError).open(url, timeout=timeout) as r:
            scrape = _stream(r, url)
    except urllib.error.HTTPError as e:
        raise MetricsError(f"{url}: HTTP {e.code} {e.reason}") from None
    except http.client.HTTPException as e:  # a server that breaks HTTP: no status line, a short body, ...
        detail = " ".join(str(e).split())[:120]  # BadStatusLine holds the line it got, newline and all
        raise MetricsError(f"{url}: not a valid HTTP response ({type(e).__name__}: {detail})") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise MetricsError(f"{url}: cannot connect ({reason})") from None
    finally:
        deadline.cancel()
        if deadline.expired:  # the sockets were shut at the deadline: whatever came is not the page
            raise MetricsError(f"{url}: no complete answer within {timeout:g} s") from None
    return scrape


def _stream(f: BinaryIO, source: str) -> Scrape:
    """Parse a body as it arrives, refusing one larger than MAX_BYTES."""

    def chunks():
        total = 0
        read = getattr(f, "read1", f.read)
        while data := read(1 << 20):
            total += len(data)
            if total > MAX_BYTES:
                raise MetricsError(f"{source}: more than {MAX_BYTES >> 20} MB; not a /metrics page")
            yield data
        missing = getattr(f, "length", None)  # an HTTP body shorter than its Content-Length:
        if missing:  # read1 ends quietly where read() would raise
            import http.client

            raise http.client.IncompleteRead(b"", missing)

    return parse_chunks(chunks(), source)


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
        grew = histogram.increase([before, cur.preemptions_total])  # a drop is a restart
        out["preemptions"] = int(cur.preemptions_total if grew is None else grew)  # first scrape: since start
    if prev is not None and cur.at - prev.at >= MIN_SECONDS:  # saved files read in a row carry no times: no rates
        dt = cur.at - prev.at
        for key, attr in (("prompt_tps", "prompt_tokens_total"), ("gen_tps", "generation_tokens_total")):
            a, b = getattr(prev, attr), getattr(cur, attr)
            if a is not None and b is not None and b >= a:
                out[key] = round((b - a) / dt, 1)
    return out


def describe(cur: Scrape, index: int, prev: Scrape | None = None, s: dict[str, Any] | None = None) -> str:
    """One line for a scrape, as evidence and for `watch`; `s`: its sample, when computed already."""
    parts = [f"scrape {index}:"]
    if cur.running is not None:
        parts.append(f"running {int(cur.running)},")
    if cur.waiting is not None:
        reasons = ", ".join(f"{k} {int(v)}" for k, v in sorted(cur.waiting_by_reason.items()) if v)
        parts.append(f"waiting {int(cur.waiting)}" + (f" ({reasons})," if reasons else ","))
    if cur.kv_usage_pct is not None:
        parts.append(f"KV cache {cur.kv_usage_pct}% ({cur.kv_metric}),")
    s = sample(cur, prev) if s is None else s
    if "preemptions" in s:
        parts.append(f"preemptions +{s['preemptions']}," if prev else f"preemptions {s['preemptions']} since start,")
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


def sources(scrapes: list[Scrape]) -> list[str]:
    """The inputs of a series in the order scraped, each once: the report's paths, the evidence's sources."""
    return list(dict.fromkeys(s.source for s in scrapes))


def to_facts(scrapes: list[Scrape]) -> Facts:
    """The facts of a scrape series: each scrape one stats sample, the last one's cache config.
    A series counts preemptions from its first scrape (0 there), so stats.preemptions is the
    window's; a lone scrape has no window and counts them since the server started."""
    facts = Facts()
    prev = None
    inputs = sources(scrapes)
    for i, cur in enumerate(scrapes, 1):
        if cur.running is not None or cur.waiting is not None:
            s = sample(cur, prev)
            text = describe(cur, i, prev, s)
            if prev is None and len(scrapes) > 1 and "preemptions" in s:
                s["preemptions"] = 0  # the baseline: what came before the series is not in it
            facts.stats.add(s, i, inputs.index(cur.source), text)  # each scrape's evidence is its own input's
        prev = cur
    _facts_from_config(facts, scrapes[-1])
    facts.window = window(scrapes)
    if facts.get("kv_cache.tokens") is not None:
        facts.set("kv_cache.tokens_from", "metrics")
    return facts


def warnings(last: Scrape) -> list[str]:
    """What the report should say about an exposition that is not (all) vLLM's."""
    if not last.vllm_series:
        return [f"{last.source}: no vllm:* metrics in this exposition; is it a vLLM server?"]
    out = []
    if last.bad_values:
        shown = ", ".join(f"{k} = {v}" for k, v in list(last.bad_values.items())[:4])
        out.append(f"{last.source}: values that are not a count or a usage read as missing ({shown})")
    if last.skipped:
        out.append(
            f"{last.source}: cut: more than {MAX_SAMPLES:,} samples; {last.skipped:,} not read, so the report is "
            "of part of the scrape and cannot call the server healthy"
        )
    if last.kv_usage is None and last.skipped:  # it may be among the samples past the cut
        out.append(f"{last.source}: neither {' nor '.join(KV_NAMES)} is among the samples read before the cut")
    elif last.kv_usage is None:
        out.append(f"{last.source}: neither {' nor '.join(KV_NAMES)} is exposed")
    return out


def summary(scrapes: list[Scrape]) -> dict[str, Any]:
    """facts.metrics of the report: the last scrape's numbers (what changed over the series is the
    window's, read/window.py: its seconds and queue-time increase hold across a restart)."""
    last = scrapes[-1]
    return {
        "scrapes": len(scrapes),
        "running": last.running,
        "waiting": last.waiting,
        "waiting_by_reason": dict(sorted(last.waiting_by_reason.items())) or None,
        "kv_usage_pct": last.kv_usage_pct,
        "kv_usage_metric": last.kv_metric,
        "preemptions_total": last.preemptions_total,
        "engines": len(last.engines) or None,
        "queue_time": last.queue_time.summary() if last.queue_time is not None else None,
        "samples_not_read": sum(s.skipped for s in scrapes),  # past MAX_SAMPLES: the scrapes were cut
    }
