"""The weights as vLLM loads them: exact bytes from the safetensors headers, else bytes per
parameter by quantisation from config.json (an estimate, said so).

From the headers (every tensor's dtype and shape): vLLM keeps quantised tensors as stored (AWQ and
GPTQ's packed int32 qweight and qzeros with their float16 scales, fp8 weights with their scales,
mxfp4's uint8 blocks and scales, NVFP4's packed weights and fp8 scales) and casts the other float
tensors (embeddings, norms, the modules_to_not_convert) to the serving dtype. With
`--quantization fp8` on an unquantised checkpoint it quantises the linear layers online to one byte
per weight, leaving the embeddings, the norms and the MoE router in the serving dtype.

From the shape only: the parameter estimate split into embeddings, experts and the rest, at the
bytes per parameter each quantisation stores (AWQ/GPTQ: bits/8, plus a float16 scale and a packed
zero per group; fp8: 1; mxfp4: 4 bits plus one E8M0 scale per 32, experts only; NVFP4: 4 bits plus
one fp8 scale per 16), the embeddings and modules_to_not_convert at the serving dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm_doctor.capacity import arithmetic
from vllm_doctor.capacity.arithmetic import fmt_int
from vllm_doctor.capacity.dtypes import dtype_bytes
from vllm_doctor.capacity.tally import Tally

if TYPE_CHECKING:
    from vllm_doctor.capacity.shape import ModelShape

FLOATS = frozenset({"F64", "F32", "F16", "BF16"})  # cast to the serving dtype unless a quantisation scale
FIT_SHARE = 0.5  # the whole model's weights at or under this share of one card leave room for a KV cache
FROM_HEADERS = "from the safetensors headers"
GROUP_SIZE = 128  # AWQ's and GPTQ's usual group when the config does not say
ROLES = ("linear", "embed", "aux", "other")


def _stored(dtype: str) -> float:
    return dtype_bytes(dtype) or 2.0


def loaded_bytes(tally: Tally, serving_dtype: str, online: str | None = None) -> tuple[float, str]:
    """(bytes, the work): every tensor as vLLM holds it at `serving_dtype`; `online` is the
    --quantization of an unquantised checkpoint (fp8 quantises its linear layers to one byte)."""
    serve = dtype_bytes(serving_dtype) or 2.0
    total = 0.0
    parts: dict[str, float] = {}
    for (dtype, role), n in sorted(tally.elements.items()):
        if dtype in FLOATS and role == "linear" and online and online.lower().startswith("fp8"):
            size, how = 1.0, "fp8 (online)"
        elif dtype in FLOATS and role != "aux":
            size, how = serve, serving_dtype
        else:
            size, how = _stored(dtype), f"{dtype} as stored"
        total += n * size
        parts[how] = parts.get(how, 0) + n * size
    work = " + ".join(f"{_gb(b)} {how}" for how, b in sorted(parts.items(), key=lambda kv: -kv[1]))
    return total, f"{fmt_int(tally.params)} params; {work} (safetensors headers)"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def estimated_bytes(shape: ModelShape, serving_dtype: str, quant: str | None, bits: float | None) -> tuple[float, str]:
    """(bytes, the work) from the parameter count alone: an estimate, labelled as one."""
    params = shape.params or 0
    serve = dtype_bytes(serving_dtype) or 2.0
    method = (quant or shape.quant_method or "").lower()
    cfg: dict[str, Any] = shape.quant_config or {}
    if not method and not bits:
        return params * serve, f"{fmt_int(params)} params x {serve:g} B ({serving_dtype}; estimated count)"
    embed = (
        (shape.vocab_size or 0) * (shape.hidden_size or 0) * (1 if shape.text_config.get("tie_word_embeddings") else 2)
    )
    embed = min(embed, params)
    if method in ("mxfp4",) or "mxfp4" in method:
        experts = min(_expert_params(shape), params - embed)
        per, what = 0.5 + 1 / 32, "experts at mxfp4 (4 bits + 1 scale byte per 32)"
        quantised = experts
    else:
        quantised = params - embed
        group = int(cfg.get("group_size") or cfg.get("q_group_size") or GROUP_SIZE)
        b = bits or 4.0
        if "fp4" in method or method in ("nvfp4", "modelopt_fp4"):
            per, what = 0.5 + 1 / 16, "at NVFP4 (4 bits + 1 fp8 scale per 16)"
        elif method.startswith("fp8") or b == 8 and "awq" not in method and "gptq" not in method:
            per, what = 1.0, "at fp8"
        elif "awq" in method or "gptq" in method or "marlin" in method:
            per, what = b / 8 + (2 + b / 8) / group, f"at {b:g} bits + a float16 scale and a zero per {group}"
        else:
            per, what = b / 8, f"at {b:g} bits"
    rest = params - quantised
    total = quantised * per + rest * serve
    work = (f"{fmt_int(quantised)} params {what} + {fmt_int(rest)} at {serving_dtype} "
            f"(estimated from the shape: no safetensors headers)")  # fmt: skip
    return total, work


def _expert_params(shape: ModelShape) -> int:
    t = shape.text_config
    h = shape.hidden_size or 0
    inter = int(t.get("moe_intermediate_size") or t.get("intermediate_size") or 4 * h)
    return (shape.num_experts or 0) * 3 * h * inter * shape.layers


def per_gpu(shape: ModelShape, tp: int, dtype: str | None, quantization: str | None) -> tuple[float, str | None]:
    """(bytes of weights on each GPU, where the figure comes from) at --dtype and --quantization
    (None or "auto": as vLLM decides, arithmetic.serving_dtype): the headers give every tensor as
    vLLM loads it (loaded_bytes), else an estimate from the shape, said so; TP splits them. (0, None)
    without a parameter count."""
    served = arithmetic.serving_dtype(dtype, shape.dtype)
    online = None if shape.quant_method or str(quantization).lower() in ("none", "") else str(quantization)
    if shape.tally is not None and (online is None or online.lower().startswith("fp8")):
        total, _ = loaded_bytes(shape.tally, served, online)  # fp8 online: the linear layers at 1 B
        return total / tp, FROM_HEADERS
    if not shape.params:
        return 0.0, None
    if shape.quant_method or online:
        total, _ = estimated_bytes(shape, served, online, shape.quant_bits)
    else:
        total = shape.params * arithmetic.weight_bytes_per_param(served, shape.quant_bits)[0]
    why = "no safetensors headers" if shape.tally is None else f"--quantization {online} quantises as it loads"
    return total / tp, f"estimated from the shape: {why}"


def fits_one_gpu(total_bytes: float, card_bytes: float) -> bool:
    """The whole model's weights leave one card room for a useful KV cache: TP > 1 buys only cache."""
    return total_bytes <= FIT_SHARE * card_bytes
