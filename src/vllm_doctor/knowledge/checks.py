"""The named checks rules ask for: the few computations that turn matched numbers into decisions.

Each check reads the values known so far (facts, the rule's matched groups, earlier checks) and
returns new named values; rules use them in `when` conditions, summaries and fixes. One explicit
registry (CHECKS), no discovery. Every check declares the names it reads and the names it may
return (`@check(reads=..., returns=...)`): `rules check` holds a rule's templates and conditions
against those returns, and `rules show` lists them. A check returns a CheckResult: its values,
plus evidence it contributes and a lowered confidence as typed fields, never as magic keys.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm_doctor.knowledge.contract import Check, CheckInput, CheckResult, Options, check
from vllm_doctor.knowledge.kvmodel import READS as _KV_MODEL_READS
from vllm_doctor.knowledge.kvmodel import block_size, hybrid_target, is_v1, kv_model
from vllm_doctor.knowledge.parallel import quant_tp
from vllm_doctor.knowledge.phases import oom_phase, shutdown
from vllm_doctor.knowledge.runtime import (
    decode_speed,
    preemption_rate,
    prefill_stall,
    prefix_reuse,
    replica_balance,
    request_errors,
    ttft_split,
)
from vllm_doctor.knowledge.sizing import WEIGHTS_READS, gpu_sharing, tp_unneeded, weights_per_gpu
from vllm_doctor.knowledge.startask import start_model
from vllm_doctor.knowledge.tracebacks import failure_site, fatal_context, hub_target, log_names
from vllm_doctor.knowledge.traffic import prompt_budget, queue_kind, request_limit

if TYPE_CHECKING:  # the model module loads only when a model is involved
    from vllm_doctor.capacity.modelcfg import ModelShape

__all__ = [
    "CHECKS",
    "Check",
    "CheckInput",
    "CheckResult",
    "Options",
    "block_size",
    "is_v1",
]  # the contract types, for callers

DEFAULT_BLOCK_SIZE = 16  # vLLM's block size on CUDA when the log does not say (kvmodel.block_size)
CONFIG_AGREES = 0.01  # config.json's cache for one sequence within 1% of vLLM's printed figure
MAX_TP_LISTED = 8  # tensor-parallel sizes listed when the GPU count is unknown


# the names the shared helpers read, for the declarations of the checks that call them
_BLOCK_READS = {"block_size", "kv_cache.block_size", "vllm_version", "device"}
_V1_READS = {"engine", "vllm_version"}
_MODEL_KV_READS = {"kv_cache_dtype", "dtype", "tp", "tensor_parallel_size"}
_GPU_NOW = {"gpu_used_by_others_gib", "gpu_free_utilization", "gpu_processes", "lower_utilization"}


@dataclass
class _ModelFit:
    """What the model's config adds to kv_fit: `values` for the rule; `needed_gib` (the cache one
    max-length sequence needs) and `fit` (the longest length the available memory holds) are
    used only when the log does not say them."""

    values: dict[str, Any] = field(default_factory=dict)
    needed_gib: float | None = None
    fit: int | None = None
    fp8_fits: bool | None = None  # the startup check with a 1-byte KV element, from the config
    exact_budget: bool = False  # the fit is from --kv-cache-memory-bytes, not from the log's rounded GiB


def _from_model(inp: CheckInput) -> _ModelFit:
    """Bytes per token, the cache one max-length sequence needs, the longest length the available
    memory holds (V1's startup check and its estimate, kvcache.py), and the smallest TP size that fits."""
    km = kv_model(inp)
    out = _ModelFit()
    if km is None:
        return out
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity import kvcache
    from vllm_doctor.capacity.weights import FROM_HEADERS

    shape, tp = km.shape, km.tp
    bpt = cap.kv_bytes_per_token(shape, km.element_bytes, tp)
    out.values["kv_bytes_per_token"] = bpt
    length = km.max_model_len
    available = inp.get("available_gib", "kv_cache.available_gib")
    if length:
        out.needed_gib = round(kvcache.needed_bytes(km.layout, length, km.in_flight) / cap.GIB, 2)
    if available is None:
        return out
    room = km.budget_bytes(float(available))
    out.exact_budget = room == km.exact_budget
    if km.element_bytes > 1:
        out.fp8_fits = km.fits_with(1.0, room)
    if km.modelled:  # vLLM's search, not capped at the length asked for: a fit above it is a contradiction
        upper = max(length or 0, shape.derived_max_model_len or 0, 1 << 24)
        usable = room - km.layout.page_bytes  # the null block held back
        out.fit = kvcache.estimate_max_len(km.layout, usable, upper, km.in_flight) if usable > 0 else 0
    else:
        bsize = km.layout.block_size
        out.fit = cap.largest_max_model_len(cap.blocks_that_fit(room, bpt, bsize), bsize, is_v1(inp))
    if length:
        weights_bytes, weights_from = weights_per_gpu(inp, shape, tp)
        if weights_from:  # not vLLM's own "Model loading took": say where the figure comes from
            gib = round(weights_bytes / cap.GIB, 2)
            exact = weights_from == FROM_HEADERS
            out.values["weights_per_gpu_gib" if exact else "weights_estimated_gib"] = gib
            note = f"{gib} GiB per GPU {weights_from}" if exact else f"about {gib} GiB per GPU, {weights_from}"
            out.values["weights_note"] = "weights " + note
        sizes = cap.valid_tp_sizes(shape.attention_heads or None, shape.kv_heads, _tp_limit(inp, tp))
        nccl = 0.0 if str(inp.get("device") or "").lower() == "cpu" else 0.5 * cap.GIB  # as startask re-asks it
        fit_tp = cap.smallest_tp_that_fits(shape, km.element_bytes, int(length), km.layout.block_size, room,
                                           weights_bytes, tp, sizes, km.in_flight, nccl)  # fmt: skip
        if fit_tp:
            out.values["fit_tp_size"] = fit_tp
    return out


def _tp_limit(inp: CheckInput, tp: int | None) -> int:
    """TP sizes are listed up to the GPUs present when NVML sees them, else up to 8."""
    snap = inp.options.gpu_snapshot
    if snap is not None and snap.available and snap.devices:
        return len(snap.devices)
    return max(MAX_TP_LISTED, min(int(tp), 1024) if tp else 0)  # a damaged log's tp=10**20 lists no 10**20 sizes


def _gpu_now(inp: CheckInput) -> dict[str, Any]:
    """Which way to move --gpu-memory-utilization on this machine: other processes holding GPU
    memory mean vLLM's fraction must shrink to what is free."""
    snap = inp.options.gpu_snapshot
    if snap is None or not snap.available or not snap.devices:
        return {}
    from vllm_doctor.capacity.gpu import headroom

    busiest = min(snap.devices, key=lambda d: d.free_mib / d.total_mib)
    out: dict[str, Any] = {
        "gpu_used_by_others_gib": round(busiest.used_mib / 1024, 2),
        "gpu_free_utilization": headroom(busiest),
        "gpu_processes": len(busiest.processes),
    }
    util = inp.get("gpu_memory_utilization")
    if util is not None and busiest.used_mib:
        out["lower_utilization"] = float(util) > out["gpu_free_utilization"]
    return out


@check(
    reads=_BLOCK_READS | _V1_READS | _MODEL_KV_READS | _KV_MODEL_READS | WEIGHTS_READS
    | {"max_model_len", "available_gib", "kv_cache.available_gib", "memory.weights_gib", "weights_gib",
       "estimated_max_len", "kv_cache.estimated_max_model_len", "kv_tokens", "gpu_blocks", "kv_cache.gpu_blocks",
       "kv_cache.tokens", "needed_gib", "gpu_memory_utilization", "memory.total_gib"},
    returns=_GPU_NOW
    | {"kv_bytes_per_token", "fit_tp_size", "fit_from", "block_size", "block_size_assumed", "fit_max_model_len",
       "needed_gib", "missing_gib", "fp8_kv_fits", "utilization_needed", "utilization_needed_unsafe",
       "can_raise_utilization", "raised_utilization", "weights_per_gpu_gib", "weights_estimated_gib", "weights_note",
       "fit_disagreement", "arithmetic_max_len"},
)  # fmt: skip
def kv_fit(inp: CheckInput) -> CheckResult:
    """The largest --max-model-len the cache holds, and whether other levers would reach it."""
    model = _from_model(inp)
    out: dict[str, Any] = model.values
    out.update(_gpu_now(inp))
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
        if fit is None and model.fit is not None:
            fit = model.fit  # the log gave memory, not tokens: the config's bytes per token
            out["fit_from"] = "model config"
        needed, available, length = inp.get("needed_gib"), inp.get("available_gib"), inp.get("max_model_len")
        if fit is None and needed and available is not None and length:
            # 0.7-0.9.0 print no estimate: the cache one sequence needs grows with its length
            fit = int(int(length) * float(available) / float(needed)) // bsize * bsize
            out["fit_from"] = "needed vs available memory"
        if fit is not None:
            out["block_size"] = bsize
            if not known:
                out["block_size_assumed"] = True
    disagreement = _disagreement(inp, out, fit, model)
    if disagreement:  # vLLM's figures contradict each other or the arithmetic: no fit is stated, nor fixed to
        out["fit_disagreement"] = disagreement
        if fit is not None:
            out["arithmetic_max_len"] = int(fit)
        if _config_differs(model, inp.get("needed_gib")):  # nor anything else sized from that config
            out.pop("fit_tp_size", None)
            model.fp8_fits = None
    elif fit is not None:
        out["fit_max_model_len"] = int(fit)
    needed, available = inp.get("needed_gib"), inp.get("available_gib", "kv_cache.available_gib")
    if needed is None and model.needed_gib is not None:
        needed = out["needed_gib"] = model.needed_gib
    util = inp.get("gpu_memory_utilization")
    total = inp.get("memory.total_gib")
    if needed is not None and available is not None:
        if float(needed) > float(available):
            out["missing_gib"] = round(float(needed) - float(available), 2)
        kv_dtype = str(inp.get("kv_cache_dtype") or "auto")
        if not kv_dtype.startswith("fp8"):
            halved = 2 * float(available) >= float(needed)  # rounded GiB: the config's check when known
            out["fp8_kv_fits"] = model.fp8_fits if model.fp8_fits is not None else halved
        if util is not None and total:
            from vllm_doctor.capacity import arithmetic as cap

            want = cap.utilization_needed(float(util), float(needed), float(available), float(total))
            out["utilization_needed"], out["utilization_needed_unsafe"] = want, want > cap.SAFE_UTILIZATION
    if util is not None:  # raised to the release's default (0.92 from 0.20; 0.90 before), never past 0.95
        from vllm_doctor.capacity.defaults import backend, raise_target

        target = raise_target(inp.get("vllm_version"), backend(inp.get("device")))
        out["can_raise_utilization"] = float(util) < target
        out["raised_utilization"] = target
    return CheckResult(out, confidence="medium" if disagreement else None)


def _disagreement(inp: CheckInput, out: dict[str, Any], fit: Any, model: _ModelFit) -> str | None:
    """Why no longest length can be stated, naming vLLM's figures; None when the fit stands. vLLM
    raises only when the bytes needed exceed the bytes available, both printed at 0.01 GiB, so its
    printed needed is never below its printed available, and when the two print alike a fit from the
    rounded GiB is within the rounding. A config whose cache for one sequence is not vLLM's, or a fit
    at or above the length vLLM refused, is not the model vLLM sized."""
    length = inp.get("max_model_len")
    needed, available = inp.get("needed_gib"), inp.get("available_gib", "kv_cache.available_gib")
    printed = needed is not None and available is not None
    if printed and float(needed) < float(available):
        return (f"vLLM raises only when the cache needed is above the cache available, yet its message shows "
                f"{needed} GiB needed and {available} GiB available: the figures were edited or come from "
                "different runs")  # fmt: skip
    if fit is None or not length:
        return None
    how = out.get("fit_from")
    rounded = how == "needed vs available memory" or how == "model config" and not model.exact_budget
    if printed and float(needed) == float(available) and rounded:  # a fit from the rounded GiB is within it
        return (f"vLLM's two figures round to the same {needed} GiB: the cache is less than 0.01 GiB short, too "
                "little for the printed figures to tell how much shorter the sequence must be")  # fmt: skip
    if how == "model config" and _config_differs(model, needed):
        return (f"config.json's arithmetic ({out.get('kv_bytes_per_token', 0):,} B per token) gives "
                f"{model.needed_gib} GiB for one sequence where vLLM says {needed} GiB, and {int(fit)} tokens as "
                "the longest: check that the config is the model the server ran")  # fmt: skip
    if int(fit) < int(length):
        return None
    source = "config.json's arithmetic" if how == "model config" else "the arithmetic from vLLM's figures"
    return f"{source} gives {int(fit)} tokens, not below the {length} vLLM refused"


def _config_differs(model: _ModelFit, needed: Any) -> bool:
    """config.json's cache for one max-length sequence is not the one vLLM printed."""
    if model.needed_gib is None or needed is None:
        return False
    return abs(model.needed_gib - float(needed)) > max(0.01, CONFIG_AGREES * float(needed))


@check(
    reads={"heads", "num_attention_heads", "kv_heads", "num_kv_heads", "dimension", "tp", "tensor_parallel_size"},
    returns={"num_attention_heads", "num_kv_heads", "gpus_present", "valid_tp_sizes", "tp_below", "tp_above"},
)
def tp_sizes(inp: CheckInput) -> CheckResult:
    """Tensor-parallel sizes that divide what the model splits, by vLLM's rules."""
    heads = inp.get("heads", "num_attention_heads")
    kv_heads = inp.get("kv_heads", "num_kv_heads")
    dimension = inp.get("dimension")
    tp = inp.get("tp", "tensor_parallel_size")
    out: dict[str, Any] = {}
    shape = inp.options.shape
    if shape is not None:  # the model's config fills what the log does not say
        if heads is None and shape.attention_heads:
            heads = out["num_attention_heads"] = shape.attention_heads
        if kv_heads is None:
            kv_heads = out["num_kv_heads"] = shape.kv_heads
    limit = _tp_limit(inp, tp)
    snap = inp.options.gpu_snapshot
    if snap is not None and snap.available:
        out["gpus_present"] = len(snap.devices)
    if heads is None and kv_heads is None and dimension is None:
        return CheckResult(out)

    from vllm_doctor.capacity.arithmetic import tp_ok

    def ok(t: int) -> bool:
        if not tp_ok(t, int(heads) if heads is not None else None, int(kv_heads) if kv_heads else None):
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
    return CheckResult(out)


# what rope_advice() adds to context_limit
_ROPE = {"model_max_position_embeddings", "rope_scaling_type", "rope_scaling_factor", "rope_override_reasonable",
         "rope_note", "rope_factor_needed", "rope_hf_overrides"}  # fmt: skip


@check(
    reads={"derived_max_model_len", "max_len_key", "requested_max_model_len", "max_model_len"},
    returns=_ROPE | {"derived_max_model_len", "max_len_key", "suggested_max_model_len", "over_by"},
)
def context_limit(inp: CheckInput) -> CheckResult:
    """The model's derived maximum, as the --max-model-len to use, and whether rope scaling makes
    going past it reasonable."""
    derived = inp.get("derived_max_model_len")
    shape = inp.options.shape
    out: dict[str, Any] = {}
    if derived is None and shape is not None and shape.derived_max_model_len:
        derived = out["derived_max_model_len"] = shape.derived_max_model_len
        if inp.get("max_len_key") is None:
            out["max_len_key"] = shape.max_len_key
    if derived is None:
        return CheckResult(out)
    out["suggested_max_model_len"] = int(float(derived))
    requested = inp.get("requested_max_model_len", "max_model_len")
    if requested is not None:
        out["over_by"] = int(requested) - out["suggested_max_model_len"]
    if shape is not None:
        out.update(
            rope_advice(shape, int(requested) if requested is not None else None, out["suggested_max_model_len"])
        )
    return CheckResult(out)


# model types whose positions are rotary even when config.json names no rope key
ROPE_MODEL_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                    "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3", "internlm2", "yi", "baichuan", "cohere"}  # fmt: skip


def rope_advice(shape: ModelShape, requested: int | None, derived: int) -> dict[str, Any]:
    """Whether a --max-model-len above the derived maximum is reasonable, from config.json's
    rope_scaling: dynamic scaling stretches on its own; configured scaling is already counted in
    the maximum; rotary positions without scaling can be extended with YaRN (--hf-overrides)."""
    rope = shape.rope_scaling or {}
    rtype = str(rope.get("rope_type") or rope.get("type") or "default")
    scaled = rtype not in ("default", "none")
    out: dict[str, Any] = {"model_max_position_embeddings": shape.max_position_embeddings}
    if scaled:
        out.update(rope_scaling_type=rtype, rope_scaling_factor=rope.get("factor"))
    if requested is None or requested <= derived:
        return out
    base = shape.max_position_embeddings or derived
    t = shape.text_config
    rotary = any(k in t for k in ("rope_theta", "rope_scaling", "rope_parameters", "rotary_dim", "rotary_pct"))
    if rtype == "dynamic":
        out["rope_override_reasonable"] = True
        out["rope_note"] = "dynamic rope scaling stretches past the trained length by itself"
    elif scaled:
        out["rope_override_reasonable"] = False
        out["rope_note"] = (
            f"rope scaling ({rtype}, factor {rope.get('factor')}) is already counted in the {derived}-token maximum"
        )
    elif rotary or shape.model_type in ROPE_MODEL_TYPES:
        factor = math.ceil(requested / base)
        out["rope_override_reasonable"] = False
        out["rope_factor_needed"] = factor
        yarn = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": base}
        out["rope_hf_overrides"] = json.dumps({"rope_scaling": yarn, "max_position_embeddings": base * factor})
        out["rope_note"] = (
            f"no rope scaling in config.json: the model was trained to {base} tokens and degrades past it; "
            f"YaRN scaling with factor {factor} extends it"
        )
    else:
        out["rope_override_reasonable"] = False
        out["rope_note"] = "the model's positions are not rotary: it cannot attend past its maximum"
    return out


@check(reads={"free_gib", "total_gib"}, returns={"held_by_others_gib", "suggested_utilization"})
def gpu_headroom(inp: CheckInput) -> CheckResult:
    """The --gpu-memory-utilization that fits in what is actually free."""
    free, total = inp.get("free_gib"), inp.get("total_gib")
    if free is None or not total:
        return CheckResult()
    fraction = math.floor((float(free) / float(total) - 0.02) * 100) / 100
    return CheckResult(
        {"held_by_others_gib": round(float(total) - float(free), 2), "suggested_utilization": max(0.05, fraction)}
    )


@check(
    reads=_BLOCK_READS | _KV_MODEL_READS
    | {"kv_cache.tokens", "kv_cache.gpu_blocks", "max_model_len", "kv_cache.concurrency_tokens",
       "kv_cache.max_concurrency", "kv_cache.available_gib"},
    returns={"tokens_from_blocks", "block_size_assumed", "kv_tokens", "max_model_len", "worst_case_sequences",
             "target_concurrency", "target_len", "target_tokens", "can_hold_target", "missing_tokens",
             "target_max_model_len"},
)  # fmt: skip
def concurrency_budget(inp: CheckInput) -> CheckResult:
    """KV tokens, the worst-case sequences at max-model-len, and a target the operator names."""
    bsize, known = block_size(inp)
    tokens = inp.get("kv_cache.tokens")
    out: dict[str, Any] = {}
    if tokens is None:
        blocks = inp.get("kv_cache.gpu_blocks")
        if blocks is None:
            return CheckResult(out)
        tokens = int(blocks) * bsize
        out["tokens_from_blocks"] = True
        if not known:
            out["block_size_assumed"] = bsize
    out["kv_tokens"] = int(tokens)
    length = inp.get("max_model_len", "kv_cache.concurrency_tokens")
    if length:
        out["max_model_len"] = int(length)
        out["worst_case_sequences"] = int(tokens) // int(length)
        printed = inp.get("kv_cache.max_concurrency")  # (a mangled line's 400-digit run reads as inf: no figure)
        if (
            printed is not None
            and math.isfinite(float(printed))
            and inp.get("kv_cache.concurrency_tokens") in (None, int(length))
        ):
            # vLLM's own figure: hybrid and sliding-window models hold more than tokens / length
            out["worst_case_sequences"] = int(float(printed))
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
            hybrid = hybrid_target(inp, int(target), int(target_len))
            if hybrid:  # windowed or Mamba layers: by blocks per request, as vLLM admits requests
                out.update(hybrid)
                out["missing_tokens"] = 0 if hybrid["can_hold_target"] else out["missing_tokens"]
    return CheckResult(out)


# the one registry: a rule's `checks = [...]` names these
CHECKS: dict[str, Check] = {
    c.name: c
    for c in (
        kv_fit,
        tp_sizes,
        context_limit,
        request_limit,
        queue_kind,
        oom_phase,
        gpu_headroom,
        shutdown,
        concurrency_budget,
        failure_site,
        fatal_context,
        hub_target,
        quant_tp,
        prompt_budget,
        decode_speed,
        prefill_stall,
        ttft_split,
        prefix_reuse,
        preemption_rate,
        request_errors,
        replica_balance,
        tp_unneeded,
        gpu_sharing,
        start_model,
        log_names,
    )
}
