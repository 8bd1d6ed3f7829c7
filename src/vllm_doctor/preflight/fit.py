"""Does this start fit: the weights, the KV cache and one --max-model-len sequence on the GPUs it
will use (capacity/plan.py's budget over the NVML snapshot), or in VLLM_CPU_KVCACHE_SPACE on the CPU
backend; and is --max-model-len within what the model's config.json allows."""

from __future__ import annotations

import dataclasses

from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity.arithmetic import GIB, fmt_int, fmt_size
from vllm_doctor.capacity.shape import ModelShape
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, Fix, blocker, info, warning

# vLLM 0.32's CPU backend uses 128-token blocks: the lab's cache-oom-boundary refuses 8192 tokens in
# 1 GiB at 131,072 B/token and offers 8064 = (64 - 1 null block) x 128
CPU_BLOCK_SIZE = 128
OVERHEAD_SPAN = 4 * cap.GB  # vLLM measures activation peak + non-torch + CUDA graphs at startup: 1-4 GB seen


def max_len(ctx: Context, shape: ModelShape) -> tuple[int, str]:
    given = ctx.args.integer("max_model_len")
    if given:
        return given, "--max-model-len"
    if not shape.derived_max_model_len:
        raise CannotRun("the model's maximum length is unknown (no max_position_embeddings); give --max-model-len")
    return shape.derived_max_model_len, f"the model's maximum ({shape.max_len_key})"


def fit(ctx: Context) -> list[Finding]:
    """Weights, KV cache and one max-length sequence at these flags, on the GPUs or the CPU."""
    if ctx.backend == "cpu":
        return _cpu_fit(ctx)
    if ctx.backend is None:
        raise CannotRun(f"no GPU to fit on ({ctx.snapshot.skipped_line}) and no sign of the CPU backend")
    return _gpu_fit(ctx)


def _element(ctx: Context, shape: ModelShape) -> tuple[float, str]:
    dtype = ctx.args.text("dtype")
    return cap.kv_element_bytes(ctx.args.text("kv_cache_dtype"), dtype if dtype not in (None, "auto") else shape.dtype)


def _cpu_fit(ctx: Context) -> list[Finding]:
    shape = ctx.shape()
    space = ctx.args.env_number("VLLM_CPU_KVCACHE_SPACE")
    if not space or space <= 0:
        raise CannotRun(
            "VLLM_CPU_KVCACHE_SPACE is not set: the CPU worker sizes the KV cache at startup from "
            "--gpu-memory-utilization of the node's memory, less what it measures (see the host_ram check)"
        )
    cache = space * GIB
    element, kv_dtype = _element(ctx, shape)
    bpt = cap.kv_bytes_per_token(shape, element, ctx.args.tp)
    block = ctx.args.integer("block_size") or CPU_BLOCK_SIZE
    length, length_from = max_len(ctx, shape)
    blocks = cap.blocks_that_fit(cache, bpt, block)
    longest = cap.largest_max_model_len(blocks, block)
    needed = cap.cdiv(length, block) * block * bpt  # as vLLM says it; the null block comes on top
    numbers = {"kv_cache_gib": space, "kv_bytes_per_token": bpt, "block_size": block, "blocks": blocks,
               "max_model_len": length, "fit_max_model_len": longest, "needed_gib": round(needed / GIB, 2)}  # fmt: skip
    work = (f"VLLM_CPU_KVCACHE_SPACE {space:g} GiB / ({cap.kv_formula(shape, element, kv_dtype, ctx.args.tp)} = "
            f"{fmt_int(bpt)} B/token x {block}-token blocks) = {fmt_int(blocks)} blocks, one held back")  # fmt: skip
    if longest >= length:
        return [info("kv-capacity", "The KV cache holds one max-length sequence",
                     f"{work}: the longest sequence is {fmt_int(longest)} tokens, {length_from} is {fmt_int(length)}.",
                     numbers)]  # fmt: skip
    fixes = [Fix(f"Lower --max-model-len to {longest}", "the longest sequence the cache holds", "--max-model-len",
                 str(longest))] if longest else []  # fmt: skip
    with_null = needed + block * bpt
    want = -(-with_null * 100 // GIB) / 100
    fixes.append(Fix(f"Set VLLM_CPU_KVCACHE_SPACE={want:g}", f"one {fmt_int(length)}-token sequence and the null block "
                     f"take {fmt_size(with_null, 'GiB')}", None, f"{want:g}"))  # fmt: skip
    return [blocker("cache-oom", "The KV cache cannot hold one sequence of --max-model-len",
                    f"{work}: the longest sequence is {fmt_int(longest)} tokens, below {length_from} "
                    f"{fmt_int(length)} ({fmt_size(needed, 'GiB')} needed).", numbers, fixes)]  # fmt: skip


def _gpu_fit(ctx: Context) -> list[Finding]:
    from vllm_doctor.capacity import plan as planner

    used = ctx.used()
    shape = ctx.shape()
    length, length_from = max_len(ctx, shape)
    args = ctx.args
    dtype = args.text("dtype")
    req = planner.PlanRequest(
        models=[args.model or ""], utilization=args.number("gpu_memory_utilization", 0.9) or 0.9,
        max_model_len=length, tp=args.tp, kv_cache_dtype=args.text("kv_cache_dtype") or "auto",
        quantization=args.text("quantization"), dtype=None if dtype in (None, "auto") else dtype,
        block_size=args.integer("block_size") or cap.DEFAULT_BLOCK_SIZE, gpus=len(ctx.visible), offline=ctx.offline,
    )  # fmt: skip
    visible = dataclasses.replace(ctx.snapshot, devices=used)
    try:
        plan = planner.make_plan(req, visible)
    except planner.PlanError as e:
        raise CannotRun(str(e)) from None
    mp = plan.models[0]
    return [_gpu_verdict(ctx, mp, length, length_from, plan.gpu_bytes)]


def _gpu_verdict(ctx: Context, mp, length: int, length_from: str, total: float) -> Finding:
    b = mp.budget
    util = b.utilization
    needed = cap.cdiv(length, b.block_size) * b.block_size * b.bytes_per_token  # the null block on top
    numbers = {"gpu_total_gib": round(total / GIB, 2), "gpu_memory_utilization": util, "tp": b.tp,
               "weights_gib_per_gpu": round(b.weights_per_gpu / GIB, 2), "kv_cache_gib": round(b.cache_bytes / GIB, 2),
               "kv_bytes_per_token": b.bytes_per_token, "max_model_len": length,
               "fit_max_model_len": b.longest_sequence, "needed_gib": round(needed / GIB, 2)}  # fmt: skip
    work = (f"{fmt_size(total, 'GiB')} x {util:.2f} - {fmt_size(b.weights_per_gpu, 'GiB')} weights per GPU = "
            f"{fmt_size(b.cache_bytes, 'GiB')} for the KV cache before vLLM's own overheads")  # fmt: skip
    if b.cache_bytes > 0 and b.longest_sequence >= length:
        margin = b.cache_bytes - needed - b.block_size * b.bytes_per_token
        text = f"{work}; one {fmt_int(length)}-token sequence ({length_from}) takes {fmt_size(needed, 'GiB')}"
        if margin < OVERHEAD_SPAN:
            return warning("cache-oom", "One max-length sequence fits only if vLLM's overheads stay small",
                           f"{text}: it fits only if the activation peak, non-torch memory and CUDA graphs stay "
                           f"under {fmt_size(max(margin, 0), 'GiB')} (vLLM measures them at startup).", numbers,
                           _fit_fixes(ctx, mp, length, total), confidence="low")  # fmt: skip
        return info("kv-capacity", "Weights and one max-length sequence fit",
                    f"{text}; {fmt_int(b.tokens)} tokens fit ({fmt_int(b.sequences(length))} sequences at full length).",
                    numbers)  # fmt: skip
    if b.weights_per_gpu >= total * util:
        return blocker("weights-oom", "The weights alone do not fit in --gpu-memory-utilization of each GPU",
                       f"{work}: the weights take {fmt_size(b.weights_per_gpu, 'GiB')} per GPU.", numbers,
                       _fit_fixes(ctx, mp, length, total))  # fmt: skip
    return blocker("cache-oom", "The KV cache cannot hold one sequence of --max-model-len",
                   f"{work}: the longest sequence is {fmt_int(b.longest_sequence)} tokens, below {length_from} "
                   f"{fmt_int(length)} ({fmt_size(needed, 'GiB')} needed).", numbers,
                   _fit_fixes(ctx, mp, length, total))  # fmt: skip


def _fit_fixes(ctx: Context, mp, length: int, total: float) -> list[Fix]:
    b = mp.budget
    fixes = []
    if 0 < b.longest_sequence < length:
        fixes.append(Fix(f"Lower --max-model-len to {b.longest_sequence}", "the longest sequence the cache holds",
                         "--max-model-len", str(b.longest_sequence)))  # fmt: skip
    needed = b.bytes_for(1, length)
    want = cap.utilization_needed(b.utilization, needed, total * b.utilization, total)
    if b.utilization < want <= cap.SAFE_UTILIZATION:
        fixes.append(Fix(f"Raise --gpu-memory-utilization to {want:.2f}", "the fraction at which the weights and one "
                         "sequence fit (vLLM's overheads come on top)", "--gpu-memory-utilization", f"{want:.2f}"))  # fmt: skip
    if (ctx.args.text("kv_cache_dtype") or "auto") == "auto" and not mp.shape.use_mla:
        fixes.append(Fix("Use --kv-cache-dtype fp8", "halves the KV bytes per token", "--kv-cache-dtype", "fp8"))
    tp = cap.smallest_tp_that_fits(mp.shape, mp.element_bytes, length, b.block_size, b.cache_bytes,
                                   b.weights_per_gpu, b.tp, mp.valid_tp_sizes)  # fmt: skip
    if tp:
        fixes.append(Fix(f"Use --tensor-parallel-size {tp}", f"each of {tp} GPUs holds 1/{tp} of the weights and its "
                         "share of the KV heads", "--tensor-parallel-size", str(tp)))  # fmt: skip
    return fixes


def context_limit(ctx: Context) -> list[Finding]:
    """--max-model-len against the model's maximum from config.json (VLLM_ALLOW_LONG_MAX_MODEL_LEN, rope scaling)."""
    given = ctx.args.integer("max_model_len")
    shape = ctx.shape()
    derived = shape.derived_max_model_len
    if not given:
        raise CannotRun("no --max-model-len given: vLLM uses the model's maximum")
    if not derived:
        raise CannotRun("config.json holds no maximum length (max_position_embeddings and the like)")
    rope = shape.rope_scaling or {}
    kind = str(rope.get("rope_type") or rope.get("type") or "default")
    via = f" ({shape.max_len_key}" + (f", rope scaling {kind}" if kind != "default" else "") + ")"
    numbers = {"max_model_len": given, "derived_max_model_len": derived}
    if given <= derived:
        return []
    text = f"--max-model-len {fmt_int(given)} is above the model's maximum {fmt_int(derived)}{via}"
    if ctx.args.env_on("VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        return [warning("context-exceeds-max", "--max-model-len is above the model's maximum (allowed)",
                        f"{text}; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets it start, and outputs past "
                        f"{fmt_int(derived)} tokens may be wrong.", numbers,
                        [Fix(f"Lower --max-model-len to {derived}", "the length the model was trained for",
                             "--max-model-len", str(derived))])]  # fmt: skip
    return [blocker("context-exceeds-max", "--max-model-len is above the model's maximum",
                    f"{text}: vLLM refuses it at startup.", numbers,
                    [Fix(f"Lower --max-model-len to {derived}", "the model's maximum", "--max-model-len", str(derived)),
                     Fix("Set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (only with rope scaling that supports it)",
                         "vLLM then only warns; outputs past the trained length may be wrong")])]  # fmt: skip
