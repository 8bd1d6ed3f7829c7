"""Does this start fit: the weights, the KV cache and one --max-model-len sequence on the GPUs it
will use (capacity/start.ask at plan's budget over the NVML snapshot), or in VLLM_CPU_KVCACHE_SPACE on the CPU
backend; and is --max-model-len within what the model's config.json allows."""

from __future__ import annotations

import dataclasses
import math

from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity import kvcache
from vllm_doctor.capacity.arithmetic import GIB, fmt_size
from vllm_doctor.capacity.shape import ModelShape
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, found

TIGHT_MARGIN = GIB  # what the cache has to spare beyond the estimated overheads before a start is called tight:
# vLLM measures the activation peak, non-torch memory and CUDA graphs at startup (1-4 GB seen), the estimate may miss


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
    return cap.kv_element_bytes(ctx.args.text("kv_cache_dtype"), cap.serving_dtype(ctx.args.text("dtype"), shape.dtype))


def start_query(ctx: Context, shape: ModelShape, backend: str):
    """This start as the capacity model's question (capacity/start.py) on `backend` ("cpu" or "cuda")."""
    from vllm_doctor.capacity import start

    a = ctx.args
    return start.StartQuery(
        shape, backend, a.integer("max_model_len"), a.tp, a.pp, a.text("kv_cache_dtype"), a.text("dtype"),
        a.integer("block_size"), a.integer("max_num_batched_tokens"), a.text("enable_prefix_caching") != "false",
        not a.on("disable_hybrid_kv_cache_manager"), a.integer("kv_cache_memory_bytes"),
        a.integer("num_gpu_blocks_override"), a.text("quantization"), dict(a.env),
    )  # fmt: skip


def _cpu_fit(ctx: Context) -> list[Finding]:
    """vLLM's own cache check at the KV space the command sets, by the one capacity model."""
    from vllm_doctor.capacity import start

    shape = ctx.shape()
    text = ctx.args.env.get("VLLM_CPU_KVCACHE_SPACE")
    try:
        space = start.cpu_kvcache_space(text)
    except ValueError:  # vLLM's int() refuses it before anything loads
        try:
            up = max(1, math.ceil(float(str(text))))
        except ValueError:
            up = 1
        return [found("check-cpu-kvcache-space-int", {"rounded_up": up}, value=str(text))]
    if not space and not ctx.args.integer("kv_cache_memory_bytes"):
        raise CannotRun(
            "VLLM_CPU_KVCACHE_SPACE is not set: the CPU worker sizes the KV cache at startup from "
            "--gpu-memory-utilization of the node's memory, less what it measures (see the host_ram check)"
        )
    q = start_query(ctx, shape, "cpu")
    length, length_from = max_len(ctx, shape)
    q.max_model_len = length
    answer = start.ask(q)
    if not answer.fixable:  # refused before any cache is sized: never a fit (tp_shape names it)
        raise CannotRun(f"the start is refused before the cache is sized: {answer.reason}")
    lay, cache = answer.layout, answer.budget or 0
    element, kv_dtype = _element(ctx, shape)
    bpt = cap.kv_bytes_per_token(shape, element, ctx.args.tp)
    block = lay.block_size if lay else kvcache.CPU_BLOCK_SIZE
    blocks = int(cache // lay.page_bytes) if lay and lay.page_bytes else 0
    longest = start.longest(q) or 0
    needed = answer.capacity.needed_bytes if answer.capacity else cap.cdiv(length, block) * block * bpt
    numbers = {"kv_cache_gib": round(cache / GIB, 2), "kv_bytes_per_token": bpt, "block_size": block, "blocks": blocks,
               "max_model_len": length, "fit_max_model_len": longest, "needed_gib": round(needed / GIB, 2)}  # fmt: skip
    words = {"kv_formula": cap.kv_formula(shape, element, kv_dtype, ctx.args.tp), "length_from": length_from}
    if answer.capacity is None or answer.capacity.fits:
        return [found("check-kv-cache-fits-cpu", numbers, **words)]
    with_null = needed + (lay.page_bytes if lay else block * bpt)
    return [found("check-cache-oom-cpu", numbers, **words, needed_size=fmt_size(needed, "GiB"),
                  kvcache_space_needed=start.space_needed(q), with_null_size=fmt_size(with_null, "GiB"))]  # fmt: skip


def _gpu_fit(ctx: Context) -> list[Finding]:
    """The capacity model's answer (capacity/start.py) at the budget plan states: the smallest used GPU
    x --gpu-memory-utilization less the weights per GPU and the default overhead its serve line reserves."""
    from vllm_doctor.capacity import plan as planner
    from vllm_doctor.capacity import serving, start

    used = ctx.used()
    shape = ctx.shape()
    length, length_from = max_len(ctx, shape)
    args = ctx.args
    dtype = args.text("dtype")
    req = planner.PlanRequest(
        models=[args.model or ""], utilization=ctx.utilization,
        max_model_len=length, tp=args.tp, kv_cache_dtype=args.text("kv_cache_dtype") or "auto",
        quantization=args.text("quantization"), dtype=None if dtype in (None, "auto") else dtype,
        block_size=args.integer("block_size") or cap.DEFAULT_BLOCK_SIZE, gpus=len(ctx.visible), offline=ctx.offline,
    )  # fmt: skip
    visible = dataclasses.replace(ctx.snapshot, devices=used)
    try:  # the plan for its weights (the whole model's: the same at any TP it may re-plan at)
        plan = planner.make_plan(req, visible)
    except planner.PlanError as e:
        raise CannotRun(str(e)) from None
    mp, total, tp = plan.models[0], plan.gpu_bytes, args.tp
    overhead, overhead_work = serving.default_overhead(total, mp.shape.params or 0, tp)
    element, _ = _element(ctx, shape)
    b = dataclasses.replace(mp.budget, tp=tp, overhead_bytes=overhead,
                            bytes_per_token=cap.kv_bytes_per_token(shape, element, tp))  # fmt: skip
    q = dataclasses.replace(start_query(ctx, shape, "cuda"), max_model_len=length, budget_bytes=max(b.cache_bytes, 0),
                            gpus=len(ctx.visible))  # fmt: skip
    if q.max_num_batched_tokens is None:  # `vllm serve`'s default for this GPU size, as plan counts it
        q.max_num_batched_tokens = kvcache.serve_batched_tokens(total)
    return [_gpu_verdict(ctx, mp, b, q, start.longest(q) or 0, length_from, overhead_work)]


def _gpu_verdict(ctx: Context, mp, b, q, longest: int, length_from: str, overhead_work: str) -> Finding:
    from vllm_doctor.capacity import start

    answer = start.ask(q)
    lay, length, total = answer.layout, answer.max_model_len or 0, b.total_bytes
    needed = answer.capacity.needed_bytes if answer.capacity else 0
    page = lay.page_bytes if lay else b.block_size * b.bytes_per_token
    numbers = {"gpu_total_gib": round(total / GIB, 2), "gpu_memory_utilization": b.utilization, "tp": b.tp,
               "weights_gib_per_gpu": round(b.weights_per_gpu / GIB, 2), "kv_cache_gib": round(max(b.cache_bytes, 0) / GIB, 2),
               "overhead_gib": round(b.overhead_bytes / GIB, 2), "kv_bytes_per_token": b.bytes_per_token,
               "max_model_len": length, "fit_max_model_len": longest, "needed_gib": round(needed / GIB, 2)}  # fmt: skip
    words = {"length_from": length_from, "gpu_size": fmt_size(total, "GiB"), "needed_size": fmt_size(needed, "GiB"),
             "weights_size": fmt_size(b.weights_per_gpu, "GiB"), "cache_size": fmt_size(max(b.cache_bytes, 0), "GiB"),
             "overhead_size": fmt_size(b.overhead_bytes, "GiB"), "overhead_work": overhead_work}  # fmt: skip
    if answer.starts:
        margin = b.cache_bytes - needed - page
        if margin < TIGHT_MARGIN:
            return found("check-cache-oom-tight", numbers, **words, **_fix_values(ctx, mp, b, length, q),
                         margin_size=fmt_size(max(margin, 0), "GiB"))  # fmt: skip
        return found("check-kv-cache-fits-gpu", numbers, **words, kv_tokens=answer.tokens or 0,
                     sequences=int(answer.capacity.concurrency) if answer.capacity else 0)  # fmt: skip
    rule = "check-weights-oom" if b.weights_per_gpu >= total * b.utilization else "check-cache-oom-gpu"
    return found(rule, numbers, **words, **_fix_values(ctx, mp, b, length, q))


def tp_that_fits(mp, b, q) -> int | None:
    """The smallest valid TP above this one at which the command, asked again (capacity/start.py),
    starts: each GPU holds 1/TP of the weights and its share of the KV heads, and reserves the
    default overhead at that TP (the non-torch memory grows past TP 1); the visible GPUs bound it."""
    from vllm_doctor.capacity import serving, start

    for t in sorted(s for s in mp.valid_tp_sizes if s > b.tp):
        overhead, _work = serving.default_overhead(b.total_bytes, mp.shape.params or 0, t)
        at = dataclasses.replace(b, tp=t, overhead_bytes=overhead,
                                 bytes_per_token=cap.kv_bytes_per_token(mp.shape, mp.element_bytes, t))  # fmt: skip
        if start.ask(dataclasses.replace(q, tp=t, budget_bytes=max(at.cache_bytes, 0))).starts:
            return t
    return None


def _fix_values(ctx: Context, mp, b, length: int, q) -> dict:
    """The numbers the fit rules' fixes offer; one left out (None) drops its fix."""
    total = b.total_bytes
    want = cap.utilization_needed(b.utilization, b.bytes_for(1, length), total * b.utilization, total)
    tp = tp_that_fits(mp, b, q)
    return {"utilization_needed": want if b.utilization < want <= cap.SAFE_UTILIZATION else None,
            "kv_fp8_helps": (ctx.args.text("kv_cache_dtype") or "auto") == "auto" and not mp.shape.use_mla,
            "tp_that_fits": tp or None}  # fmt: skip


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
    numbers = {"max_model_len": given, "derived_max_model_len": derived}
    if given <= derived:
        return []
    allowed = ctx.args.env_on("VLLM_ALLOW_LONG_MAX_MODEL_LEN")
    return [found("check-context-above-max-allowed" if allowed else "check-context-above-max", numbers,
                  max_len_key=shape.max_len_key, rope="" if kind == "default" else f", rope scaling {kind}")]  # fmt: skip
