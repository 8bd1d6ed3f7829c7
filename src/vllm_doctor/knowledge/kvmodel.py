"""The log's facts as the inputs of vLLM's KV cache manager (capacity/kvcache.py): the layout of
the model's cache on one rank, the budget in bytes, the length, the tokens in flight; shared by
the cross-check (knowledge/crosscheck.py) and the cache-oom fit (kv_fit in knowledge/checks.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_doctor.knowledge.contract import CheckInput
from vllm_doctor.versions import version_tuple

if TYPE_CHECKING:
    from vllm_doctor.capacity.kvcache import Capacity, Layout
    from vllm_doctor.capacity.shape import ModelShape

GIB = 2**30
# the names kv_model reads, for the declarations of the checks that call it
READS = frozenset({
    "kv_cache_dtype", "dtype", "tp", "tensor_parallel_size", "block_size", "kv_cache.block_size", "vllm_version",
    "device", "engine", "max_model_len", "max_num_batched_tokens", "memory.total_gib", "kv_cache_memory_bytes",
    "enable_prefix_caching", "disable_hybrid_kv_cache_manager",
})  # fmt: skip


@dataclass
class KvModel:
    shape: ModelShape
    element_bytes: float
    kv_dtype: str
    tp: int
    layout: Layout
    block_size_said: bool
    max_model_len: int | None
    in_flight: int
    in_flight_from: str
    vllm_version: str | None
    v0: bool
    exact_budget: int | None  # --kv-cache-memory-bytes from the log's arguments
    relayout: Callable[[float], Layout]  # the same layout for another KV element size

    @property
    def modelled(self) -> bool:
        """Not one plain full-attention group: vLLM's token count is not memory / bytes per token."""
        return not self.layout.plain

    def budget_bytes(self, gib: float) -> int:
        """The exact budget when the log's arguments give one that its rounded GiB line agrees with."""
        if self.exact_budget and abs(self.exact_budget / GIB - gib) <= 0.006:
            return self.exact_budget
        return int(gib * GIB)

    def fits_with(self, element_bytes: float, budget: int) -> bool | None:
        """Whether one max-length request passes the startup check with this KV element size."""
        from vllm_doctor.capacity import kvcache

        if not self.max_model_len:
            return None
        lay = self.relayout(element_bytes)
        return kvcache.needed_bytes(lay, self.max_model_len, self.in_flight) <= budget - lay.page_bytes

    def capacity(self, budget: int, length: int | None = None) -> Capacity | None:
        from vllm_doctor.capacity import kvcache

        length = length or self.max_model_len
        if not length:
            return None
        version = "0.9.0" if self.v0 else self.vllm_version  # V0 counts blocks x block size
        return kvcache.capacity(self.layout, budget, length, self.in_flight, version)


def block_size(inp: CheckInput) -> tuple[int, bool]:
    """(block size, whether the log said it)."""
    b = inp.get("block_size", "kv_cache.block_size")
    if b:
        return int(b), True
    from vllm_doctor.capacity import defaults
    from vllm_doctor.capacity.kvcache import CPU_BLOCK_SIZE, CUDA_BLOCK_SIZE

    version = inp.get("vllm_version")  # the CPU attention backend's own block from 0.20
    if str(inp.get("device") or "").lower() == "cpu":
        return (CPU_BLOCK_SIZE if version and version_tuple(version) >= (0, 20) else CUDA_BLOCK_SIZE), False
    return (defaults.block_size(version) if version else CUDA_BLOCK_SIZE), False  # 0.34: 64


def is_v1(inp: CheckInput) -> bool:
    engine = inp.get("engine")
    if engine:
        return engine == "V1"
    version = inp.get("vllm_version")
    return bool(version) and version_tuple(version) >= (0, 8, 0)


def in_flight(inp: CheckInput) -> tuple[int, str]:
    """(M, where it came from): the tokens windowed layers keep besides their window."""
    batched = inp.get("max_num_batched_tokens")
    device = str(inp.get("device") or "").lower()
    version = version_tuple(inp.get("vllm_version"), unknown=(99,))
    said = "the log's max_num_batched_tokens"
    if batched is None:
        total = inp.get("memory.total_gib")
        from vllm_doctor.capacity import kvcache

        gpu_bytes = None if total is None else float(total) * GIB  # unknown: a large GPU assumed
        batched = 2048 if device == "cpu" else kvcache.serve_batched_tokens(gpu_bytes)
        said = "vLLM's default max_num_batched_tokens for `vllm serve` (assumed)"
    if device != "cpu" and version >= (0, 32):  # async scheduling, on by default on GPUs: two batches
        return 2 * int(batched), f"2 x {int(batched):,} ({said}, async scheduling)"
    return int(batched), said


def kv_model(inp: CheckInput) -> KvModel | None:
    """The model's cache as the log's vLLM lays it out; None without a model config."""
    shape = inp.options.shape
    if shape is None:
        return None
    from vllm_doctor.capacity import arithmetic as cap
    from vllm_doctor.capacity import kvcache

    element, dtype = cap.kv_element_bytes(inp.get("kv_cache_dtype"), cap.serving_dtype(inp.get("dtype"), shape.dtype))
    tp = int(inp.get("tp", "tensor_parallel_size") or 1)
    bsize, said = block_size(inp)
    v1 = is_v1(inp)
    hybrid = v1 and kvcache.hybrid_supported(inp.get("vllm_version")) and not inp.get("disable_hybrid_kv_cache_manager")
    device = str(inp.get("device") or "")
    prefix = inp.get("enable_prefix_caching")

    def relayout(element_bytes: float) -> Layout:
        size = bsize if said or device.lower() == "cpu" else None  # unsaid on a GPU: the backend's own
        return kvcache.layout(shape, element_bytes, tp, size, device, hybrid, prefix is not False, v0=not v1)

    lay = relayout(element)
    length = inp.get("max_model_len")
    m, m_from = in_flight(inp)
    exact = inp.get("kv_cache_memory_bytes")
    return KvModel(shape, element, dtype, tp, lay, said, int(length) if length else None, m, m_from,
                   inp.get("vllm_version"), not v1, int(exact) if exact else None, relayout)  # fmt: skip


def hybrid_target(inp: CheckInput, target: int, target_len: int) -> dict[str, object] | None:
    """For a model whose cache is not one full-attention group: whether `target` requests of
    `target_len` fit and the longest length at which they do, by blocks per request (the logged
    token count is concurrency x length there, not slots). None when the model or memory is unknown."""
    km = kv_model(inp)
    gib = inp.get("kv_cache.available_gib")
    if km is None or not km.modelled or gib is None:
        return None
    from vllm_doctor.capacity import kvcache

    budget = km.budget_bytes(float(gib))
    got = km.capacity(budget, target_len)
    if got is None:
        return None
    upper = max(target_len, km.shape.derived_max_model_len or 0)
    longest = kvcache.max_len_for_concurrency(km.layout, got.num_blocks, target, upper, km.in_flight)
    return {"can_hold_target": got.concurrency >= target, "target_max_model_len": longest}
