"""A series of /metrics scrapes as one window: the increase of every histogram and counter over
it, percentiles of those increases, and the same per interval (between consecutive scrapes),
with the running batch of each. One scrape is no window: its cumulative numbers are since the
start, so `window()` gives nothing for fewer than two.

The result is plain data (Facts.window) the runtime checks (knowledge/runtime.py) judge:

    scrapes, intervals, seconds (None when the scrapes carry no times: saved files), resets,
    itl / ttft / queue / prefill: {count, mean_ms, p50_ms, p95_ms, p99_ms, over_1s_share},
    prompt_len: {count, median_le, over_median} (prompt tokens of the requests finished in it),
    per_interval: [{running, itl_count, itl_p95_ms, itl_p99_ms, prompt_tokens, preemptions}],
    itl_by_running: [{running_upto, itl_count, itl_p95_ms}] (decode-only intervals, pooled upwards),
    prefix_queries, prefix_hits, finished: {reason: n}, preemptions, generation_tokens, prompt_tokens
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vllm_doctor.read.histogram import Histogram, hist_increase, increase

if TYPE_CHECKING:
    from vllm_doctor.read.metrics import Scrape

MIN_SECONDS = 1.0  # scrapes closer than this were not taken apart in time (files read in a row)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def latency(h: Histogram | None) -> dict[str, Any] | None:
    """A latency histogram's increase as the numbers the checks read, in milliseconds."""
    if h is None or h.count <= 0:
        return None
    return {
        "count": int(h.count),
        "mean_ms": _ms(h.sum / h.count),
        "p50_ms": _ms(h.quantile(0.5)),
        "p95_ms": _ms(h.quantile(0.95)),
        "p99_ms": _ms(h.quantile(0.99)),
        "over_1s_share": h.share_over(1.0),
    }


def prompt_lengths(h: Histogram | None) -> dict[str, Any] | None:
    """The prompt-length histogram's increase: how many prompts, the bucket bound at or under which
    half of them fell (vLLM's own bound, exact), and how many were longer than it."""
    median = h.quantile_le(0.5) if h is not None else None
    if h is None or median is None or math.isinf(median):
        return None
    share = h.share_over(median) or 0.0
    return {"count": int(h.count), "median_le": int(median), "over_median": round(share * h.count)}


def _interval(before: Scrape, after: Scrape) -> dict[str, Any]:
    itl = hist_increase([before.hists.get("itl"), after.hists.get("itl")])
    runs = [r for r in (before.running, after.running) if r is not None]
    out: dict[str, Any] = {
        "running": round(sum(runs) / len(runs), 1) if runs else None,
        "itl_count": int(itl.count) if itl else 0,
        "itl_p95_ms": _ms(itl.quantile(0.95)) if itl else None,
        "itl_p99_ms": _ms(itl.quantile(0.99)) if itl else None,
        "prompt_tokens": increase([before.prompt_tokens_total, after.prompt_tokens_total]),
        "preemptions": increase([before.preemptions_total, after.preemptions_total]),
    }
    return out


def _itl_by_running(scrapes: list[Scrape]) -> list[dict[str, Any]]:
    """Inter-token latency of the decode-only intervals (no prompt tokens processed) pooled from
    the smallest running batch up: [{running_upto, itl_count, itl_p95_ms}], one per batch seen.
    Pooled, a batch's figure rests on every token decoded at that batch or below."""
    by_running: dict[float, Histogram] = {}
    for a, b in zip(scrapes, scrapes[1:], strict=False):
        itl = hist_increase([a.hists.get("itl"), b.hists.get("itl")])
        runs = [r for r in (a.running, b.running) if r is not None]
        if itl is None or not itl.count or not runs or increase([a.prompt_tokens_total, b.prompt_tokens_total]):
            continue
        running = round(sum(runs) / len(runs), 1)
        by_running[running] = by_running.get(running, Histogram()).plus(itl)
    out, pooled = [], Histogram()
    for running in sorted(by_running):
        pooled = pooled.plus(by_running[running])
        out.append({"running_upto": running, "itl_count": int(pooled.count), "itl_p95_ms": _ms(pooled.quantile(0.95))})
    return out


def window(scrapes: list[Scrape]) -> dict[str, Any]:
    """The window the scrapes span; {} for fewer than two."""
    if len(scrapes) < 2:
        return {}
    gaps = [b.at - a.at for a, b in zip(scrapes, scrapes[1:], strict=False)]
    out: dict[str, Any] = {
        "scrapes": len(scrapes),
        "intervals": len(scrapes) - 1,
        "seconds": round(sum(gaps), 1) if all(g >= MIN_SECONDS for g in gaps) else None,
        "resets": sum(
            1
            for a, b in zip(scrapes, scrapes[1:], strict=False)
            if a.generation_tokens_total is not None
            and b.generation_tokens_total is not None
            and b.generation_tokens_total < a.generation_tokens_total
        ),
    }
    for key in ("itl", "ttft", "queue", "prefill"):
        out[key] = latency(hist_increase([s.hists.get(key) for s in scrapes]))
    out["prompt_len"] = prompt_lengths(hist_increase([s.hists.get("prompt_len") for s in scrapes]))
    out["per_interval"] = [_interval(a, b) for a, b in zip(scrapes, scrapes[1:], strict=False)]
    out["itl_by_running"] = _itl_by_running(scrapes)
    for key in ("prefix_queries", "prefix_hits"):
        out[key] = increase([s.counters.get(key) for s in scrapes])
    reasons = sorted({k for s in scrapes for k in s.counters if k.startswith("finished:")})
    finished = {r.split(":", 1)[1]: increase([s.counters.get(r) for s in scrapes]) for r in reasons}
    out["finished"] = {k: int(v) for k, v in finished.items() if v is not None}
    for key, attr in (
        ("preemptions", "preemptions_total"),
        ("generation_tokens", "generation_tokens_total"),
        ("prompt_tokens", "prompt_tokens_total"),
    ):
        value = increase([getattr(s, attr) for s in scrapes])
        out[key] = None if value is None else int(value)
    return out
