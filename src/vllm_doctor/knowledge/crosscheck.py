"""Predicted against logged: the KV tokens the model's config says the log's cache memory holds,
held against the size vLLM printed, with the reason when they differ (facts.capacity).

The prediction is the capacity arithmetic (capacity.py) applied to what the log says the KV cache
got: V1's "Available KV cache memory" or the CPU backend's "set (X/Y) GiB for KV cache", V0's
"the rest of the memory reserved for KV Cache", or the memory profile's parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_doctor.knowledge.checks import CheckInput, block_size, is_v1, model_kv

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
    known = model_kv(inp)
    if known is None:
        out.explanation = (
            f"no model config: {model_note}" if model_note else "no model config (pass --model or --config)"
        )
        return out
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity.arithmetic import Step, fmt_int

    shape, element, dtype, tp, bpt = known
    out.kv_bytes_per_token = bpt
    bsize, said = block_size(inp)
    out.block_size = bsize
    out.work.append(Step("KV bytes per token", cap.kv_formula(shape, element, dtype, tp), f"{fmt_int(bpt)} B"))
    memory = kv_memory(inp)
    if memory is None:
        out.explanation = "the log does not say how much memory the KV cache got, so there is nothing to predict from"
        return out
    gib, source, measured = memory
    out.kv_memory_gib, out.kv_memory_source = round(gib, 2), source
    line = inp.facts.where.get("kv_cache.available_gib") or inp.facts.where.get("memory.kv_gib")
    out.work.append(Step("KV cache memory", source + (f" (line {line})" if line else ""), f"{gib:,.2f} GiB"))
    blocks = cap.blocks_that_fit(gib * cap.GIB, bpt, bsize)
    out.predicted_tokens = blocks * bsize
    assumed = "" if said else " (assumed: the log does not say)"
    out.work.append(
        Step(
            "predicted tokens",
            f"{gib:,.2f} GiB / {fmt_int(bpt)} B, in whole blocks of {bsize}{assumed}",
            fmt_int(out.predicted_tokens),
        )  # fmt: skip
    )
    v1 = is_v1(inp)
    out.longest_sequence = cap.largest_max_model_len(blocks, bsize, v1)
    if out.logged_tokens is None:
        out.explanation = (
            f"{gib:,.2f} GiB at {fmt_int(bpt)} B per token holds {fmt_int(out.predicted_tokens)} tokens (predicted); "
            "vLLM logged no KV cache size (it stopped before)"
        )
    else:
        out.work.append(Step("logged tokens", _logged_from(inp), fmt_int(out.logged_tokens)))
        diff = (out.logged_tokens - out.predicted_tokens) / out.predicted_tokens * 100 if out.predicted_tokens else None
        out.difference_pct = None if diff is None else round(diff, 1)
        out.explanation = _explain(inp, out, shape, tp, measured)
        out.work.append(
            Step("difference", "(logged - predicted) / predicted", "n/a" if diff is None else f"{diff:+.1f}%")
        )
    if v1 and blocks:
        out.work.append(
            Step(
                "longest sequence",
                f"({fmt_int(blocks)} blocks - 1 null block) x {bsize}",
                fmt_int(out.longest_sequence),
            )
        )
    return out


def _logged_from(inp: CheckInput) -> str:
    how = inp.get("kv_cache.tokens_from")
    line = inp.facts.where.get("kv_cache.tokens")
    text = "the log's KV cache size line" if how in (None, "log") else f"the log's {how}"
    return text + (f" (line {line})" if line else "")


def _explain(inp: CheckInput, out: CrossCheck, shape, tp: int, measured: bool) -> str:
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity.arithmetic import fmt_int

    diff = out.difference_pct
    if diff is None:
        return "no KV cache memory to predict from"
    null = ""
    if is_v1(inp):
        null = f" One block is the null block, so one sequence can use at most {fmt_int(out.longest_sequence or 0)} tokens."
    if abs(diff) <= cap.AGREEMENT_PCT:
        return (
            f"agrees within {cap.AGREEMENT_PCT:.0f}%: {out.kv_memory_gib:,.2f} GiB at {fmt_int(out.kv_bytes_per_token or 0)} B "
            f"per token holds {fmt_int(out.predicted_tokens or 0)} tokens; vLLM logged {fmt_int(out.logged_tokens or 0)}.{null}"
        )
    reasons = []
    if shape.sliding_layers:
        reasons.append(
            f"{shape.sliding_layers} sliding-window layers: V1 groups them apart and reports tokens per group, "
            "so its count is not memory / bytes per token"
        )
    if not measured:
        reasons.append("the activation peak, non-torch memory or CUDA graphs are missing from the log's profile")
    if tp > 1:
        reasons.append(f"tensor parallelism {tp}: the smallest GPU's cache decides for all")
    if inp.get("memory.free_gib") is not None and inp.get("memory.total_gib") is not None:
        held = float(inp.get("memory.total_gib")) - float(inp.get("memory.free_gib"))
        if held > 0.5:
            reasons.append(f"other processes held {held:.1f} GiB of the GPU at startup")
    ratio = (out.logged_tokens or 0) / out.predicted_tokens if out.predicted_tokens else 0
    if 1.8 < ratio < 2.2 and not str(inp.get("kv_cache_dtype") or "").startswith("fp8"):
        reasons.append("about twice the prediction: an fp8 KV cache the log does not state?")
    if not reasons:
        reasons.append("check that the config is the model the log served (layers, KV heads, head size, dtype)")
    return f"differs by {diff:+.1f}%: " + "; ".join(reasons)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
