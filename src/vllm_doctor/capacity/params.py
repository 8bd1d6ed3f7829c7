"""The parameter count: the safetensors headers (local files, else the Hub's header metadata), else an
estimate from the shape. The headers give every tensor's dtype and shape (tally.Tally), from
which weights.loaded_bytes gives the bytes vLLM holds."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from vllm_doctor.capacity.dtypes import DTYPE_BYTES
from vllm_doctor.capacity.hub import NET_TIMEOUT_S, Resolved, reachable
from vllm_doctor.capacity.shape import ModelShape
from vllm_doctor.capacity.tally import Tally
from vllm_doctor.errors import MAX_WIDTH, DoctorError, in_range

MAX_HEADER_BYTES = 100_000_000  # a header larger than this is no safetensors file we should parse


def _count(t: dict, key: str) -> int:
    """A width or count of config.json's that the estimate multiplies; 0 (as if absent) when it is
    none (a list, "nan", -1, 1e-400, past MAX_WIDTH): the shape's own fields were checked already,
    these are read only here."""
    try:
        return int(in_range(t.get(key) or 0, key, 0, MAX_WIDTH, whole=True))
    except DoctorError:
        return 0


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
        nope = _count(t, "qk_nope_head_dim")
        rope = shape.qk_rope_head_dim or 0
        v_head = _count(t, "v_head_dim") or nope
        qlr = _count(t, "q_lora_rank")
        q = h * qlr + qlr * heads * (nope + rope) if qlr else h * heads * (nope + rope)
        kv = h * ((shape.kv_lora_rank or 0) + rope) + (shape.kv_lora_rank or 0) * heads * (nope + v_head)
        attention = q + kv + heads * v_head * h
    else:
        d = shape.head_dim
        attention = h * heads * d + 2 * h * shape.kv_heads * d + heads * d * h
    inter = _count(t, "intermediate_size") or 4 * h
    dense_mlp = 3 * h * inter  # gate, up, down
    experts = shape.num_experts
    if experts:
        moe_inter = _count(t, "moe_intermediate_size") or inter
        moe = experts * 3 * h * moe_inter + h * experts  # experts + router
        shared = _count(t, "n_shared_experts")
        if shared:
            moe += shared * 3 * h * moe_inter
        elif _count(t, "shared_expert_intermediate_size"):
            moe += 3 * h * _count(t, "shared_expert_intermediate_size")
        dense_layers = min(layers, _count(t, "first_k_dense_replace"))
        mlp_total = dense_layers * dense_mlp + (layers - dense_layers) * moe
    else:
        mlp_total = layers * dense_mlp
    return int(embed + layers * attention + mlp_total + layers * 2 * h + h)


def _header(path: Path) -> dict | None:
    """A safetensors file's JSON header: an 8-byte length, then the header; the weights are not read."""
    try:
        with path.open("rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            if size > MAX_HEADER_BYTES:
                return None
            header = json.loads(fh.read(size))
    except (OSError, struct.error, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _files(directory: Path) -> list[Path]:
    """The weight files: those model.safetensors.index.json maps the tensors to, else every *.safetensors."""
    index = directory / "model.safetensors.index.json"
    try:
        mapped = json.loads(index.read_text())["weight_map"].values() if index.is_file() else ()
    except (OSError, ValueError, KeyError, AttributeError):
        mapped = ()
    named = sorted({directory / str(f) for f in mapped})
    return named if named and all(f.is_file() for f in named) else sorted(directory.glob("*.safetensors"))


def safetensors_local(directory: Path | None, bits: float | None = None) -> Tally | None:
    """Every tensor's dtype and shape from the headers of a folder's safetensors files."""
    if directory is None or not directory.is_dir():
        return None
    files = _files(directory)
    if not files:
        return None
    tally = Tally()
    for f in files:
        header = _header(f)
        if header is None:
            return None
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict):
                tally.add(name, str(entry.get("dtype", "?")), entry.get("shape") or [], bits)
    return tally if tally.elements else None


def safetensors_hub(repo_id: str, bits: float | None = None) -> Tally | None:
    """The same from the Hub: huggingface_hub's get_safetensors_metadata reads only the headers."""
    try:
        from huggingface_hub import get_safetensors_metadata

        meta = get_safetensors_metadata(repo_id, timeout=NET_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - unreachable or not a safetensors repo: estimate instead
        return None
    tally = Tally()
    for file_meta in (getattr(meta, "files_metadata", None) or {}).values():
        for name, info in (getattr(file_meta, "tensors", None) or {}).items():
            tally.add(name, str(info.dtype), list(info.shape), bits)
    return tally if tally.elements else None


def weights_bytes_from_dtypes(by_dtype: dict[str, int]) -> float:
    return sum(n * DTYPE_BYTES.get(d.lower(), 2) for d, n in by_dtype.items())


def fill_params(shape: ModelShape, resolved: Resolved | None, offline: bool = False) -> None:
    """Set params and params_source: local safetensors, then the Hub (when it answered), else an estimate."""
    tally = safetensors_local(resolved.directory if resolved else None, shape.quant_bits)
    source = "safetensors (local files)"
    hub = resolved is not None and resolved.repo_id and not (offline or resolved.offline)
    if tally is None and hub and resolved is not None and resolved.repo_id and reachable(resolved):
        tally = safetensors_hub(resolved.repo_id, shape.quant_bits)
        source = "safetensors metadata (Hugging Face)"
    if tally:
        shape.params = tally.params
        shape.params_by_dtype = tally.by_dtype()
        shape.tally = tally
        shape.params_source = source
        return
    estimate = estimate_params(shape)
    if estimate:
        shape.params = estimate
        shape.params_source = "estimated from the shape"
