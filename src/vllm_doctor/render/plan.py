"""`vllm-doctor plan` rendered: the Plan that capacity/plan.py computes, as text, Markdown or JSON.
The model's name and config are input: text and Markdown show their control characters as
escapes, and Markdown escapes their words (visible.py)."""

from __future__ import annotations

import json as jsonlib
from typing import Any

from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity.arithmetic import fmt_int, fmt_list, fmt_size
from vllm_doctor.capacity.plan import ModelPlan, Plan
from vllm_doctor.render.visible import cell, code, fence, md, visible

SCHEMA = "vllm-doctor/plan/1"


def to_dict(plan: Plan) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "fits": plan.fits,
        "gpu": {
            "memory_bytes": plan.gpu_bytes,
            "unit": plan.gpu_unit,
            "source": plan.gpu_source,
            "count": plan.gpus,
            "snapshot": plan.snapshot.to_json() if plan.snapshot else None,
        },
        "gpu_memory_utilization": plan.utilization,
        "block_size": plan.block_size,
        "models": [_model_dict(m) for m in plan.models],
        "split": None
        if plan.split is None
        else [{"model": m.name, "gpu_memory_utilization": f} for m, f in zip(plan.models, plan.split, strict=False)],
        "blocks": [vars(s) for s in plan.block_examples],
        "notes": plan.notes,
    }


def _model_dict(m: ModelPlan) -> dict[str, Any]:
    b = m.budget
    return {
        "name": m.name,
        "model": m.shape.to_json(cap.kv_bytes_per_token(m.shape, m.element_bytes, 1)),
        "dtype": m.dtype,
        "kv_cache_dtype": m.kv_dtype,
        "tensor_parallel_size": b.tp,
        "gpu_memory_utilization": m.utilization,
        "weights_bytes": b.weights_bytes,
        "weights_per_gpu_bytes": b.weights_per_gpu,
        "overhead_bytes": b.overhead_bytes,
        "cache_bytes": max(b.cache_bytes, 0.0),  # never a negative memory: the shortfall is its own key
        "cache_short_bytes": max(-b.cache_bytes, 0.0),
        "kv_bytes_per_token": b.bytes_per_token,
        "tokens": b.tokens,
        "blocks": b.blocks,
        "longest_max_model_len": b.longest_sequence,
        "max_model_len": m.max_model_len,
        "worst_case_sequences": m.sequences,
        "target_concurrency": m.target_concurrency,
        "max_model_len_for_target": m.max_model_len_for_target,
        "valid_tp_sizes": m.valid_tp_sizes,
        "serve_command": m.serve_command or None,
        "fits": m.fits,
        "problems": m.problems,
        "notes": m.notes,
        "steps": [vars(s) for s in m.steps],
    }


def json(plan: Plan) -> str:
    return jsonlib.dumps(to_dict(plan), indent=2) + "\n"


def _table(
    rows: list[tuple[str, str, str]], header: tuple[str, str, str] | None = ("step", "work", "value")
) -> list[str]:
    """Rows of (name, work, value) as aligned text: name, value (right-aligned), then the work."""
    rows = ([header] if header else []) + rows
    w0 = max(len(r[0]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    return [f"  {a:<{w0}}  {c:>{w2}}   {b}".rstrip() for a, b, c in rows]


def _gpu_line(plan: Plan) -> str:
    gib, gb = plan.gpu_bytes / cap.GIB, plan.gpu_bytes / cap.GB
    count = f"{plan.gpus} x " if plan.gpus > 1 else ""
    if not plan.gpu_bytes:  # the KV space is set explicitly and no GPU memory was given
        return f"GPU: {plan.gpu_source}; GB = 10^9 bytes, GiB = 2^30 bytes"
    return f"GPU: {count}{gb:,.1f} GB = {gib:,.1f} GiB ({plan.gpu_source}); GB = 10^9 bytes, GiB = 2^30 bytes"


def text(plan: Plan) -> str:
    out = [f"vllm-doctor plan: {'fits' if plan.fits else 'does not fit'}", _gpu_line(plan)]
    for m in plan.models:
        out += ["", _model_title(m)]
        out += _table([(s.name, s.work, s.value) for s in m.steps])
        out.append(f"  valid --tensor-parallel-size: {fmt_list(m.valid_tp_sizes)}")
        out += [f"  problem: {p}" for p in m.problems]
        out += [f"  note: {n}" for n in m.notes]
        out += ["  serve:", f"    {m.serve_command or '(none: see the notes)'}"]
    if plan.split:
        out += ["", "Several models on one card:"]
        out += _table([(m.name, f"{fmt_int(m.budget.tokens)} tokens, {fmt_size(m.budget.cache_bytes, plan.gpu_unit)} cache",
                        f"{f:.2f}") for m, f in zip(plan.models, plan.split, strict=False)], ("model", "gets", "fraction"))  # fmt: skip
    if plan.block_examples:
        out += ["", f"Blocks (block size {plan.block_size}):"]
        out += _table([(s.name, s.work, s.value) for s in plan.block_examples], ("example", "work", "blocks"))
    out += [""] + [f"note: {n}" for n in plan.notes]
    text = "\n".join(out).rstrip() + "\n"
    if plan.snapshot is not None and not plan.snapshot.available:
        text += f"{plan.snapshot.skipped_line}\n"  # why no GPU was asked
    return visible(text)


def _model_title(m: ModelPlan) -> str:
    s = m.shape
    bits = [f"{s.layers} layers", *([f"{s.attention_heads} attention heads"] if s.attention_heads else []),
            f"{s.kv_heads} KV heads"]  # fmt: skip
    bits.append(f"head dim {s.head_dim}" + (" (MLA)" if s.use_mla else ""))
    bits.append(f"{cap.fmt_params(s.params or 0)} params ({s.params_source})")
    title = f"Model {m.name}: " + ", ".join(bits)
    if s.source and s.source != "given on the command line":
        title += f"; config: {s.source}"
    return title


def markdown(plan: Plan) -> str:
    out = [f"## vllm-doctor plan: {'fits' if plan.fits else 'does not fit'}", "", _gpu_line(plan), ""]
    for m in plan.models:
        out += [f"### {md(_model_title(m))}", "", "| step | work | value |", "|---|---|---|"]
        out += [f"| {cell(s.name)} | {cell(s.work)} | {cell(s.value)} |" for s in m.steps]
        out += ["", f"Valid {code('--tensor-parallel-size')}: {fmt_list(m.valid_tp_sizes)}", ""]
        out += [f"- **Problem:** {md(p)}" for p in m.problems]
        out += [f"- Note: {md(n)}" for n in m.notes]
        if m.serve_command:
            ticks = fence([m.serve_command])
            out += ["", f"{ticks}sh", m.serve_command, ticks, ""]
        else:
            out.append("")
    if plan.split:
        out += [
            "### Several models on one card",
            "",
            "| model | --gpu-memory-utilization | KV tokens |",
            "|---|---|---|",
        ]
        out += [
            f"| {cell(m.name)} | {f:.2f} | {fmt_int(m.budget.tokens)} |"
            for m, f in zip(plan.models, plan.split, strict=False)
        ]
        out.append("")
    if plan.block_examples:
        out += [f"### Blocks (block size {plan.block_size})", "", "| example | work | blocks |", "|---|---|---|"]
        out += [f"| {cell(s.name)} | {cell(s.work)} | {cell(s.value)} |" for s in plan.block_examples]
        out.append("")
    out += [f"> Note: {md(n)}" for n in plan.notes]
    return visible("\n".join(out).rstrip() + "\n")
