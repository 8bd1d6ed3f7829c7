"""The capacity arithmetic: weights, KV cache memory, bytes per token, tokens and sequences.

Pure functions over numbers and a ModelShape, with no I/O, used by explain, plan and serve alike.
They follow ../shared/vllm-reference/kv-cache-arithmetic.md (sections 2-5): bytes per token is
2 x layers x KV heads per rank x head size x bytes per element (MLA: one latent vector per token
per layer), the cache is total x utilization - weights - overheads, and V1 holds one block back
(the null block) when it checks that a max-model-len sequence fits.

Units are explicit: GB = 10^9 bytes, GiB = 2^30 bytes, and every printed size names its unit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_doctor.capacity import kvcache
from vllm_doctor.capacity.dtypes import dtype_bytes
from vllm_doctor.errors import MAX_BYTES, MAX_INT, MAX_TP

if TYPE_CHECKING:  # (shape's config reading is not the arithmetic's: no import circle through weights.py)
    from vllm_doctor.capacity.shape import ModelShape

GB = 10**9
GIB = 2**30
UNITS = {
    "B": 1, "KB": 10**3, "MB": 10**6, "GB": GB, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": GIB, "TIB": 2**40,
}  # fmt: skip
UNIT_NAMES = {"KIB": "KiB", "MIB": "MiB", "GIB": "GiB", "TIB": "TiB"}
COUNT_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
DEFAULT_BLOCK_SIZE = kvcache.CUDA_BLOCK_SIZE  # vLLM's block size on CUDA
SAFE_UTILIZATION = 0.95  # above this a startup failure becomes an out-of-memory error under traffic
AGREEMENT_PCT = 10.0  # predicted and logged KV tokens "agree" within this


@dataclass(frozen=True)
class Size:
    bytes: float
    unit: str  # the unit the user wrote ("GB" or "GiB"), used to print results

    def __str__(self) -> str:
        return fmt_size(self.bytes, self.unit)


def parse_size(text: str) -> Size:
    """'80GB' (10^9), '80GiB' (2^30), '512 MiB'. A bare number is refused: the unit decides 7%."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]i?B|B)\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size: write it with a unit, e.g. 80GB (10^9 bytes) or 80GiB (2^30 bytes)")
    unit = m.group(2).upper()
    nbytes = float(m.group(1)) * UNITS[unit]
    if not nbytes <= MAX_BYTES:  # 400 nines are inf as a float
        raise ValueError(f"{text!r}: larger than any memory (at most {MAX_BYTES / 2**60:g} EiB)")
    return Size(nbytes, UNIT_NAMES.get(unit, unit))


def parse_count(text: str) -> int:
    """'7B', '70b', '1.5B', '500M', '7e9', '7000000000' -> parameters."""
    t = str(text).strip().replace(",", "").replace("_", "")
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([KMBGT]?)", t, re.IGNORECASE)
    try:
        value = float(m.group(1)) * COUNT_SUFFIX.get(m.group(2).upper(), 1) if m else float(t)
    except ValueError:
        raise ValueError(f"{text!r} is not a parameter count (e.g. 7B, 70B, 500M, 7e9)") from None
    if not 0 < value <= MAX_INT:  # NaN and 1e400 too
        raise ValueError(f"{text!r}: the parameter count must be positive, at most {MAX_INT:.0e}")
    return int(round(value))


def fmt_size(nbytes: float, unit: str = "GB") -> str:
    scale = UNITS[unit.upper()]
    value = nbytes / scale
    digits = 1 if abs(value) >= 10 or unit in ("GB", "GiB") else 2
    return f"{value:,.{digits}f} {unit}"


def fmt_int(n: float | int) -> str:
    return f"{int(n):,}"


def fmt_list(values: list[int]) -> str:
    """'1, 2, 4', or 'none' for an empty list."""
    return ", ".join(map(str, values)) if values else "none"


def fmt_params(n: float) -> str:
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"


def about(n: float) -> str:
    """A count cut to three significant figures, never rounded up: 442,504 tokens is 'about 442,000'."""
    if n < 1000:
        return fmt_int(n)
    scale = 10 ** (int(math.floor(math.log10(n))) - 2)
    return fmt_int(int(n) // scale * scale)


# ---------------------------------------------------------------------------------------------
# Bytes


def serving_dtype(flag: str | None, checkpoint: str | None) -> str:
    """The dtype vLLM serves the weights (and an `auto` KV cache) in: an explicit --dtype as given;
    `auto` (or none) the checkpoint's torch_dtype, except that vLLM serves a float32 checkpoint in
    16 bits (bfloat16 where the GPU has it, float16 before 0.9 and on older cards: 2 bytes either
    way, config.py _get_and_verify_dtype); no checkpoint dtype: bfloat16."""
    said = str(flag or "auto").lower().removeprefix("torch.")
    if said != "auto":
        return said
    dtype = str(checkpoint or "bfloat16").lower().removeprefix("torch.")
    return "bfloat16" if dtype in ("float32", "float") else dtype


def kv_element_bytes(kv_cache_dtype: str | None, served_dtype: str | None) -> tuple[float, str]:
    """(bytes per KV element, the dtype it is): --kv-cache-dtype auto means the served dtype
    (serving_dtype), an explicit float32 included."""
    kv = str(kv_cache_dtype or "auto").lower()
    kv_bytes = dtype_bytes(kv)
    if kv != "auto" and kv_bytes:
        return float(kv_bytes), kv
    dtype = str(served_dtype or "bfloat16").lower().removeprefix("torch.")
    return float(dtype_bytes(dtype) or 2), dtype


def kv_heads_per_rank(shape: ModelShape, tp: int = 1) -> int:
    """KV heads each GPU holds: split when there are enough, replicated when TP exceeds them; MLA 1."""
    if shape.use_mla:
        return 1
    return max(1, shape.kv_heads // max(1, tp))


def kv_bytes_per_token(shape: ModelShape, element_bytes: float, tp: int = 1) -> int:
    """Bytes of KV cache one more token of a sequence takes on one GPU: its full-attention (or MLA)
    layers. Sliding-window, chunked and Mamba layers hold a fixed amount per sequence instead
    (kvcache.py), so they are not in this figure; a dense model counts all its layers, and one
    with no full-attention layer (all on a window) counts them all (per token inside the window)."""
    layers = kvcache.per_token_layers(shape) or shape.layers
    if shape.use_mla:
        return int(layers * shape.head_dim * element_bytes)
    return int(2 * layers * kv_heads_per_rank(shape, tp) * shape.head_dim * element_bytes)


def sequence_bytes(
    shape: ModelShape, element_bytes: float, tp: int, max_model_len: int, block_size: int, in_flight: int = 0
) -> int:
    """KV bytes one max-length sequence holds on one GPU, as V1's startup check counts it
    (kvcache.needed_bytes): full layers every token in whole blocks, sliding-window layers the
    window plus the `in_flight` tokens of the batch (and one block), Mamba layers their state."""
    lay = kvcache.layout(shape, element_bytes, tp, block_size)
    return kvcache.needed_bytes(lay, max_model_len, in_flight)


def kv_formula(shape: ModelShape, element_bytes: float, dtype: str, tp: int = 1) -> str:
    b = f"{element_bytes:g} B ({dtype})"
    n = kvcache.per_token_layers(shape) or shape.layers
    layers = f"{n} layers" if n == shape.layers else f"{n} full-attention layers (of {shape.layers})"
    if shape.use_mla:
        return f"{layers} x ({shape.kv_lora_rank} + {shape.qk_rope_head_dim}) MLA latent x {b}"
    heads = kv_heads_per_rank(shape, tp)
    per_rank = f" per GPU at TP {tp}" if tp > 1 and not shape.use_mla else ""
    return f"2 x {layers} x {heads} KV heads{per_rank} x {shape.head_dim} head dim x {b}"


def weight_bytes_per_param(dtype: str | None, quant_bits: float | None = None) -> tuple[float, str]:
    """(bytes per parameter, how it was decided) at the served dtype (serving_dtype)."""
    if quant_bits:
        return quant_bits / 8, f"{quant_bits:g}-bit quantized"
    b = dtype_bytes(dtype)
    if b is None:
        return 2.0, "bfloat16"
    return float(b), str(dtype)


# ---------------------------------------------------------------------------------------------
# Tokens, blocks, sequences


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def tokens_that_fit(cache_bytes: float, bytes_per_token: int) -> int:
    return max(0, int(cache_bytes // bytes_per_token)) if bytes_per_token > 0 else 0


def blocks_that_fit(cache_bytes: float, bytes_per_token: int, block_size: int) -> int:
    return max(0, int(cache_bytes // (bytes_per_token * block_size))) if bytes_per_token > 0 else 0


def largest_max_model_len(blocks: int, block_size: int, null_block: bool = True) -> int:
    """The longest sequence the cache holds: V1 keeps one block back as the null block."""
    return max(0, blocks - (1 if null_block else 0)) * block_size


def worst_case_sequences(tokens: int, max_model_len: int) -> int:
    return int(tokens // max_model_len) if max_model_len else 0


def max_len_for(tokens: int, sequences: int, block_size: int) -> int:
    """The --max-model-len at which `sequences` full-length sequences fit, in whole blocks."""
    return (int(tokens) // int(sequences)) // block_size * block_size if sequences else 0


def blocks_for(tokens: int, block_size: int) -> tuple[int, int]:
    """(blocks one sequence of `tokens` takes, slots left empty in its last block)."""
    blocks = cdiv(tokens, block_size)
    return blocks, blocks * block_size - tokens


def sampling_blocks(prompt_tokens: int, samples: int, block_size: int) -> tuple[int, int]:
    """Prompt blocks for `samples` parallel samples: (each keeps its own copy, all share one)."""
    blocks, _ = blocks_for(prompt_tokens, block_size)
    return blocks * samples, blocks


def utilization_needed(utilization: float, needed_bytes: float, available_bytes: float, total_bytes: float) -> float:
    """The fraction at which the cache would have `needed_bytes`, rounded up to 0.01."""
    want = utilization + (needed_bytes - available_bytes) / total_bytes
    return math.ceil(round(want * 100, 6)) / 100


# ---------------------------------------------------------------------------------------------
# Tensor parallelism


def tp_ok(tp: int, heads: int | None, kv_heads: int | None) -> bool:
    """vLLM's rules: heads divisible by TP; KV heads divisible by TP, or TP by KV heads."""
    if heads is not None and heads % tp:
        return False
    if kv_heads:
        if kv_heads >= tp and kv_heads % tp:
            return False
        if kv_heads < tp and tp % kv_heads:
            return False
    return True


def valid_tp_sizes(heads: int | None, kv_heads: int | None, limit: int) -> list[int]:
    """The TP sizes up to `limit` (and MAX_TP) vLLM accepts. With the heads known, only their divisors
    are tried (a square root's worth), never a count to `limit`: `-tp 10**18` counted to it."""
    top = min(max(1, limit), MAX_TP)
    if heads:
        small = [d for d in range(1, math.isqrt(heads) + 1) if heads % d == 0]
        candidates = sorted({*small, *(heads // d for d in small)})
    else:
        candidates = list(range(1, top + 1))
    return [t for t in candidates if t <= top and tp_ok(t, heads, kv_heads)]


def smallest_tp_that_fits(
    shape: ModelShape,
    element_bytes: float,
    max_model_len: int,
    block_size: int,
    kv_room_bytes: float,
    weights_bytes_per_gpu: float,
    tp_now: int,
    sizes: list[int],
    in_flight: int = 2048,
    nccl_bytes: float = 0.0,
) -> int | None:
    """The smallest valid TP size above tp_now whose per-GPU cache holds one max-model-len sequence
    by V1's startup check (kvcache.py): each GPU then holds 1/TP of the weights (freeing room) and
    its share of the KV heads (or Mamba state), less the non-torch memory (NCCL, `nccl_bytes`) a
    split from TP 1 adds on each GPU."""
    whole_weights = weights_bytes_per_gpu * tp_now
    for t in sorted(s for s in sizes if s > tp_now):
        room = kv_room_bytes + weights_bytes_per_gpu - whole_weights / t - (nccl_bytes if tp_now == 1 else 0.0)
        lay = kvcache.layout(shape, element_bytes, t, block_size)
        if kvcache.needed_bytes(lay, max_model_len, in_flight) <= room - lay.page_bytes:
            return t
    return None


# ---------------------------------------------------------------------------------------------
# The four steps, and several models on one card


@dataclass
class Step:
    """One row of the work: what is computed, how, and the result."""

    name: str
    work: str
    value: str


@dataclass
class Budget:
    """The seed's steps for one model on one GPU (per GPU when TP > 1). With a cache layout that
    is not one plain full-attention group (sliding, chunked, Mamba, several groups), tokens,
    sequences and the longest sequence are V1's own (kvcache.py), not memory / bytes per token."""

    total_bytes: float  # one GPU's memory
    utilization: float
    weights_bytes: float  # the whole model
    overhead_bytes: float  # activation peak, non-torch memory, CUDA graphs (per GPU)
    bytes_per_token: int  # per GPU
    tp: int = 1
    block_size: int = DEFAULT_BLOCK_SIZE
    # what V1's layout is built from (size_as_v1); keyword-only, so subclasses' positional fields
    # follow block_size, and the layout follows `tp` when a copy changes it (dataclasses.replace)
    kv_shape: ModelShape | None = field(default=None, kw_only=True, repr=False)
    kv_element_bytes: float = field(default=2.0, kw_only=True)
    kv_device: str = field(default="cuda", kw_only=True)
    max_model_len: int | None = field(default=None, kw_only=True)
    in_flight: int = field(default=2048, kw_only=True)  # tokens the windowed layers keep besides the window
    length_cap: int = field(default=1 << 24, kw_only=True)  # the longest length searched (the model's maximum)
    kv_hybrid: bool = field(default=True, kw_only=True)  # V1's hybrid manager (off: windowed layers as full)
    kv_prefix: bool = field(default=True, kw_only=True)  # prefix caching (Mamba's aligned state blocks)

    @property
    def kv_layout(self) -> kvcache.Layout | None:
        if self.kv_shape is None:
            return None
        explicit = self.block_size if self.block_size != DEFAULT_BLOCK_SIZE else None  # else the backend's (MLA: 64)
        return kvcache.layout(self.kv_shape, self.kv_element_bytes, self.tp, explicit, self.kv_device, self.kv_hybrid,
                              self.kv_prefix)  # fmt: skip

    @property
    def modelled(self) -> bool:
        return self.kv_layout is not None and not self.kv_layout.plain

    @property
    def weights_per_gpu(self) -> float:
        return self.weights_bytes / self.tp

    @property
    def cache_bytes(self) -> float:
        return self.total_bytes * self.utilization - self.weights_per_gpu - self.overhead_bytes

    def capacity(self, max_model_len: int) -> kvcache.Capacity | None:
        lay = self.kv_layout
        return None if lay is None else kvcache.capacity(lay, max(self.cache_bytes, 0), max_model_len, self.in_flight)

    @property
    def tokens(self) -> int:
        got = self.capacity(self.max_model_len) if self.modelled and self.max_model_len else None
        return got.tokens if got else tokens_that_fit(self.cache_bytes, self.bytes_per_token)

    @property
    def blocks(self) -> int:
        lay = self.kv_layout
        if lay is not None:
            return max(0, int(self.cache_bytes // lay.page_bytes))
        return blocks_that_fit(self.cache_bytes, self.bytes_per_token, self.block_size)

    @property
    def longest_sequence(self) -> int:
        lay = self.kv_layout
        if self.modelled and lay is not None:
            room = int(self.cache_bytes) - lay.page_bytes  # the null block held back
            return kvcache.estimate_max_len(lay, room, self.length_cap, self.in_flight) if room > 0 else 0
        return min(largest_max_model_len(self.blocks, lay.block_size if lay else self.block_size), self.length_cap)

    def sequences(self, max_model_len: int) -> int:
        got = self.capacity(max_model_len) if self.modelled else None
        return int(got.concurrency) if got else worst_case_sequences(self.tokens, max_model_len)

    def max_len_for(self, sequences: int) -> int:
        """The --max-model-len at which `sequences` full-length sequences fit."""
        lay = self.kv_layout
        if self.modelled and lay is not None:
            return kvcache.max_len_for_concurrency(lay, self.blocks, sequences, self.length_cap, self.in_flight)
        return max_len_for(self.tokens, sequences, self.block_size)

    def bytes_for(self, sequences: int, max_model_len: int) -> float:
        """Memory this model needs to start: weights, overheads, and the KV cache of `sequences`
        sequences of max_model_len in whole blocks, plus the null block."""
        lay = self.kv_layout
        if self.modelled and lay is not None:
            blocks = sequences * kvcache.request_blocks(lay, max_model_len, self.in_flight) + 1
            return self.weights_per_gpu + self.overhead_bytes + blocks * lay.page_bytes
        kv_blocks = sequences * cdiv(max_model_len, self.block_size) + 1
        return self.weights_per_gpu + self.overhead_bytes + kv_blocks * self.block_size * self.bytes_per_token


def size_as_v1(
    budget: Budget, shape: ModelShape, element_bytes: float, max_model_len: int | None, device: str = "cuda",
    batched: int | None = None,
) -> str:  # fmt: skip
    """Give `budget` the cache layout V1 builds (kvcache.py) and return the plan's note about it.
    On a GPU: the backend's block size unless --block-size says (MLA: 64), and two in-flight batches
    of `vllm serve`'s default max_num_batched_tokens for this GPU size (async scheduling)."""
    budget.kv_shape, budget.kv_element_bytes, budget.kv_device = shape, element_bytes, device
    given = batched is not None
    assert budget.kv_layout is not None
    cpu = device == "cpu"
    batched = batched or (2048 if cpu else kvcache.serve_batched_tokens(budget.total_bytes))
    budget.in_flight = kvcache.in_flight_tokens(batched, device, async_scheduling=not cpu)
    budget.max_model_len = max_model_len
    budget.length_cap = max(shape.derived_max_model_len or 0, max_model_len or 0) or 1 << 24
    batches = "1 batch" if cpu else "2 batches (async scheduling)"
    return (
        f"KV cache as V1's hybrid manager sizes it: {kvcache.describe(budget.kv_layout)}; windowed layers keep "
        f"{fmt_int(budget.in_flight)} tokens in flight besides the window ({batches} of max_num_batched_tokens "
        f"{fmt_int(batched)}" + (")" if given else ", vLLM 0.32's `vllm serve` default here)")
    )


def layout_steps(b: Budget, length: int, unit: str) -> list[Step]:
    """Sliding, chunked or Mamba layers, or several groups: V1's blocks, blocks per request,
    concurrency and its printed token count (kvcache.py), not memory / bytes per token."""
    lay = b.kv_layout
    assert lay is not None
    got = b.capacity(length)
    assert got is not None
    per_group = kvcache.request_breakdown(lay, length, b.in_flight)
    return [
        Step("4 cache layout", kvcache.describe(lay), f"{fmt_int(lay.page_bytes)} B per block"),
        Step(
            "5 blocks",
            f"{fmt_size(max(b.cache_bytes, 0), unit)} / {fmt_int(lay.page_bytes)} B",
            fmt_int(got.num_blocks),
        ),
        Step(f"6 blocks per request at {fmt_int(length)}", per_group, fmt_int(got.blocks_per_request)),
        Step(
            f"7 sequences at {fmt_int(length)}",
            f"Maximum concurrency {fmt_int(got.num_blocks)} / {fmt_int(got.blocks_per_request)} = {got.concurrency:.2f}x",
            fmt_int(int(got.concurrency)),
        ),
        Step(
            "8 tokens vLLM reports",
            f"int({got.concurrency:.4f} x {fmt_int(length)}) (KV cache size)",
            fmt_int(got.tokens),
        ),
        Step(
            "longest sequence",
            f"largest length whose request fits in {fmt_size(max(b.cache_bytes, 0) - lay.page_bytes, unit)} "
            f"(1 null block held back){', capped at the model maximum' if b.longest_sequence >= b.length_cap else ''}",
            fmt_int(b.longest_sequence),
        ),
    ]


def split_card(needs: list[float], total_bytes: float, budget: float) -> list[float] | None:
    """Fractions of one GPU for several models: each gets what it needs to start plus a share of
    what is left in proportion to its need, all together within `budget`. None when they do not fit."""
    minimum = [n / total_bytes for n in needs]
    if sum(minimum) > budget:
        return None
    spare = budget - sum(minimum)
    whole = sum(minimum) or 1.0
    # to 0.01, down (the sum stays within the budget) but never below what a model needs to start
    fractions = [
        max(math.floor((m + spare * m / whole) * 100 + 1e-9), math.ceil(m * 100 - 1e-9)) / 100 for m in minimum
    ]
    return fractions if sum(fractions) <= budget + 1e-9 else None
