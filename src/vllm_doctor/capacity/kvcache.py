"""vLLM's KV cache manager, per version: layer specs, groups, pages, blocks, and what vLLM prints.

Follows ../shared/vllm-reference/kv-cache-v1-groups.md (V1 as 0.32 sizes it, measured) and
kv-cache-arithmetic.md (the eras), checked in the 0.32 wheel's v1/core/kv_cache_utils.py:

* one spec per cache-holding layer: full attention (MLA: one latent per token), sliding window,
  chunked local, Mamba / linear-attention state, cross-attention;
* the hybrid allocator buckets layers by spec, cuts each bucket into groups of `g` layers (the
  smallest bucket, or the largest when it is under 1.5x the smallest) and gives every group the
  same bytes per block P = g x page; a Mamba state raises the attention block size until an
  attention page holds it, and is padded to that page;
* blocks N = budget // P; one request at --max-model-len L claims R(L) blocks, summed over groups;
  V1 prints concurrency N / R(L) and (0.21+) tokens int(concurrency x L); the startup check holds
  one block back (the null block) and needs the layers' own usage to fit in budget - P.

Pure functions over a ModelShape and numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_doctor.versions import version_tuple

if TYPE_CHECKING:  # (a report without a model shape needs no shape module: 4 ms of a start)
    from vllm_doctor.capacity.shape import ModelShape

GIB = 2**30
# platforms/cpu.py; the lab's cache-oom-boundary refuses 8192 tokens in 1 GiB at 131,072 B/token and offers
# 8064 = (64 - 1 null block) x 128
CPU_BLOCK_SIZE = 128
CUDA_BLOCK_SIZE = 16
MLA_BLOCK_SIZE = {"cpu": 16, "cuda": 64}  # CPU MLA backend forces 16; FlashMLA 64
WINDOW_KINDS = ("sliding", "chunked")
MODEL_DTYPE_BYTES = 2  # the conv state's dtype: the served dtype, 16-bit (a float32 checkpoint is served in bf16)
MAMBA_ALIGN_BLOCKS = {"gdn": 2, "mamba2": 3, "mamba1": 2}  # prefix caching on ("align"); off: 1


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


@dataclass(frozen=True)
class Group:
    """One KV cache group: `layers` layers of one spec sharing a block table."""

    kind: str  # full, mla, sliding, chunked, mamba, cross
    layers: int  # real layers (the last group of a bucket may be short: padding layers)
    window: int = 0  # sliding window W or chunk size C
    state_blocks: int = 1  # Mamba: blocks one request holds

    def blocks_per_request(self, length: int, block_size: int, in_flight: int) -> int:
        """The spec's max_memory_usage_bytes / page: what one request at `length` claims. Cross-attention
        holds the encoder budget, max_num_encoder_input_tokens = max_num_batched_tokens in 0.32 (not the
        model's 1,500 Whisper frames), which the single-batch in-flight count equals."""
        if self.kind == "sliding":
            return _cdiv(min(self.window - 1 + in_flight, length), block_size) + 1
        if self.kind == "chunked":
            return _cdiv(min(self.window + in_flight, length), block_size)
        if self.kind == "mamba":
            return self.state_blocks
        if self.kind == "cross":
            return _cdiv(in_flight, block_size)
        return _cdiv(length, block_size)


@dataclass
class Layout:
    """How the cache is cut: block size, groups, bytes of one layer's page, layers per group."""

    block_size: int
    groups: list[Group]
    layer_page: int  # bytes one layer's block takes (Mamba pages padded to it)
    group_size: int  # layers per group (g)
    attn_token_bytes: int  # one attention layer, one token
    hybrid: bool  # more than one group
    mamba_state_bytes: int = 0  # before padding
    notes: list[str] = field(default_factory=list)

    @property
    def plain(self) -> bool:
        """One full-attention (or MLA) group: tokens are memory / bytes per token, as for a dense model."""
        return not self.hybrid and self.groups[0].kind in ("full", "mla")

    @property
    def page_bytes(self) -> int:
        """P: bytes per block of the shared pool."""
        return self.layer_page * self.group_size

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.kind] = out.get(g.kind, 0) + g.layers
        return out


def per_token_layers(shape: ModelShape) -> int:
    """Layers whose cache grows with every token: full attention (MLA included); a config without
    a layer pattern is all full attention."""
    plan = shape.layer_plan
    if not plan or not plan.kinds:
        return shape.layers
    windows = {"sliding": shape.sliding_window, "chunked": plan.chunk_size}
    return sum(1 for k in plan.kinds if k == "full" or (k in windows and not windows[k]))


def default_block_size(device: str | None, use_mla: bool) -> int:
    dev = "cpu" if str(device or "").lower() == "cpu" else "cuda"
    if use_mla:
        return MLA_BLOCK_SIZE[dev]
    return CPU_BLOCK_SIZE if dev == "cpu" else CUDA_BLOCK_SIZE


def hybrid_supported(vllm_version: str | None, engine: str | None = None) -> bool:
    """V1's hybrid allocator (groups per spec) exists from 0.9.1; V0 and earlier V1 size every
    windowed layer as full attention."""
    if engine == "V0":
        return False
    return version_tuple(vllm_version, unknown=(99,)) >= (0, 9, 1)


def layout(
    shape: ModelShape,
    element_bytes: float,
    tp: int = 1,
    block_size: int | None = None,
    device: str | None = None,
    hybrid_manager: bool = True,
    prefix_caching: bool = True,
    ssm_dtype_bytes: float | None = None,
    v0: bool = False,
) -> Layout:
    """The cache layout V1 builds for this model on one rank (V0: windowed layers as full, no Mamba)."""
    kv_heads = 1 if shape.use_mla else max(1, shape.kv_heads // max(1, tp))
    factor = 1 if shape.use_mla else 2
    attn_token = int(factor * kv_heads * shape.head_dim * element_bytes)
    bs = block_size or default_block_size(device, shape.use_mla)
    if shape.use_mla and str(device or "").lower() == "cpu":
        bs = MLA_BLOCK_SIZE["cpu"]  # "CPU MLA backend requires block_size=16", whatever --block-size says
    plan = shape.layer_plan
    kinds = list(plan.kinds) if plan and plan.kinds else ["full"] * shape.layers
    notes: list[str] = []
    windows = {"sliding": shape.sliding_window or 0, "chunked": (plan.chunk_size if plan else None) or 0}
    kinds = [k if k not in WINDOW_KINDS or windows[k] else "full" for k in kinds]
    if not hybrid_manager and any(k in WINDOW_KINDS for k in kinds):
        notes.append("hybrid KV cache manager off: windowed layers are sized as full attention")
        kinds = ["full" if k in WINDOW_KINDS else k for k in kinds]
    if v0:  # V0 keeps Mamba state in its own cache sized by max_num_seqs, outside the blocks
        kinds = [k for k in kinds if k != "mamba"]
    kinds = [("mla" if shape.use_mla and k == "full" else k) for k in kinds if k != "none"]
    state = 0
    if "mamba" in kinds and plan and plan.state:
        conv, ssm = plan.state.elements(tp)
        state = int(conv * MODEL_DTYPE_BYTES + ssm * (ssm_dtype_bytes or ssm_state_bytes(shape, device)))
        if any(k != "mamba" for k in kinds):
            raised = bs * _cdiv(state, bs * attn_token)
            if raised > bs:
                notes.append(f"attention block size raised to {raised} tokens so a page holds the Mamba state")
                bs = raised
    layer_page = bs * attn_token if any(k != "mamba" for k in kinds) else state
    buckets: dict[str, int] = {}
    for k in kinds:
        buckets[k] = buckets.get(k, 0) + 1
    blocks_mamba = MAMBA_ALIGN_BLOCKS.get(plan.state.kind if plan and plan.state else "", 2) if prefix_caching else 1
    if len(buckets) == 1:
        kind, n = next(iter(buckets.items()))
        groups = [Group(kind, n, windows.get(kind, 0), blocks_mamba)]
        g = n
    else:
        small, large = min(buckets.values()), max(buckets.values())
        g = large if large < small * 1.5 else small
        groups = []
        for kind, n in buckets.items():
            count = _cdiv(n, g)
            for i in range(count):
                groups.append(Group(kind, len(range(i, n, count)), windows.get(kind, 0), blocks_mamba))
    return Layout(bs, groups, layer_page, g, attn_token, len(groups) > 1, state, notes)


def ssm_state_bytes(shape: ModelShape, device: str | None) -> float:
    """Bytes per element of the temporal (SSM) state, mamba_ssm_cache_dtype 'auto' as 0.32 resolves
    it: float32 on the CPU backend ("Reset SSM cache type to float32", platforms/cpu.py) and for
    Nemotron-H unless its config says otherwise; the config's mamba_ssm_dtype for Qwen3.5; else the
    model's dtype."""
    text = shape.text_config
    named = text.get("mamba_ssm_cache_dtype") if shape.model_type == "nemotron_h" else text.get("mamba_ssm_dtype")
    if str(device or "").lower() == "cpu" or (shape.model_type == "nemotron_h" and not named):
        return 4.0
    if named:
        return 4.0 if "32" in str(named) else 2.0
    return float(MODEL_DTYPE_BYTES)


@dataclass
class Capacity:
    """What V1 computes for one budget and one --max-model-len, and what it prints."""

    num_blocks: int
    blocks_per_request: int
    concurrency: float  # N / R(L), printed "%.2fx"
    tokens: int  # "KV cache size: T tokens" as this version prints it
    needed_bytes: int  # one request at L, the startup check's left side
    available_bytes: int  # budget - P (the null block held back)
    fits: bool
    estimated_max_len: int | None  # vLLM's binary search, when it does not fit

    @property
    def needed_gib(self) -> float:
        return round(self.needed_bytes / GIB, 2)

    @property
    def available_gib(self) -> float:
        return round(self.available_bytes / GIB, 2)


def request_blocks(lay: Layout, length: int, in_flight: int) -> int:
    return sum(g.blocks_per_request(length, lay.block_size, in_flight) for g in lay.groups)


def needed_bytes(lay: Layout, length: int, in_flight: int) -> int:
    """Σ over real layers of their spec's max_memory_usage_bytes (padding layers cost nothing here)."""
    return sum(g.blocks_per_request(length, lay.block_size, in_flight) * g.layers * lay.layer_page for g in lay.groups)


def estimate_max_len(lay: Layout, available: int, upper: int, in_flight: int) -> int:
    """vLLM's binary search: the largest length <= upper whose request fits (0: not even 1 token)."""
    if needed_bytes(lay, 1, in_flight) > available:
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if needed_bytes(lay, mid, in_flight) <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_len_for_concurrency(lay: Layout, blocks: int, sequences: int, upper: int, in_flight: int) -> int:
    """The longest --max-model-len at which `sequences` requests fit in `blocks` (0: none)."""
    if not sequences or request_blocks(lay, 1, in_flight) * sequences > blocks:
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if request_blocks(lay, mid, in_flight) * sequences <= blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def capacity(
    lay: Layout, budget: float, length: int, in_flight: int = 2048, vllm_version: str | None = None
) -> Capacity:
    """V1's numbers for `budget` bytes of KV cache at --max-model-len `length`.

    Tokens by era: 0.21+ int(concurrency x L); 0.9.1-0.20 blocks // groups x block size; older V1
    and V0 blocks x block size (and concurrency blocks x block size / L)."""
    page = lay.page_bytes
    blocks = max(0, int(budget // page)) if page else 0
    per_request = request_blocks(lay, length, in_flight)
    v = version_tuple(vllm_version, unknown=(99,))
    if v >= (0, 9, 1):
        concurrency = blocks / per_request if per_request else 0.0
        tokens = int(concurrency * length) if v >= (0, 21) else blocks // len(lay.groups) * lay.block_size
    else:
        tokens = blocks * lay.block_size
        concurrency = tokens / length if length else 0.0
    need = needed_bytes(lay, length, in_flight)
    available = int(budget) - page
    fits = need <= available
    estimate = None if fits else estimate_max_len(lay, available, length, in_flight)
    return Capacity(blocks, per_request, concurrency, tokens, need, available, fits, estimate)


def serve_batched_tokens(gpu_bytes: float | None) -> int:
    """vLLM 0.32's `vllm serve` default max_num_batched_tokens on a GPU: 8192 from 70 GiB, else 2048
    (engine/arg_utils.py; an A100 gets 2048 too, which a size alone cannot tell)."""
    return 8192 if gpu_bytes is None or gpu_bytes >= 70 * GIB else 2048


def in_flight_tokens(max_num_batched_tokens: int | None, device: str | None, async_scheduling: bool = False) -> int:
    """M, the tokens scheduled but not settled that windowed layers keep besides the window:
    one (two with async scheduling) batches of max_num_batched_tokens; `vllm serve` on CPU: 2048."""
    batched = max_num_batched_tokens or 2048
    return batched * (2 if async_scheduling and str(device or "").lower() != "cpu" else 1)


def request_breakdown(lay: Layout, length: int, in_flight: int) -> str:
    """'5 x 19 sliding + 128 full': each group's blocks for one request, equal ones counted once."""
    counts: dict[tuple[int, str], int] = {}
    for g in lay.groups:
        key = (g.blocks_per_request(length, lay.block_size, in_flight), g.kind)
        counts[key] = counts.get(key, 0) + 1
    return " + ".join(f"{n} x {b:,} {kind}" if n > 1 else f"{b:,} {kind}" for (b, kind), n in counts.items())


def describe(lay: Layout) -> str:
    """'2 groups of 18 layers (18 full, 18 sliding 128), 16-token blocks of 589,824 B'."""
    parts = []
    for kind, n in lay.kinds().items():
        window = next((g.window for g in lay.groups if g.kind == kind and g.window), 0)
        parts.append(f"{n} {kind}" + (f" {window:,}" if window else ""))
    many = len(lay.groups) > 1
    what = f"{len(lay.groups)} group{'s' if many else ''} of {lay.group_size} layer{'s' if lay.group_size > 1 else ''}"
    return f"{what} ({', '.join(parts)}), {lay.block_size}-token blocks of {lay.page_bytes:,} B"
