"""Bytes per element of a dtype: a leaf the capacity modules share (shape, params, arithmetic,
weights), importing none of them."""

from __future__ import annotations

# bytes per element of a dtype name as config.json, vLLM flags or safetensors write it
DTYPE_BYTES: dict[str, float] = {
    "float64": 8, "double": 8, "f64": 8, "i64": 8,
    "float32": 4, "float": 4, "f32": 4, "i32": 4,
    "float16": 2, "half": 2, "f16": 2, "bfloat16": 2, "bf16": 2, "i16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "f8_e4m3": 1, "f8_e5m2": 1, "f8_e8m0": 1,
    "int8": 1, "i8": 1, "u8": 1, "uint8": 1, "bool": 1,
    "int4": 0.5, "f4": 0.5,
}  # fmt: skip


def dtype_bytes(name: str | None) -> float | None:
    """Bytes per element of a dtype name ("torch.bfloat16", "fp8_e4m3", "F16"); None if unknown."""
    if not name:
        return None
    return DTYPE_BYTES.get(str(name).lower().removeprefix("torch."))
