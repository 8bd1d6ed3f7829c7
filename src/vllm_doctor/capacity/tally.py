"""A checkpoint's tensors tallied from its safetensors headers: stored elements by dtype and role,
and the parameters they hold. A leaf: the model's shape holds a Tally, the weights read one."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# quantisation side tensors: kept as stored, not parameters of the model
_AUX = re.compile(r"(?:^|[._])(?:qzeros|scales?|g_idx|zeros|zero_point|scale_inv|input_scale|weight_scale\w*"
                  r"|global_scale\w*|\w+_scales)$")  # fmt: skip
_EMBED = re.compile(r"(?:embed_tokens|embed_in|wte|word_embeddings|lm_head|embed_out|output)\.weight$")
_ROUTER = re.compile(r"\.(?:gate|router)\.weight$")
_PACKED = re.compile(r"(?:qweight|weight_packed|_blocks)$")  # several parameters per stored element


@dataclass
class Tally:
    """Stored elements by (dtype, role) over every tensor of a checkpoint, and the parameters they
    hold (a packed int32 holds 32/bits weights; a uint8 of fp4 two)."""

    elements: dict[tuple[str, str], int] = field(default_factory=dict)
    params: int = 0

    def add(self, name: str, dtype: str, dims: list[int] | tuple[int, ...], bits: float | None) -> None:
        n = 1
        for d in dims:
            n *= int(d)
        dtype = dtype.upper()
        if _AUX.search(name) and not _PACKED.search(name):
            role = "aux"
        elif _EMBED.search(name):
            role = "embed"
        elif (
            len(dims) >= 2
            and name.endswith((".weight", "qweight", "weight_packed", "_blocks"))
            and not _ROUTER.search(name)
        ):
            role = "linear"
        else:
            role = "other"
        self.elements[(dtype, role)] = self.elements.get((dtype, role), 0) + n
        if role != "aux":
            self.params += n * _per_element(dtype, name, bits)

    def by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (dtype, _role), n in self.elements.items():
            out[dtype] = out.get(dtype, 0) + n
        return out


def _per_element(dtype: str, name: str, bits: float | None) -> int:
    if not _PACKED.search(name):
        return 1
    if dtype in ("I32", "U32"):
        return int(32 // (bits or 4))
    if dtype in ("U8", "I8"):
        return 2  # two fp4 values per byte (mxfp4 blocks, NVFP4 packed weights)
    return 1
