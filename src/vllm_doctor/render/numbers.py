"""A diagnosis's numbers as a person reads them: what each one means and its unit, never the
internal key ("KV cache needed 4 GiB", not "needed_gib 4"), and unknown values left out.

LABELS holds the numbers rules and checks report most; any other name reads as its words with
the unit its suffix names (`held_by_others_gib` -> "held by others … GiB"). Flags that only steer
a rule's choice of wording (`survived`, `block_size_assumed`, ...) are not numbers and are left out.
"""

from __future__ import annotations

from typing import Any

from vllm_doctor.matching.expr import fmt

# name -> (meaning, unit); "" for no unit
LABELS: dict[str, tuple[str, str]] = {
    "max_model_len": ("--max-model-len", "tokens"),
    "needed_gib": ("KV cache needed", "GiB"),
    "available_gib": ("KV cache available", "GiB"),
    "missing_gib": ("KV cache missing", "GiB"),
    "estimated_max_len": ("longest sequence vLLM estimates fits", "tokens"),
    "fit_max_model_len": ("longest --max-model-len that fits", "tokens"),
    "arithmetic_max_len": ("longest length by the arithmetic (not trusted: see the summary)", "tokens"),
    "fp8_kv_fits": ("fits with an fp8 KV cache", ""),
    "kv_tokens": ("KV cache", "tokens"),
    "kv_cache.tokens": ("KV cache", "tokens"),
    "worst_case_sequences": ("sequences of --max-model-len that fit at once", ""),
    "gpu_memory_utilization": ("--gpu-memory-utilization", ""),
    "raised_utilization": ("--gpu-memory-utilization to try", ""),
    "suggested_utilization": ("--gpu-memory-utilization that fits what is free", ""),
    "gpu_used_by_others_gib": ("GPU memory other processes hold on this machine now", "GiB"),
    "gpu_free_utilization": ("--gpu-memory-utilization that fits what is free now", ""),
    "gpu_processes": ("processes on this machine's GPU now", ""),
    "weights_gib": ("model weights", "GiB"),
    "weights_per_gpu_gib": ("model weights per GPU (safetensors headers)", "GiB"),
    "weights_estimated_gib": ("model weights per GPU, estimated from the shape", "GiB"),
    "free_gib": ("memory free", "GiB"),
    "total_gib": ("memory in total", "GiB"),
    "requested_gib": ("memory requested", "GiB"),
    "held_by_others_gib": ("memory held by other processes", "GiB"),
    "kv_gib": ("KV cache requested", "GiB"),
    "block_size": ("tokens per KV block", ""),
    "tensor_parallel_size": ("--tensor-parallel-size", ""),
    "tp": ("--tensor-parallel-size", ""),
    "valid_tp_sizes": ("tensor-parallel sizes that divide the model", ""),
    "tp_below": ("nearest valid tensor-parallel size below", ""),
    "tp_above": ("nearest valid tensor-parallel size above", ""),
    "heads": ("attention heads", ""),
    "num_attention_heads": ("attention heads", ""),
    "num_heads": ("attention heads", ""),
    "kv_heads": ("KV heads", ""),
    "num_kv_heads": ("KV heads", ""),
    "gpu_count": ("GPUs present", ""),
    "gpus_present": ("GPUs present", ""),
    "world_size": ("GPUs the parallel sizes need", ""),
    "derived_max_model_len": ("longest length the model's config allows", "tokens"),
    "requested_max_model_len": ("--max-model-len asked for", "tokens"),
    "suggested_max_model_len": ("--max-model-len to use", "tokens"),
    "over_by": ("over the limit by", "tokens"),
    "limit": ("the limit", "tokens"),
    "prompt_tokens": ("prompt", "tokens"),
    "total_tokens": ("prompt and output", "tokens"),
    "max_tokens": ("max_tokens asked for", "tokens"),
    "max_tokens_allowed": ("largest max_tokens allowed", "tokens"),
    "budget_tokens": ("tokens per scheduler step (--max-num-batched-tokens)", "tokens"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "tokens"),
    "max_num_seqs": ("--max-num-seqs", "sequences"),
    "waiting_max": ("most requests waiting", "requests"),
    "waiting_samples": ("stats samples with requests waiting", ""),
    "stats_samples": ("stats samples", ""),
    "kv_usage_max_pct": ("highest KV cache usage", "%"),
    "waiting_kv_max_pct": ("highest KV cache usage while requests waited", "%"),
    "kv_near_full_pct": ("KV cache usage counted as full", "%"),
    "preemptions": ("preemptions seen", ""),
    "running_while_waiting_max": ("most requests running while others waited", "requests"),
    "full_run_max": ("longest run of samples with a full cache", "samples"),
    "x": ("max concurrency at --max-model-len", "x"),
    "len": ("tokens per request", "tokens"),
    "timeout_s": ("timeout", "s"),
    "ran_ms": ("ran for", "ms"),
    "seconds": ("waited", "s"),
    "alloc": ("allocation that failed", ""),  # PyTorch's out-of-memory figures: each with its own unit
    "total": ("GPU memory in total", ""),
    "free": ("GPU memory free", ""),
    "port": ("port", ""),
    "status": ("HTTP status", ""),
}
# words that steer a rule's choice of wording: not numbers a person needs
_HIDDEN = {
    "survived", "fatal_here", "during_shutdown", "shutdown_completed", "block_size_assumed", "limit_is_budget",
    "limit_is_max_model_len", "multi_gpu", "single_gpu", "failure_found", "can_raise_utilization", "queue_kind",
    "oom_phase_name", "fit_from", "alloc_unit", "free_unit", "total_unit", "missing", "lower_utilization",
    "weights_note", "fit_disagreement",
}  # fmt: skip
_SUFFIX = {"_gib": "GiB", "_mib": "MiB", "_pct": "%", "_bytes": "bytes", "_tokens": "tokens", "_ms": "ms", "_s": "s"}


def label(name: str, numbers: dict[str, Any] | None = None) -> tuple[str, str]:
    """A number's meaning and unit; a unit the message stated beside it (`free_unit`: "MiB") wins."""
    stated = (numbers or {}).get(f"{name}_unit")
    if isinstance(stated, str) and stated:
        return label(name)[0], stated
    if name in LABELS:
        return LABELS[name]
    base = name.rsplit(".", 1)[-1]
    for suffix, unit in _SUFFIX.items():
        if base.endswith(suffix):
            return base[: -len(suffix)].replace("_", " "), unit
    return base.replace("_", " "), ""


def value_with_unit(value: Any, unit: str) -> str:
    text = fmt(value)
    if not unit:
        return text
    return f"{text}{unit}" if unit in ("%", "x") else f"{text} {unit}"


def described(numbers: dict[str, Any]) -> list[tuple[str, str]]:
    """(meaning, value with unit) of every known number, in the rule's order, each meaning once."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for name, value in numbers.items():
        if value is None or value == "" or value == [] or name in _HIDDEN:
            continue
        meaning, unit = label(name, numbers)
        if meaning in seen:
            continue
        seen.add(meaning)
        out.append((meaning, value_with_unit(value, unit)))
    return out
