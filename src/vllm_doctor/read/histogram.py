"""Histograms and counters of a /metrics series, and what they say over a window of scrapes.

A scrape's histograms and counters are cumulative since the server started: one scrape says
nothing about the last minute. Rates and percentiles here come only from the difference of two or
more scrapes; a counter that went down between two scrapes is a restart (a counter reset), and
the later scrape's value is then the increase since it (Prometheus' `increase()` does the same).

Names follow shared/vllm-reference/metrics.md, with the renames by version mapped to one key:
`time_per_output_token_seconds` -> `inter_token_latency_seconds` (0.10.2), `gpu_prefix_cache_*`
-> `prefix_cache_*` (0.9.2). The current name wins where a server exposes both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# key -> exposed histogram base names, the current name first
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "ttft": ("vllm:time_to_first_token_seconds",),
    "queue": ("vllm:request_queue_time_seconds", "vllm:time_in_queue_requests"),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "prompt_len": ("vllm:request_prompt_tokens",),  # tokens, not seconds: one per finished request
}
# key -> exposed counter names, the current name first
COUNTERS: dict[str, tuple[str, ...]] = {
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
}
SUCCESS = "vllm:request_success_total"  # labelled finished_reason: one counter per reason, "finished:<reason>"
# every exposed sample name this module reads, -> (key, part)
NAMES: dict[str, tuple[str, str]] = {
    **{
        f"{n}{part}": (key, part)
        for key, ns in HISTOGRAMS.items()
        for n in ns
        for part in ("_bucket", "_count", "_sum")
    },
    **{n: (key, "") for key, ns in COUNTERS.items() for n in ns},
    SUCCESS: ("finished", ""),
}
MAX_BUCKETS = 64


@dataclass
class Histogram:
    count: float = 0.0
    sum: float = 0.0
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (le, cumulative count), by le

    def quantile_le(self, q: float) -> float | None:
        """The smallest bucket bound at or under which a q share of the observations fell."""
        if self.count <= 0:
            return None
        want = q * self.count
        for le, cumulative in sorted(self.buckets):
            if cumulative >= want:
                return le
        return None

    def quantile(self, q: float) -> float | None:
        """The q-quantile as Prometheus' histogram_quantile() computes it: linear within the
        bucket it falls in; the highest finite bound when it falls in +Inf."""
        buckets = sorted(self.buckets)
        total = buckets[-1][1] if buckets else 0.0
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for le, cumulative in buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                if cumulative == below:
                    return le
                return lower + (le - lower) * (rank - below) / (cumulative - below)
            lower, below = le, cumulative
        return lower

    def share_over(self, bound: float) -> float | None:
        """The share of observations above a bucket bound (exact at a bound; else the next one up)."""
        buckets = sorted(self.buckets)
        total = buckets[-1][1] if buckets else 0.0
        if total <= 0:
            return None
        at = next((c for le, c in buckets if le >= bound), total)
        return (total - at) / total

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

    def plus(self, other: Histogram) -> Histogram:
        mine = dict(self.buckets)
        for le, c in other.buckets:
            mine[le] = mine.get(le, 0.0) + c
        return Histogram(self.count + other.count, self.sum + other.sum, sorted(mine.items()))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"count": int(self.count)}
        if self.count > 0:
            out["mean_s"] = round(self.sum / self.count, 3)
            for q in (0.5, 0.9, 0.99):
                le = self.quantile_le(q)
                out[f"p{int(q * 100)}_le_s"] = None if le is None or le == float("inf") else le
        return out


class Collector:
    """Gathers one scrape's samples of NAMES: histograms summed over engines, counters by key.
    A renamed series is kept under the name it was read as until finish() picks the current one."""

    def __init__(self) -> None:
        self.hist: dict[str, Histogram] = {}  # exposed base name -> histogram
        self.buckets: dict[str, dict[float, float]] = {}
        self.counters: dict[str, float] = {}  # exposed name (or finished:<reason>) -> value

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        key, part = NAMES[name]
        if key == "finished":
            reason = labels.get("finished_reason", "unknown")[:40]
            slot = f"finished:{reason}"
            if slot in self.counters or len(self.counters) < MAX_BUCKETS:
                self.counters[slot] = self.counters.get(slot, 0.0) + value
            return
        if not part:
            self.counters[name] = self.counters.get(name, 0.0) + value
            return
        base = name[: -len(part)]
        h = self.hist.setdefault(base, Histogram())
        if part == "_count":
            h.count += value
        elif part == "_sum":
            h.sum += value
        else:
            try:
                le = float(labels.get("le", "inf").replace("+Inf", "inf"))
            except ValueError:
                return
            b = self.buckets.setdefault(base, {})
            if le in b or len(b) < MAX_BUCKETS:
                b[le] = b.get(le, 0.0) + value

    def finish(self) -> tuple[dict[str, Histogram], dict[str, float]]:
        """Histograms and counters by key (itl, ttft, ..., prefix_hits, finished:<reason>)."""
        hists: dict[str, Histogram] = {}
        for key, names in HISTOGRAMS.items():
            for n in names:
                if n in self.hist:
                    h = self.hist[n]
                    h.buckets = sorted(self.buckets.get(n, {}).items())
                    hists[key] = h
                    break
        counters = {k: v for k, v in self.counters.items() if k.startswith("finished:")}
        for key, names in COUNTERS.items():
            found = next((self.counters[n] for n in names if n in self.counters), None)
            if found is not None:
                counters[key] = found
        return hists, counters


def increase(values: list[float | None]) -> float | None:
    """A counter's increase over a series of readings; a drop is a restart, after which the
    reading is the increase since. None when fewer than two readings are known."""
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return None
    total = 0.0
    for before, after in zip(known, known[1:], strict=False):
        total += after if after < before else after - before
    return total


def hist_increase(series: list[Histogram | None]) -> Histogram | None:
    """A histogram's observations over a series of scrapes, resets handled as for counters."""
    known = [h for h in series if h is not None]
    if len(known) < 2:
        return None
    out = Histogram()
    for before, after in zip(known, known[1:], strict=False):
        out = out.plus(after.minus(before))
    return out
