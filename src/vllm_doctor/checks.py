"""The named checks rules ask for: the few computations that turn matched numbers into decisions.

Each check reads the values known so far (facts, the rule's matched groups, earlier checks) and
returns new named values; rules use them in `when` conditions, summaries and fixes. One explicit
registry, no discovery.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .data import Evidence, Match
from .facts import KV_NEAR_FULL_PCT, Facts

DEFAULT_BLOCK_SIZE = 16  # vLLM's block size on CUDA when the log does not say
SAFE_UTILIZATION = 0.95  # above this, a startup failure is traded for a mid-traffic OOM
RAISE_UTILIZATION_BELOW = 0.90
MAX_TP_LISTED = 8  # tensor-parallel sizes listed when the GPU count is unknown
# startup phases (set by fact rules) after which a CUDA OOM is about the cache, not the weights
CACHE_PHASES = {"weights_loaded", "profiling", "kv_cache_alloc", "graph_capture", "sampler_warmup"}
WEIGHT_PHASES = {"weights_loading"}


@dataclass
class Options:
    target_concurrency: int | None = None
    target_len: int | None = None


@dataclass
class CheckInput:
    values: dict[str, Any]
    facts: Facts
    match: Match | None
    options: Options = field(default_factory=Options)

    def get(self, *names: str) -> Any:
        """The first of several names that is known (a matched group or a fact)."""
        for name in names:
            value = self.values.get(name)
            if value is not None:
                return value
        return None


Check = Callable[[CheckInput], dict[str, Any]]


def block_size(inp: CheckInput) -> tuple[int, bool]:
    """(block size, whether the log said it)."""
    b = inp.get("block_size", "kv_cache.block_size")
    return (int(b), True) if b else (DEFAULT_BLOCK_SIZE, False)


def is_v1(inp: CheckInput) -> bool:
    engine = inp.get("engine")
    if engine:
        return engine == "V1"
    version = inp.get("vllm_version")
    return bool(version) and _version_tuple(version) >= (0, 8, 0)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for p in str(text).split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def kv_fit(inp: CheckInput) -> dict[str, Any]:
    """The largest --max-model-len the cache holds, and whether other levers would reach it."""
    out: dict[str, Any] = {}
    fit = inp.get("estimated_max_len", "kv_cache.estimated_max_model_len")  # vLLM's own search
    if fit is None:
        bsize, known = block_size(inp)
        tokens = inp.get("kv_tokens")  # V0: "maximum number of tokens that can be stored in KV cache (N)"
        blocks = inp.get("gpu_blocks", "kv_cache.gpu_blocks")
        if tokens is not None:
            fit = (int(tokens) // bsize) * bsize
        else:
            if blocks is None and inp.get("kv_cache.tokens") is not None:
                blocks = int(inp.get("kv_cache.tokens")) // bsize
            if blocks is not None:
                usable = int(blocks) - 1 if is_v1(inp) else int(blocks)  # V1 holds back one null block
                fit = max(0, usable) * bsize
        if fit is not None:
            out["block_size"] = bsize
            if not known:
                out["block_size_assumed"] = True
    if fit is not None:
        out["fit_max_model_len"] = int(fit)
    needed, available = inp.get("needed_gib"), inp.get("available_gib", "kv_cache.available_gib")
    util = inp.get("gpu_memory_utilization")
    total = inp.get("memory.total_gib")
    if needed is not None and available is not None:
        out["missing_gib"] = round(float(needed) - float(available), 2)
        kv_dtype = str(inp.get("kv_cache_dtype") or "auto")
        if not kv_dtype.startswith("fp8"):
            out["fp8_kv_fits"] = 2 * float(available) >= float(needed)
        if util is not None and total:
            want = float(util) + (float(needed) - float(available)) / float(total)
            out["utilization_needed"] = math.ceil(want * 100) / 100
            out["utilization_needed_unsafe"] = out["utilization_needed"] > SAFE_UTILIZATION
    if util is not None:
        out["can_raise_utilization"] = float(util) < RAISE_UTILIZATION_BELOW
        out["raised_utilization"] = RAISE_UTILIZATION_BELOW
    return out


def tp_sizes(inp: CheckInput) -> dict[str, Any]:
    """Tensor-parallel sizes that divide what the model splits, by vLLM's rules."""
    heads = inp.get("heads", "num_attention_heads")
    kv_heads = inp.get("kv_heads", "num_kv_heads")
    dimension = inp.get("dimension")
    tp = inp.get("tp", "tensor_parallel_size")
    limit = max(MAX_TP_LISTED, int(tp) if tp else 0)
    out: dict[str, Any] = {}
    if heads is None and kv_heads is None and dimension is None:
        return out

    def ok(t: int) -> bool:
        if heads is not None and int(heads) % t:
            return False
        if kv_heads is not None:
            k = int(kv_heads)
            if (k >= t and k % t) or (k < t and t % k):
                return False
        return not (dimension is not None and int(dimension) % t)

    valid = [t for t in range(1, limit + 1) if ok(t)]
    out["valid_tp_sizes"] = valid
    if tp is not None:
        below = [t for t in valid if t < int(tp)]
        above = [t for t in valid if t > int(tp)]
        if below:
            out["tp_below"] = below[-1]
        if above:
            out["tp_above"] = above[0]
    return out


def context_limit(inp: CheckInput) -> dict[str, Any]:
    """The model's derived maximum, as the --max-model-len to use."""
    derived = inp.get("derived_max_model_len")
    if derived is None:
        return {}
    out = {"suggested_max_model_len": int(float(derived))}
    requested = inp.get("requested_max_model_len", "max_model_len")
    if requested is not None:
        out["over_by"] = int(requested) - out["suggested_max_model_len"]
    return out


def request_limit(inp: CheckInput) -> dict[str, Any]:
    """How far a rejected request was over the server's limit."""
    limit = inp.get("limit", "max_model_len")
    prompt = inp.get("prompt_tokens")
    total = inp.get("total_tokens")
    out: dict[str, Any] = {}
    if limit is not None and (prompt is not None or total is not None):
        out["over_by"] = int(total if total is not None else prompt) - int(limit)
        if prompt is not None and int(prompt) < int(limit):
            out["max_tokens_allowed"] = int(limit) - int(prompt)
    return out


def queue_kind(inp: CheckInput) -> dict[str, Any]:
    """Why requests wait: a full KV cache, the sequence cap, a stall, or deferred (LoRA/transfer)."""
    s = inp.facts.stats
    out: dict[str, Any] = {
        "stats_samples": s.samples,
        "waiting_max": s.waiting_max,
        "waiting_samples": s.waiting_samples,
        "kv_usage_max_pct": s.kv_usage_max_pct,
        "waiting_kv_max_pct": s.waiting_kv_max_pct,
        "kv_near_full_pct": KV_NEAR_FULL_PCT,
        "preemptions": s.preemptions,
        "full_run_max": s.full_run_max,
    }
    if s.waiting_running_max is not None:
        out["running_while_waiting_max"] = s.waiting_running_max
    out["_evidence"] = [Evidence(line, text, source) for line, source, text in s.evidence[:4]]
    preempted = bool(s.preemptions)
    policy = str(inp.get("scheduling_policy") or "")
    if s.waiting_full or (preempted and policy != "priority"):
        out["queue_kind"] = "cache-full"
    elif preempted and policy == "priority":
        out["queue_kind"] = "priority"
    elif s.waiting_samples >= 2 or (s.waiting_max or 0) >= 4:
        max_seqs = inp.get("max_num_seqs")
        if s.deferred_max or inp.get("enable_lora"):
            out["queue_kind"] = "deferred"
        elif s.waiting_idle == s.waiting_samples:
            out["queue_kind"] = "stall"
        elif max_seqs and (s.waiting_running_max or 0) >= int(max_seqs):
            out["queue_kind"] = "sequence-cap"
        elif s.waiting_running_min == s.waiting_running_max:
            out["queue_kind"] = "sequence-cap"
            out["confidence"] = "medium"
        else:
            out["queue_kind"] = "batch-limit"
            out["confidence"] = "medium"
    return out


def oom_phase(inp: CheckInput) -> dict[str, Any]:
    """Whether an out-of-memory error came while loading weights or after (profiling, cache, graphs)."""
    match = inp.match
    if match is None:
        return {}
    phase = None
    where = match.evidence[0].source if match.evidence else 0
    for line, source, name, _process in inp.facts.phases:
        if source == where and line <= match.first_line:
            phase = name  # the latest phase that began before the error
    if phase in WEIGHT_PHASES:
        return {"oom_phase": "weights"}
    if phase in CACHE_PHASES:
        return {"oom_phase": "cache"}
    return {"oom_phase": "unknown", "confidence": "low"}


def gpu_headroom(inp: CheckInput) -> dict[str, Any]:
    """The --gpu-memory-utilization that fits in what is actually free."""
    free, total = inp.get("free_gib"), inp.get("total_gib")
    if free is None or not total:
        return {}
    fraction = math.floor((float(free) / float(total) - 0.02) * 100) / 100
    return {
        "held_by_others_gib": round(float(total) - float(free), 2),
        "suggested_utilization": max(0.05, fraction),
    }


def shutdown(inp: CheckInput) -> dict[str, Any]:
    """Whether the matched line came during a shutdown, and whether the shutdown finished."""
    at = inp.match.first_line if inp.match else 0
    started = any(name == "shutdown_started" and line < at for line, _s, name, _p in inp.facts.phases)
    done = any(name == "shutdown_complete" and line > at for line, _s, name, _p in inp.facts.phases)
    return {"during_shutdown": started, "shutdown_completed": done}


def concurrency_budget(inp: CheckInput) -> dict[str, Any]:
    """KV tokens, the worst-case sequences at max-model-len, and a target the operator names."""
    bsize, known = block_size(inp)
    tokens = inp.get("kv_cache.tokens")
    out: dict[str, Any] = {}
    if tokens is None:
        blocks = inp.get("kv_cache.gpu_blocks")
        if blocks is None:
            return out
        tokens = int(blocks) * bsize
        out["tokens_from_blocks"] = True
        if not known:
            out["block_size_assumed"] = bsize
    out["kv_tokens"] = int(tokens)
    length = inp.get("max_model_len", "kv_cache.concurrency_tokens")
    if length:
        out["max_model_len"] = int(length)
        out["worst_case_sequences"] = int(tokens) // int(length)
    target = inp.options.target_concurrency
    if target:
        target_len = inp.options.target_len or length
        if target_len:
            need = int(target) * int(target_len)
            out.update(
                target_concurrency=int(target),
                target_len=int(target_len),
                target_tokens=need,
                can_hold_target=int(tokens) >= need,
                missing_tokens=max(0, need - int(tokens)),
                target_max_model_len=(int(tokens) // int(target)) // bsize * bsize,
            )
    return out


CHECKS: dict[str, Check] = {
    "kv_fit": kv_fit,
    "tp_sizes": tp_sizes,
    "context_limit": context_limit,
    "request_limit": request_limit,
    "queue_kind": queue_kind,
    "oom_phase": oom_phase,
    "gpu_headroom": gpu_headroom,
    "shutdown": shutdown,
    "concurrency_budget": concurrency_budget,
}
