"""The checks about a server that runs but serves badly: decode speed against a budget, prefill
stalling decode (head-of-line blocking), time to first token split into queue and prefill,
prefix-cache reuse, the preemption rate, and errors and aborts.

They read the window of a scrape series (Facts.window, read/window.py: increases over two or more
scrapes, never one cumulative scrape), the stats lines' aggregates (Facts.stats) and the access
lines' status counts (Facts.access). A latency without a budget is reported, not judged; a
number that needs traffic is left out when there was none.
"""

from __future__ import annotations

from typing import Any

from vllm_doctor.knowledge.contract import CheckInput, CheckResult, check

HOL_RATIO = 5.0  # a prefill interval's p99 inter-token latency this many times decode's p95 ...
HOL_MIN_MS = 200.0  # ... and at least this long: a stall a user sees
PREFIX_GOOD_PCT = 50.0  # at or over this hit rate the prompts already share what they can
PREEMPT_PER_100 = 5.0  # preemptions per 100 finished requests that cost real recompute
PREEMPT_PER_MIN = 1.0
LONG_PREFILL_MIN = 256  # a long prompt's piece per step no smaller than this: more steps cost more than they save
ABORT_PCT = 10.0  # clients giving up on this share of requests: they time out


def _decode_intervals(w: dict[str, Any]) -> list[dict[str, Any]]:
    """Intervals that only decoded (no prompt tokens processed): the decode speed at their batch."""
    return [
        i
        for i in w.get("per_interval", [])
        if i["itl_count"] and i["itl_p95_ms"] is not None and i["running"] is not None and not i["prompt_tokens"]
    ]


@check(
    reads=set(),  # the window (facts.window), its largest batch (facts.stats) and --tpot-budget (options)
    returns={"itl_p95_ms", "itl_p50_ms", "itl_count", "tpot_budget_ms", "decode_verdict", "running_max",
             "seqs_under_budget", "window_scrapes", "decode_only_p95_ms", "decode_cause"},
)  # fmt: skip
def decode_speed(inp: CheckInput) -> CheckResult:
    """Inter-token latency (TPOT) p95 over the window, against --tpot-budget when given; the largest
    batch at which the decode-only intervals' tokens, pooled from the smallest batch up, stayed under it."""
    w = inp.facts.window
    itl = w.get("itl")
    if not itl:
        return CheckResult({})
    budget = inp.options.tpot_budget_ms
    out: dict[str, Any] = {
        "itl_p95_ms": itl["p95_ms"],
        "itl_p50_ms": itl["p50_ms"],
        "itl_count": itl["count"],
        "window_scrapes": w["scrapes"],
        "decode_verdict": "unjudged",
    }
    if inp.facts.stats.running_max is not None:  # the whole series', as the p95 is (not the decode-only intervals')
        out["running_max"] = inp.facts.stats.running_max
    if budget is not None:
        out["tpot_budget_ms"] = budget
        out["decode_verdict"] = "over" if itl["p95_ms"] > budget else "under"
        pooled = w.get("itl_by_running", [])
        if pooled and out["decode_verdict"] == "over":
            top = pooled[-1]
            out["decode_only_p95_ms"] = top["itl_p95_ms"]
            if top["itl_p95_ms"] <= budget:  # decode alone was under: the prefill intervals pushed it over
                out["decode_cause"] = "prefill"
            else:
                out["decode_cause"] = "batch"
                fine = [p["running_upto"] for p in pooled[:-1] if p["itl_p95_ms"] <= budget]
                if fine:  # the largest batch whose tokens, with those of every smaller one, stayed under it
                    out["seqs_under_budget"] = max(1, int(max(fine)))
    return CheckResult(out)


@check(
    reads={"enable_chunked_prefill", "max_num_batched_tokens", "long_prefill_token_threshold"},
    returns={"head_of_line", "hol_spike_ms", "hol_decode_p95_ms", "hol_prompt_tokens", "hol_ratio",
             "chunked_prefill", "batched_tokens", "chunk_tokens_to_try", "long_prefill_to_try", "prompt_count",
             "prompts_over_threshold"},
)  # fmt: skip
def prefill_stall(inp: CheckInput) -> CheckResult:
    """Head-of-line blocking: inter-token latency p99 in intervals where prompts were prefilled, held
    against decode-only intervals' p95: one long prefill holding every running sequence's next token."""
    w = inp.facts.window
    decoding = _decode_intervals(w)
    prefilling = [  # a preempted sequence's next token comes late too: not a prefill stall
        i
        for i in w.get("per_interval", [])
        if i["prompt_tokens"] and i["itl_count"] and i["itl_p99_ms"] is not None and not i.get("preemptions")
    ]
    if not decoding or not prefilling:
        return CheckResult({})
    from statistics import median  # (5 ms to import: only a scrape with decode intervals needs it)

    base = median(i["itl_p95_ms"] for i in decoding)
    worst = max(prefilling, key=lambda i: i["itl_p99_ms"])
    out: dict[str, Any] = {
        "hol_spike_ms": worst["itl_p99_ms"],
        "hol_decode_p95_ms": base,
        "hol_prompt_tokens": int(worst["prompt_tokens"]),
        "hol_ratio": round(worst["itl_p99_ms"] / base, 1) if base else None,
    }
    out["head_of_line"] = worst["itl_p99_ms"] >= max(HOL_MIN_MS, HOL_RATIO * base)
    chunked = inp.get("enable_chunked_prefill")
    if chunked is not None:
        out["chunked_prefill"] = "on" if chunked else "off"
    budget = inp.get("max_num_batched_tokens")
    if budget is not None:
        out["batched_tokens"] = int(budget)
        out["chunk_tokens_to_try"] = max(256, int(budget) // 2)
    out.update(_long_prefill_threshold(w.get("prompt_len"), budget, inp.get("long_prefill_token_threshold")))
    return CheckResult(out)


def _long_prefill_threshold(lengths: dict[str, Any] | None, budget: Any, now: Any) -> dict[str, Any]:
    """A --long-prefill-token-threshold from the window's prompt lengths. vLLM's scheduler gives a
    request at most that many new tokens a step (0 = no cap): at the bound under which half the
    prompts fell, typical prompts still prefill in one step and only the longer ones, those that
    hold a step, go in pieces. No value where it would cap nothing (no prompt longer; not under
    --max-num-batched-tokens, which caps every step already; not under a threshold already set)
    or would cut prompts into pieces too small to be worth a step."""
    if not lengths or not lengths["over_median"] or lengths["median_le"] < LONG_PREFILL_MIN:
        return {}
    value = lengths["median_le"]
    if budget is not None and value >= int(budget) or now and value >= int(now):
        return {}
    return {
        "long_prefill_to_try": value,
        "prompt_count": lengths["count"],
        "prompts_over_threshold": lengths["over_median"],
    }


@check(
    reads=set(),  # the window, the stats series and --ttft-budget
    returns={"ttft_p95_ms", "ttft_count", "ttft_budget_ms", "ttft_verdict", "queue_mean_ms", "prefill_mean_ms",
             "finished_count", "ttft_cause", "waiting_max"},
)  # fmt: skip
def ttft_split(inp: CheckInput) -> CheckResult:
    """Time to first token p95, and whether queueing or prefill makes it: the queue and prefill time
    histograms' means (exact: sum / count), and requests still waiting (no first token yet)."""
    w = inp.facts.window
    ttft = w.get("ttft")
    if not ttft:
        return CheckResult({})
    budget = inp.options.ttft_budget_ms
    out: dict[str, Any] = {"ttft_p95_ms": ttft["p95_ms"], "ttft_count": ttft["count"], "ttft_verdict": "unjudged"}
    queue, prefill = w.get("queue"), w.get("prefill")
    if queue:
        out["queue_mean_ms"], out["finished_count"] = queue["mean_ms"], queue["count"]
    if prefill:
        out["prefill_mean_ms"] = prefill["mean_ms"]
    waiting = inp.facts.stats.waiting_max
    if waiting:
        out["waiting_max"] = waiting
    if waiting or (queue and prefill and queue["mean_ms"] >= prefill["mean_ms"]):
        out["ttft_cause"] = "queue"
    elif prefill:
        out["ttft_cause"] = "prefill"
    if budget is not None:
        out["ttft_budget_ms"] = budget
        out["ttft_verdict"] = "over" if ttft["p95_ms"] > budget else "under"
    return CheckResult(out)


@check(
    reads={"enable_prefix_caching"},
    returns={"prefix_hit_pct", "prefix_queried_tokens", "prefix_verdict", "prefix_from"},
)
def prefix_reuse(inp: CheckInput) -> CheckResult:
    """Prefix-cache hit rate where prompts were processed (the window's hits/queries, else the
    stats lines' rate): off, none (the traffic shares no prefix: nothing to warn about), partial, good."""
    w = inp.facts.window
    on = inp.get("enable_prefix_caching")
    out: dict[str, Any] = {}
    queries, hits = w.get("prefix_queries"), w.get("prefix_hits")
    if queries:
        out.update(prefix_hit_pct=round(100 * (hits or 0) / queries, 1), prefix_queried_tokens=int(queries))
        out["prefix_from"] = "metrics"
    elif inp.facts.stats.prefix_traffic_samples:
        out.update(prefix_hit_pct=inp.facts.stats.prefix_hit_last_pct, prefix_from="stats lines")
    stats = inp.facts.stats
    traffic = (
        bool(queries) or bool(w.get("prompt_tokens")) or bool(stats.prefix_traffic_samples or stats.prompt_samples)
    )
    if on is False and traffic:
        out["prefix_verdict"] = "off"
    elif "prefix_hit_pct" in out:
        pct = out["prefix_hit_pct"]
        out["prefix_verdict"] = "none" if pct == 0 else "partial" if pct < PREFIX_GOOD_PCT else "good"
    return CheckResult(out)


@check(
    reads=set(),  # the window
    returns={"preemptions_window", "preempt_per_min", "preempt_per_100_finished", "finished_count",
             "window_seconds", "preempt_rated_high"},
)  # fmt: skip
def preemption_rate(inp: CheckInput) -> CheckResult:
    """Preemptions over the window, per minute (when the scrapes carry times) and per 100 requests
    finished in it: each is a sequence evicted and recomputed because the cache ran out."""
    w = inp.facts.window
    n = w.get("preemptions")
    if n is None:
        return CheckResult({})
    done = sum(w.get("finished", {}).values())
    out: dict[str, Any] = {"preemptions_window": n, "finished_count": done}
    if w.get("seconds"):
        out["window_seconds"] = w["seconds"]
        out["preempt_per_min"] = round(60 * n / w["seconds"], 2)
    if done:
        out["preempt_per_100_finished"] = round(100 * n / done, 1)
    out["preempt_rated_high"] = n > 0 and (
        out.get("preempt_per_min", 0) >= PREEMPT_PER_MIN
        or out.get("preempt_per_100_finished", 0) >= PREEMPT_PER_100
        or not done
    )
    return CheckResult(out)


@check(
    reads=set(),  # the window's finished requests by reason, the access lines' statuses
    returns={"finished_count", "aborted", "errored", "abort_pct", "error_pct", "http_total", "http_4xx",
             "http_5xx", "http_5xx_pct", "http_4xx_pct", "errors_verdict"},
)  # fmt: skip
def request_errors(inp: CheckInput) -> CheckResult:
    """Requests that ended in abort or error (request_success{finished_reason} over the window) and
    API answers with 4xx/5xx statuses (the access lines)."""
    w, access = inp.facts.window, inp.facts.access
    out: dict[str, Any] = {}
    finished = w.get("finished") or {}
    done = sum(finished.values())
    if done:
        out.update(finished_count=done, aborted=finished.get("abort", 0), errored=finished.get("error", 0))
        out["abort_pct"] = round(100 * out["aborted"] / done, 1)
        out["error_pct"] = round(100 * out["errored"] / done, 1)
    total = sum(access.values())
    if total:
        out.update(http_total=total, http_4xx=access.get("4xx", 0), http_5xx=access.get("5xx", 0))
        out["http_5xx_pct"] = round(100 * out["http_5xx"] / total, 1)
        out["http_4xx_pct"] = round(100 * out["http_4xx"] / total, 1)
    if out.get("errored") or out.get("http_5xx"):
        out["errors_verdict"] = "errors"
    elif out.get("abort_pct", 0) >= ABORT_PCT:
        out["errors_verdict"] = "aborts"
    elif out.get("http_4xx"):
        out["errors_verdict"] = "client-errors"
    return CheckResult(out)


@check(
    reads=set(),  # every replica's numbers (facts.window["fleet"], cli/fleet.py)
    returns={"replica_imbalance", "replicas", "queued_replica", "queued_waiting_max", "queued_running_mean",
             "idle_replicas", "idle_running_mean"},
)  # fmt: skip
def replica_balance(inp: CheckInput) -> CheckResult:
    """One replica queues (requests waiting on average) while another had nothing waiting all window
    and ran fewer: the load is not spread by how busy each replica is."""
    fleet = inp.facts.window.get("fleet") or []
    if len(fleet) < 2:
        return CheckResult({})
    queued = [f for f in fleet if (f.get("waiting_mean") or 0) >= 1]
    out: dict[str, Any] = {"replicas": len(fleet), "replica_imbalance": False}
    if not queued:
        return CheckResult(out)
    worst = max(queued, key=lambda f: f["waiting_mean"])
    idle = [
        f
        for f in fleet
        if f["waiting_max"] == 0 and (f.get("running_mean") or 0) < (worst.get("running_mean") or 0) + 1e-9
    ]
    if idle:
        out.update(
            replica_imbalance=True,
            queued_replica=worst["replica"],
            queued_waiting_max=worst["waiting_max"],
            queued_running_mean=worst["running_mean"],
            idle_replicas=", ".join(f["replica"] for f in idle[:4]),
            idle_running_mean=max(f.get("running_mean") or 0 for f in idle),
        )
    return CheckResult(out)
