"""The parameter count: the safetensors headers (local files, else Hub metadata), else an estimate from the shape."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from vllm_doctor.capacity.hub import NET_TIMEOUT_S, Resolved, reachable
from vllm_doctor.capacity.shape import DTYPE_BYTES, ModelShape


def estimate_params(shape: ModelShape) -> int | None:
    """Parameters of a decoder built the usual way (gated MLP, MoE experts, MLA projections).
    Close for Llama/Mistral/Qwen/Gemma/Mixtral/DeepSeek (within a few %); norms and biases ignored."""
    t = shape.text_config
    h = shape.hidden_size
    if not h:
        return None
    heads, layers = shape.attention_heads, shape.layers
    vocab = shape.vocab_size or 0
    tie = t.get("tie_word_embeddings")
    embed = vocab * h * (1 if tie else 2)
    if shape.use_mla:
        nope = int(t.get("qk_nope_head_dim") or 0)
        rope = shape.qk_rope_head_dim or 0
        v_head = int(t.get("v_head_dim") or nope)
        qlr = t.get("q_lora_rank")
        q = h * qlr + qlr * heads * (nope + rope) if qlr else h * heads * (nope + rope)
        kv = h * ((shape.kv_lora_rank or 0) + rope) + (shape.kv_lora_rank or 0) * heads * (nope + v_head)
        attention = q + kv + heads * v_head * h
    else:
        d = shape.head_dim
        attention = h * heads * d + 2 * h * shape.kv_heads * d + heads * d * h
    inter = int(t.get("intermediate_size") or 4 * h)
    dense_mlp = 3 * h * inter  # gate, up, down
    experts = shape.num_experts
    if experts:
        moe_inter = int(t.get("moe_intermediate_size") or inter)
        moe = experts * 3 * h * moe_inter + h * experts  # experts + router
        shared = t.get("n_shared_experts")
        if shared:
            moe += int(shared) * 3 * h * moe_inter
        elif t.get("shared_expert_intermediate_size"):
            moe += 3 * h * int(t["shared_expert_intermediate_size"])
        dense_layers = min(layers, int(t.get("first_k_dense_replace") or 0))
        mlp_total = dense_layers * dense_mlp + (layers - dense_layers) * moe
    else:
        mlp_total = layers * dense_mlp
    return int(embed + layers * attention + mlp_total + layers * 2 * h + h)


def safetensors_params_local(directory: Path | None) -> dict[str, int] | None:
    """Stored elements per dtype from the headers of the .safetensors files in a folder (the
    weights themselves are not read: each file starts with an 8-byte length and a JSON header)."""
    if directory is None or not directory.is_dir():
        return None
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    counts: dict[str, int] = {}
    for f in files:
        try:
            with f.open("rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                if size > 100_000_000:
                    return None
                header = json.loads(fh.read(size))
        except (OSError, struct.error, ValueError):
            return None
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            dtype = str(entry.get("dtype", "?")).upper()
            counts[dtype] = counts.get(dtype, 0) + math.prod(entry.get("shape") or [1])
    return counts or None


def safetensors_params_hub(repo_id: str) -> dict[str, int] | None:
    """Stored elements per dtype as the Hub reports them from the safetensors headers (one API call)."""
    try:
        from huggingface_hub import model_info

        info = model_info(repo_id, expand=["safetensors"], timeout=NET_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - unreachable or not a safetensors repo: estimate instead
        return None
    st = getattr(info, "safetensors", None)
    params = getattr(st, "parameters", None)
    return {str(k).upper(): int(v) for k, v in params.items()} if params else None


def weights_bytes_from_dtypes(by_dtype: dict[str, int]) -> float:
    return sum(n * DTYPE_BYTES.get(d.lower(), 2) for d, n in by_dtype.items())


def fill_params(shape: ModelShape, resolved: Resolved | None, offline: bool = False) -> None:
    """Set params and params_source: local safetensors, then the Hub (when it answered), else an estimate."""
    by_dtype = safetensors_params_local(resolved.directory if resolved else None)
    source = "safetensors (local files)"
    hub = resolved is not None and resolved.repo_id and not (offline or resolved.offline)
    if by_dtype is None and hub and resolved is not None and resolved.repo_id and reachable(resolved):
        by_dtype = safetensors_params_hub(resolved.repo_id)
        source = "safetensors metadata (Hugging Face)"
    if by_dtype:
        shape.params = sum(by_dtype.values())
        shape.params_by_dtype = by_dtype
        shape.params_source = source
        return
    estimate = estimate_params(shape)
    if estimate:
        shape.params = estimate
        shape.params_source = "estimated from the shape"
