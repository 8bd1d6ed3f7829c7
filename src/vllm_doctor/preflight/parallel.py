"""Tensor and pipeline parallelism against the model and the machine: heads, KV heads and the
padded vocabulary split by TP, layers by PP, TP x PP against the visible GPUs (or, on the CPU
backend, the NUMA nodes its OpenMP binding needs), and a TP the weights do not need."""

from __future__ import annotations

import os
from pathlib import Path

from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity.arithmetic import GIB, fmt_list, fmt_size
from vllm_doctor.capacity.weights import fits_one_gpu, per_gpu
from vllm_doctor.preflight import tables
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun, Finding, found

VOCAB_PADDING = tables.vllm("vocab_padding")  # DEFAULT_VOCAB_PADDING_SIZE (rules/tables/preflight.toml)
NUMA_NODES = Path("/sys/devices/system/node")


def _valid(ctx: Context, heads: int | None, kv_heads: int | None, vocab: int | None) -> list[int]:
    limit = max(len(ctx.visible), ctx.args.tp, 8)
    return [t for t in cap.valid_tp_sizes(heads, kv_heads, limit) if not vocab or _padded(vocab) % t == 0]


def _padded(vocab: int) -> int:
    return cap.cdiv(vocab, VOCAB_PADDING) * VOCAB_PADDING


def tp_shape(ctx: Context) -> list[Finding]:
    """--tensor-parallel-size against heads, KV heads and the padded vocabulary; PP against layers."""
    shape = ctx.shape()
    tp, pp = ctx.args.tp, ctx.args.pp
    heads, kv = shape.attention_heads or None, shape.kv_heads
    vocab = None if shape.use_mla else shape.vocab_size
    valid = _valid(ctx, heads, kv, vocab)
    numbers = {"tp": tp, "attention_heads": heads, "kv_heads": kv, "valid_tp_sizes": fmt_list(valid)}
    words = {"suggested_tp": max([t for t in valid if t <= max(tp, 1)] or [1]), "vocab_size": vocab,
             "vocab_padding": VOCAB_PADDING}  # fmt: skip
    out = []
    if heads and heads % tp:
        out.append(found("check-tp-heads", numbers, **words))  # ModelConfig.verify_with_parallel_config
    elif not cap.tp_ok(tp, None, kv):
        out.append(found("check-tp-kv-heads", numbers, **words))
    elif vocab and _padded(vocab) % tp:
        numbers["padded_vocab"] = _padded(vocab)
        out.append(found("check-tp-vocab", numbers, **words))
    elif heads and kv and not shape.use_mla and heads % kv:  # (after the split's own checks, as LlamaAttention
        out.append(found("check-heads-not-multiple-of-kv-heads", numbers))  # asserts them first): no TP groups them
    if pp > shape.layers:
        out.append(found("check-pp-layers", {"pp": pp, "layers": shape.layers}))
    return out


def tp_devices(ctx: Context) -> list[Finding]:
    """TP x PP against the visible GPUs; on the CPU backend, against the NUMA nodes it binds to."""
    world = ctx.args.tp * ctx.args.pp
    if ctx.backend == "cpu":
        return _numa(ctx, world)
    gpus = ctx.gpus()
    if world <= len(gpus):
        return []
    seen = ctx.args.env.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={seen})" if seen is not None else ""
    return [found("check-not-enough-gpus", {"needed": world, "visible": len(gpus)}, tp=ctx.args.tp, pp=ctx.args.pp,
                  where_visible=where)]  # fmt: skip


def _numa(ctx: Context, world: int) -> list[Finding]:
    """VLLM_CPU_OMP_THREADS_BIND against the ranks: 'auto' needs a NUMA node each, a list one CPU list
    each of this host's CPUs (capacity/start.py reads it as vLLM does)."""
    from vllm_doctor.capacity import start

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    suggested = start.bind_string(cpus, world) or "nobind"
    bind = ctx.args.env.get("VLLM_CPU_OMP_THREADS_BIND", "auto").strip() or "auto"
    if bind != "auto":
        return _bind_string(bind, world, cpus, suggested)
    if world == 1:
        return []
    nodes = len(list(NUMA_NODES.glob("node[0-9]*"))) if NUMA_NODES.is_dir() else None
    if nodes is None:
        raise CannotRun(f"{NUMA_NODES} is not readable: the NUMA node count is unknown")
    if nodes >= world:
        return []
    return [found("check-cpu-numa-nodes", {"ranks": world, "numa_nodes": nodes}, tp=ctx.args.tp, suggested=suggested)]


def _bind_string(bind: str, world: int, cpus: int, suggested: str) -> list[Finding]:
    from vllm_doctor.capacity import start

    try:
        ranks = start.bind_ranks(bind)
    except ValueError:
        ranks, why = [], "it is no CPU list"
    if ranks is None:  # nobind / all
        return []
    if ranks:
        beyond = any(i >= cpus for r in ranks for i in r)
        if len(ranks) == world and not beyond:
            return []
        why = f"{len(ranks)} lists for {world} ranks" if len(ranks) != world else "it names CPUs this host lacks"
    numbers = {"ranks": world, "lists": len(ranks), "cpus": cpus}
    return [found("check-cpu-bind-string", numbers, bind=bind, suggested=suggested, why=why)]


def tp_needed(ctx: Context) -> list[Finding]:
    """A TP > 1 whose weights would fit one card: the split costs all-reduces (info)."""
    if ctx.args.tp == 1 or ctx.backend != "cuda":
        return []
    shape, card = ctx.shape(), min(d.total_mib for d in ctx.gpus()) * 2**20
    weights, _ = per_gpu(shape, 1, ctx.args.text("dtype"), ctx.args.text("quantization"))
    if not weights:
        raise CannotRun("the parameter count is unknown")
    if not fits_one_gpu(weights, card):
        return []
    return [found("check-tp-not-needed", {"weights_gib": round(weights / GIB, 2), "gpu_gib": round(card / GIB, 2)},
                  tp=ctx.args.tp, weights_size=fmt_size(weights, "GiB"), gpu_size=fmt_size(card, "GiB"))]  # fmt: skip
