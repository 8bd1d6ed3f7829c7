"""The checks about the traffic a serving server sees: a request it refused (over --max-model-len,
or over the per-step token budget), and why requests wait (queue_kind)."""

from __future__ import annotations

from typing import Any

from vllm_doctor.data import cut_evidence
from vllm_doctor.facts import KV_NEAR_FULL_PCT, StatsSeries
from vllm_doctor.knowledge.contract import CheckInput, CheckResult, check

COMMON_SEQ_CAPS = {128, 256, 512, 1024}  # --max-num-seqs defaults across versions and GPUs
# a backlog lasts when requests wait in this many samples in a row, in this share of the samples,
# or as many as this share of --max-num-seqs at once: not 1-2 requests in a few samples of hundreds
LASTING_RUN, LASTING_SHARE, LASTING_OF_SEQS = 4, 0.1, 0.25


@check(reads={"limit", "max_model_len", "prompt_tokens", "total_tokens"}, returns={"over_by", "max_tokens_allowed"})
def request_limit(inp: CheckInput) -> CheckResult:
    """How far a rejected request was over the server's limit."""
    limit = inp.get("limit", "max_model_len")
    prompt = inp.get("prompt_tokens")
    total = inp.get("total_tokens")
    out: dict[str, Any] = {}
    if limit is not None and (prompt is not None or total is not None):
        out["over_by"] = int(total if total is not None else prompt) - int(limit)
        if prompt is not None and int(prompt) < int(limit):
            out["max_tokens_allowed"] = int(limit) - int(prompt)
    return CheckResult(out)


@check(
    # and the stats series (facts.stats)
    reads={"scheduling_policy", "max_num_seqs", "enable_lora", "pooling_task", "pooling_route"},
    returns={"stats_samples", "waiting_max", "waiting_samples", "kv_usage_max_pct", "waiting_kv_max_pct",
             "kv_near_full_pct", "preemptions", "full_run_max", "running_while_waiting_max", "queue_kind",
             "pooling_served", "pooling_prompts", "pooling_idle_stats"},
)  # fmt: skip
def queue_kind(inp: CheckInput) -> CheckResult:
    """Why requests wait: a full KV cache, the sequence cap, a stall, or deferred (LoRA/transfer)."""
    s = inp.facts.stats
    out: dict[str, Any] = {
        "stats_samples": s.samples,
        "waiting_max": s.waiting_max,
        "waiting_samples": s.waiting_samples,
        "kv_usage_max_pct": s.kv_usage_max_pct,
        "waiting_kv_max_pct": s.waiting_kv_max_pct,
        "kv_near_full_pct": KV_NEAR_FULL_PCT,
        "full_run_max": s.full_run_max,
    }
    # V0's "Swapped: N reqs": N sequences swapped out to the CPU, each preempted at least once
    preemptions = max(s.preemptions or 0, s.swapped_max or 0)
    if preemptions:  # none seen is not a number to quote ("at least 0 preemptions")
        out["preemptions"] = preemptions
    if s.waiting_running_max is not None:
        out["running_while_waiting_max"] = s.waiting_running_max
    evidence = [cut_evidence(line, text, source) for line, source, text in s.evidence[:4]]
    confidence = None
    preempted = bool(preemptions)
    policy = str(inp.get("scheduling_policy") or "")
    lasting = _lasting(s, inp.get("max_num_seqs"))
    pooling = _pooling(inp, s)
    if (s.waiting_full and lasting) or (preempted and policy != "priority"):
        out["queue_kind"] = "cache-full"
    elif preempted and policy == "priority":
        out["queue_kind"] = "priority"
    elif pooling and lasting and s.prompt_samples:
        # a pooling request ends within the step that takes it: 0 running and 0% KV at every
        # sample while prompts are processed is a server at its throughput, not a stall
        out["queue_kind"] = "pooling"
        out["pooling_served"] = pooling
        # the summary says what the samples show: prompts in every interval, or in how many of them
        every = s.prompt_samples == s.samples
        out["pooling_prompts"] = "in every interval" if every else f"in {s.prompt_samples} of {s.samples} intervals"
        if not s.running_max and not s.kv_usage_max_pct:
            out["pooling_idle_stats"] = "0 running, 0% KV in the stats"
    elif lasting and (s.waiting_samples >= 2 or (s.waiting_max or 0) >= 4 or (s.samples == 1 and s.waiting_samples)):
        out["queue_kind"], confidence = _why_waiting(inp, s)
    return CheckResult(out, evidence, confidence)


def _lasting(s: StatsSeries, max_num_seqs: Any) -> bool:
    """Whether requests waited long enough, or enough of them, to be a backlog: in LASTING_RUN
    samples in a row, in LASTING_SHARE of the samples, or LASTING_OF_SEQS of --max-num-seqs at once
    (4 at least). One or two requests in one to three samples of hundreds is a moment, not a queue."""
    if not s.waiting_samples:
        return False
    seqs = int(max_num_seqs) if max_num_seqs else 0
    size = (s.waiting_max or 0) >= max(4, LASTING_OF_SEQS * seqs)
    return s.waiting_run_max >= LASTING_RUN or s.waiting_samples >= LASTING_SHARE * s.samples or size


def _pooling(inp: CheckInput, s: StatsSeries) -> str | None:
    """The pooling server this is, as the summary names it: as its start said (its task), else
    from its traffic (requests answered on /v1/embeddings, /pooling, /score, /rerank, /classify),
    else from its stats (prompts processed, no token generated in any interval)."""
    if inp.get("pooling_task"):
        return f"a pooling ({inp.get('pooling_task')}) server"
    if inp.get("pooling_route"):
        return f"a pooling server (its clients call {inp.get('pooling_route')})"
    if s.prompt_samples and not s.gen_samples and s.samples >= 2:
        return "a pooling server (no token generated in any interval)"
    return None


def _why_waiting(inp: CheckInput, s: StatsSeries) -> tuple[str, str | None]:
    """Why requests wait while the cache has room: LoRA slots or KV transfer (deferred), a stall,
    the sequence cap or the token budget. One sample, when it is all there is, decides too, at
    low confidence (the numbers that prove a cap still prove it)."""
    lone = "low" if s.samples == 1 else None
    max_seqs = inp.get("max_num_seqs")
    running = s.waiting_running_max or 0
    if s.deferred_max or inp.get("enable_lora"):
        return "deferred", lone
    if s.waiting_idle == s.waiting_samples or s.idle_run >= 2:
        return "stall", lone  # nothing runs while requests wait, at least at the end
    if s.waiting_running_max == 0:  # none shown running, but prompts processed: prefill holds them, no cap
        return "batch-limit", lone or "medium"
    if max_seqs and running >= int(max_seqs):
        return "sequence-cap", None
    if lone:  # below a known cap: the per-step token budget; the cap unknown: the likelier, the cap
        return ("batch-limit" if max_seqs else "sequence-cap"), lone
    if s.waiting_running_min == s.waiting_running_max and s.waiting_running_max in COMMON_SEQ_CAPS:
        return "sequence-cap", None  # a steady count at a default --max-num-seqs
    if s.waiting_running_min == s.waiting_running_max:
        return "sequence-cap", "medium"
    return "batch-limit", "medium"


@check(
    reads={"limit", "max_model_len", "max_num_batched_tokens"},
    returns={"limit_is_budget", "budget_tokens", "limit_is_max_model_len"},
)
def prompt_budget(inp: CheckInput) -> CheckResult:
    """Whether V0's "Input prompt (N tokens) is too long and exceeds limit of M" is about the
    per-step token budget (M = max_num_batched_tokens, chunked prefill off: the scheduler's limit is
    min(max_model_len, max_num_batched_tokens)) or about --max-model-len: by the numbers when the
    log states them; the OpenAI and V1 wordings always name max_model_len."""
    said = " ".join(e.text for e in inp.match.evidence) if inp.match else ""
    limit = inp.get("limit")
    if limit is None or "exceeds limit of" not in said:
        return CheckResult({"limit_is_budget": False})
    length, budget = inp.get("max_model_len"), inp.get("max_num_batched_tokens")
    if length is not None:
        is_budget = int(limit) < int(length)
    else:
        is_budget = budget is not None and int(limit) == int(budget)
    out: dict[str, Any] = {"limit_is_budget": is_budget, "limit_is_max_model_len": not is_budget}
    if is_budget:
        out["budget_tokens"] = int(limit)
    return CheckResult(out)
