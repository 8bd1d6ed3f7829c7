"""Predicted against logged: the KV tokens the model's config says the log's cache memory holds,
held against the size vLLM printed, with the reason when they differ (facts.capacity).

The prediction is vLLM's KV cache manager (capacity/kvcache.py: layers grouped, pages, blocks,
blocks per request, the token count as the log's version prints it) applied to what the log says the KV cache
got: V1's "Available KV cache memory" or the CPU backend's "set (X/Y) GiB for KV cache", V0's
"the rest of the memory reserved for KV Cache", or the memory profile's parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_doctor.knowledge.contract import CheckInput
from vllm_doctor.knowledge.kvmodel import KvModel, is_v1, kv_model

if TYPE_CHECKING:
    from vllm_doctor.capacity.arithmetic import Step


@dataclass
class CrossCheck:
    predicted_tokens: int | None = None
    logged_tokens: int | None = None
    difference_pct: float | None = None
    explanation: str | None = None
    kv_bytes_per_token: int | None = None  # per GPU
    kv_memory_gib: float | None = None
    kv_memory_source: str | None = None
    block_size: int | None = None
    longest_sequence: int | None = None  # V1: (blocks - 1) x block size
    work: list[Step] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "predicted_tokens": self.predicted_tokens,
            "logged_tokens": self.logged_tokens,
            "difference_pct": self.difference_pct,
            "explanation": self.explanation,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_memory_gib": self.kv_memory_gib,
            "kv_memory_source": self.kv_memory_source,
            "block_size": self.block_size,
            "longest_sequence": self.longest_sequence,
            "work": [vars(s) for s in self.work],
        }


def kv_memory(inp: CheckInput) -> tuple[float, str, bool] | None:
    """(GiB the KV cache got, where the log says so, whether it was measured rather than computed)."""
    available = inp.get("kv_cache.available_gib")
    if available is not None:
        return float(available), "the log's KV cache memory line", True
    rest = inp.get("memory.kv_gib")
    if rest is not None:
        return float(rest), "the log's memory profile (memory reserved for KV cache)", True
    requested = inp.get("memory.requested_gib")
    total, util = inp.get("memory.total_gib"), inp.get("gpu_memory_utilization")
    if requested is None and total is not None and util is not None:
        requested = float(total) * float(util)
    weights = inp.get("memory.weights_gib", "weights_gib")
    if requested is None or weights is None:
        return None
    parts = [
        ("activation", "memory.activation_gib"),
        ("non-torch", "memory.non_torch_gib"),
        ("CUDA graphs", "memory.cudagraph_gib"),
    ]
    gib = float(requested) - float(weights)
    used = ["weights"]
    for label, name in parts:
        value = inp.get(name)
        if value is not None:
            gib -= float(value)
            used.append(label)
    return gib, f"total x utilization - {', '.join(used)} (the log's memory profile)", len(used) == 4


def cross_check(inp: CheckInput, model_note: str | None = None) -> CrossCheck:
    out = CrossCheck(logged_tokens=_int(inp.get("kv_cache.tokens")))
    km = kv_model(inp)
    if km is None:
        out.explanation = (
            f"no model config: {model_note}" if model_note else "no model config (pass --model or --config)"
        )
        return out
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity import kvcache
    from vllm_doctor.capacity.arithmetic import Step, fmt_int

    shape, tp, lay = km.shape, km.tp, km.layout
    bpt = cap.kv_bytes_per_token(shape, km.element_bytes, tp)
    out.kv_bytes_per_token = bpt
    out.block_size = bsize = lay.block_size
    out.work.append(
        Step("KV bytes per token", cap.kv_formula(shape, km.element_bytes, km.kv_dtype, tp), f"{fmt_int(bpt)} B")
    )
    memory = kv_memory(inp)
    if memory is None:
        out.explanation = "the log does not say how much memory the KV cache got, so there is nothing to predict from"
        return out
    gib, source, measured = memory
    budget = km.budget_bytes(gib)
    out.kv_memory_gib, out.kv_memory_source = round(gib, 2), source
    line = inp.facts.where.get("kv_cache.available_gib") or inp.facts.where.get("memory.kv_gib")
    exact = f" = {fmt_int(budget)} B (--kv-cache-memory-bytes)" if budget == km.exact_budget else ""
    out.work.append(Step("KV cache memory", source + (f" (line {line})" if line else "") + exact, f"{gib:,.2f} GiB"))
    assumed = "" if km.block_size_said else " (assumed: the log does not say)"
    out.work.append(Step("cache layout", kvcache.describe(lay) + assumed, f"{fmt_int(lay.page_bytes)} B per block"))
    got = km.capacity(max(budget, 0))
    blocks = max(0, budget // lay.page_bytes)
    out.work.append(Step("blocks", f"{gib:,.2f} GiB / {fmt_int(lay.page_bytes)} B", fmt_int(blocks)))
    if got is not None:
        out.predicted_tokens = got.tokens
        length = km.max_model_len or 0
        if km.modelled:
            out.work.append(
                Step(
                    f"blocks per request at {fmt_int(length)}", _per_group(km, length), fmt_int(got.blocks_per_request)
                )
            )
        how = _tokens_work(km, got, blocks, length)
        out.work.append(Step("predicted tokens", how, fmt_int(got.tokens)))
        logged = inp.get("kv_cache.max_concurrency")
        if logged is not None:
            said = f"{fmt_int(blocks)} / {fmt_int(got.blocks_per_request)} blocks per request; vLLM logged {float(logged):.2f}x"
            out.work.append(Step("maximum concurrency", said, f"{got.concurrency:.2f}x"))
    else:
        out.predicted_tokens = blocks * bsize
        out.work.append(Step("predicted tokens", f"{fmt_int(blocks)} blocks x {bsize} (no --max-model-len in the log)",
                             fmt_int(out.predicted_tokens)))  # fmt: skip
    v1 = is_v1(inp)
    out.longest_sequence = _longest(km, budget, blocks, v1)
    if out.logged_tokens is None:
        out.explanation = (
            f"{gib:,.2f} GiB holds {fmt_int(out.predicted_tokens)} tokens as vLLM counts them (predicted); "
            "vLLM logged no KV cache size (it stopped before)"
        )
    else:
        out.work.append(Step("logged tokens", _logged_from(inp), fmt_int(out.logged_tokens)))
        diff = (out.logged_tokens - out.predicted_tokens) / out.predicted_tokens * 100 if out.predicted_tokens else None
        out.difference_pct = None if diff is None else round(diff, 1)
        out.explanation = _explain(inp, out, km, measured)
        out.work.append(
            Step("difference", "(logged - predicted) / predicted", "n/a" if diff is None else f"{diff:+.1f}%")
        )
    if v1 and blocks:
        out.work.append(Step("longest sequence", "the largest length whose request fits beside 1 null block",
                             fmt_int(out.longest_sequence)))  # fmt: skip
    return out


def _per_group(km: KvModel, length: int) -> str:
    from vllm_doctor.capacity import kvcache

    windowed = any(g.kind in ("sliding", "chunked") for g in km.layout.groups)
    text = kvcache.request_breakdown(km.layout, length, km.in_flight)
    return text + (f" (in flight: {km.in_flight_from})" if windowed else "")


def _tokens_work(km: KvModel, got, blocks: int, length: int) -> str:
    from vllm_doctor.capacity.arithmetic import fmt_int
    from vllm_doctor.versions import version_tuple

    v = version_tuple(km.vllm_version, unknown=(99,))
    if km.v0 or v < (0, 9, 1):
        return f"{fmt_int(blocks)} blocks x {km.layout.block_size}"
    conc = f"concurrency {fmt_int(blocks)} / {fmt_int(got.blocks_per_request)} = {got.concurrency:.2f}x"
    if v < (0, 21):
        return f"{fmt_int(blocks)} blocks // {len(km.layout.groups)} groups x {km.layout.block_size} ({conc})"
    return f"int({conc} x {fmt_int(length)})"


def _longest(km: KvModel, budget: int, blocks: int, v1: bool) -> int:
    """V1: vLLM's estimate (the largest length that fits beside the null block); V0: blocks x size."""
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity import kvcache

    if not v1:
        return cap.largest_max_model_len(blocks, km.layout.block_size, False)
    if not km.modelled:
        return cap.largest_max_model_len(blocks, km.layout.block_size, True)
    upper = max(km.max_model_len or 0, km.shape.derived_max_model_len or 0) or 1 << 24
    room = budget - km.layout.page_bytes
    return kvcache.estimate_max_len(km.layout, room, upper, km.in_flight) if room > 0 else 0


def _logged_from(inp: CheckInput) -> str:
    how = inp.get("kv_cache.tokens_from")
    line = inp.facts.where.get("kv_cache.tokens")
    text = "the log's KV cache size line" if how in (None, "log") else f"the log's {how}"
    return text + (f" (line {line})" if line else "")


def _explain(inp: CheckInput, out: CrossCheck, km: KvModel, measured: bool) -> str:
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity.arithmetic import fmt_int

    diff = out.difference_pct
    if diff is None:
        return "no KV cache memory to predict from"
    null = ""
    if is_v1(inp):
        null = f" One block is the null block, so one sequence can use at most {fmt_int(out.longest_sequence or 0)} tokens."
    if abs(diff) <= cap.AGREEMENT_PCT:
        how = (
            "as V1's hybrid manager groups its layers"
            if km.modelled
            else f"at {fmt_int(out.kv_bytes_per_token or 0)} B per token"
        )
        return (
            f"agrees within {cap.AGREEMENT_PCT:.0f}%: {out.kv_memory_gib:,.2f} GiB {how} "
            f"holds {fmt_int(out.predicted_tokens or 0)} tokens; vLLM logged {fmt_int(out.logged_tokens or 0)}.{null}"
        )
    reasons = []
    if not measured:
        reasons.append("the activation peak, non-torch memory or CUDA graphs are missing from the log's profile")
    if km.tp > 1:
        reasons.append(f"tensor parallelism {km.tp}: the smallest GPU's cache decides for all")
    if inp.get("memory.free_gib") is not None and inp.get("memory.total_gib") is not None:
        held = float(inp.get("memory.total_gib")) - float(inp.get("memory.free_gib"))
        if held > 0.5:
            reasons.append(f"other processes held {held:.1f} GiB of the GPU at startup")
    ratio = (out.logged_tokens or 0) / out.predicted_tokens if out.predicted_tokens else 0
    if 1.8 < ratio < 2.2 and not str(inp.get("kv_cache_dtype") or "").startswith("fp8"):
        reasons.append("about twice the prediction: an fp8 KV cache the log does not state?")
    if km.modelled and not km.block_size_said:
        reasons.append(f"the block size ({km.layout.block_size}) is assumed: the log does not say it")
    if not reasons:
        reasons.append("check that the config is the model the log served (layers, KV heads, head size, dtype)")
    return f"differs by {diff:+.1f}%: " + "; ".join(reasons)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
