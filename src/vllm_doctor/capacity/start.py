"""The one question every command asks: does this `vllm serve` command start here, and with what cache?

`ask(StartQuery)` answers it for vLLM 0.32 (V1) on a GPU or on the CPU backend, from the model's
config, the flags and the environment that shape the start or the cache:

* the checks vLLM runs before the cache: heads and KV heads by --tensor-parallel-size (a model whose
  heads are not a multiple of its KV heads starts at no TP), the padded vocabulary by TP,
  --max-model-len above the model's maximum without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, TP x PP
  against the GPUs, and on the CPU backend VLLM_CPU_KVCACHE_SPACE as vLLM reads it (int()) and
  the OpenMP binding (VLLM_CPU_OMP_THREADS_BIND 'auto' needs a NUMA node per rank; a bind string
  needs one CPU list per rank, naming this host's CPUs);
* the KV cache: the budget (VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes,
  --num-gpu-blocks-override, or the utilization arithmetic's bytes the caller passes), the layout
  (kvcache.layout: block size, the hybrid manager, off with --disable-hybrid-kv-cache-manager or
  for chunked local attention with VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0, prefix
  caching, --max-num-batched-tokens), and vLLM's startup check with its null block.

explain's fix check (knowledge/fixcheck.py), check (preflight) and plan ask it; a fix is shown
only when the command with it applied starts (or moves the numbers the way it says).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_doctor.capacity import arithmetic as cap
from vllm_doctor.capacity import defaults, kvcache
from vllm_doctor.capacity.defaults import DEFAULT_VERSION
from vllm_doctor.capacity.shape import ModelShape

GIB = 2**30
VOCAB_PADDING = 64  # DEFAULT_VOCAB_PADDING_SIZE (rules/tables/preflight.toml has the same)
TRUE = ("1", "true", "yes", "on")


@dataclass
class StartQuery:
    """One start: the model, the flags and environment that shape it, where it runs."""

    shape: ModelShape
    backend: str = "cuda"  # "cpu" or "cuda"
    max_model_len: int | None = None  # None: the model's maximum
    tp: int = 1
    pp: int = 1
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    prefix_caching: bool = True
    hybrid_manager: bool = True  # False: --disable-hybrid-kv-cache-manager
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    quantization: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    budget_bytes: float | None = None  # the cache the utilization arithmetic leaves (unknown: None)
    vllm_version: str | None = DEFAULT_VERSION
    numa_nodes: int | None = None  # the CPU host's NUMA nodes (unknown: None)
    cpus: int | None = None  # the CPUs this host lets the server use (unknown: None)
    gpus: int | None = None  # visible GPUs (unknown: None)


@dataclass
class StartAnswer:
    """starts: True / False, or None when the cache's budget is unknown and nothing else refuses."""

    starts: bool | None
    refusals: list[tuple[str, str]]  # (what refuses, why), in vLLM's order
    fixable: bool = True  # False: no change of the command starts this model (its heads)
    layout: kvcache.Layout | None = None
    capacity: kvcache.Capacity | None = None
    budget: float | None = None
    budget_from: str = ""
    max_model_len: int | None = None

    @property
    def tokens(self) -> int | None:
        return self.capacity.tokens if self.capacity else None

    @property
    def reason(self) -> str:
        return "; ".join(why for _what, why in self.refusals)


def cpu_kvcache_space(text: str | None) -> int | None:
    """VLLM_CPU_KVCACHE_SPACE as vLLM reads it (int(), GiB; 0 or unset: not set). Raises ValueError
    for a value int() refuses, as vLLM does at config time."""
    if text is None or not str(text).strip():
        return None
    value = int(str(text).strip())
    return value if value > 0 else None


def bind_ranks(bind: str) -> list[list[int]] | None:
    """A VLLM_CPU_OMP_THREADS_BIND string as CPU ids per rank ('0-3|4-7'); None for auto/nobind."""
    if bind in ("", "auto", "nobind", "all"):
        return None
    ranks: list[list[int]] = []
    for part in bind.split("|"):
        ids: list[int] = []
        for piece in part.split(","):
            lo, _, hi = piece.strip().partition("-")
            ids += list(range(int(lo), int(hi or lo) + 1))
        ranks.append(ids)
    return ranks


def bind_string(cpus: int, ranks: int) -> str | None:
    """This host's CPUs cut into one range per rank ('0|1' on two CPUs); None when too few."""
    if ranks < 1 or cpus < ranks:
        return None
    each = cpus // ranks
    return "|".join(f"{r * each}" if each == 1 else f"{r * each}-{r * each + each - 1}" for r in range(ranks))


def _shape_checks(q: StartQuery) -> tuple[list[tuple[str, str]], bool]:
    s, tp = q.shape, q.tp
    out: list[tuple[str, str]] = []
    heads, kv = s.attention_heads, s.kv_heads
    if not s.use_mla and heads and kv and heads % kv:
        why = f"{heads} attention heads are not a multiple of {kv} KV heads: no --tensor-parallel-size starts it"
        return [("model-heads", why)], False
    if heads and heads % tp:
        out.append(("tp-heads", f"--tensor-parallel-size {tp} does not divide {heads} attention heads"))
    elif not s.use_mla and not cap.tp_ok(tp, None, kv):
        out.append(("tp-kv-heads", f"--tensor-parallel-size {tp} and {kv} KV heads: neither divides the other"))
    elif s.vocab_size and not s.use_mla and cap.cdiv(s.vocab_size, VOCAB_PADDING) * VOCAB_PADDING % tp:
        padded = cap.cdiv(s.vocab_size, VOCAB_PADDING) * VOCAB_PADDING
        out.append(("tp-vocab", f"--tensor-parallel-size {tp} does not divide the padded vocabulary {padded}"))
    if q.pp > s.layers:
        out.append(("pp-layers", f"--pipeline-parallel-size {q.pp} is above the {s.layers} layers"))
    return out, True


def _length(q: StartQuery) -> tuple[int | None, list[tuple[str, str]]]:
    derived = q.shape.derived_max_model_len
    length = q.max_model_len or derived
    allowed = q.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in TRUE
    if q.max_model_len and derived and q.max_model_len > derived and not allowed:
        why = f"--max-model-len {q.max_model_len} is above the model's maximum {derived} (VLLM_ALLOW_LONG_MAX_MODEL_LEN unset)"
        return length, [("context", why)]
    return length, []


def _devices(q: StartQuery) -> list[tuple[str, str]]:
    world = q.tp * q.pp
    if q.backend != "cpu":
        if q.gpus is not None and world > q.gpus:
            return [("gpus", f"TP x PP = {world} needs {world} GPUs; {q.gpus} visible")]
        return []
    out: list[tuple[str, str]] = []
    if q.quantization and "fp8" in q.quantization.lower():
        out.append(("cpu-fp8", "the CPU backend has no fp8 quantisation kernel"))
    bind = q.env.get("VLLM_CPU_OMP_THREADS_BIND", "auto").strip() or "auto"
    try:
        ranks = bind_ranks(bind)
    except ValueError:
        return [*out, ("cpu-bind", f"VLLM_CPU_OMP_THREADS_BIND={bind!r} is no CPU list")]
    if ranks is None:
        if bind == "auto" and world > 1 and q.numa_nodes is not None and q.numa_nodes < world:
            out.append(("cpu-numa", f"VLLM_CPU_OMP_THREADS_BIND=auto needs a NUMA node for each of the {world} "
                                    f"ranks; the host has {q.numa_nodes}"))  # fmt: skip
        return out
    if len(ranks) != world:
        out.append(("cpu-bind", f"VLLM_CPU_OMP_THREADS_BIND names {len(ranks)} CPU lists for {world} ranks"))
    elif q.cpus is not None and any(i >= q.cpus for r in ranks for i in r):
        out.append(("cpu-bind", f"VLLM_CPU_OMP_THREADS_BIND={bind} names CPUs this host's {q.cpus} do not have"))
    return out


def hybrid_on(q: StartQuery) -> bool:
    """V1's hybrid allocator: off by the flag, or for a chunked-local model by the variable."""
    if not q.hybrid_manager:
        return False
    plan = q.shape.layer_plan
    chunked = bool(plan and plan.kinds and "chunked" in plan.kinds and plan.chunk_size)
    return not (chunked and q.env.get("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "").strip() == "0")


def layout_of(q: StartQuery) -> kvcache.Layout:
    element, _ = cap.kv_element_bytes(q.kv_cache_dtype, cap.serving_dtype(q.dtype, q.shape.dtype))
    block = q.block_size
    if block is None and q.backend != "cpu" and not q.shape.use_mla:  # the release's (0.34: 64), not 16 for all
        block = defaults.block_size(q.vllm_version)
    return kvcache.layout(q.shape, element, q.tp, block, q.backend, hybrid_on(q), q.prefix_caching)


def budget_of(q: StartQuery, lay: kvcache.Layout) -> tuple[float | None, str, list[tuple[str, str]]]:
    """(KV bytes per rank, where they come from, refusals)."""
    if q.num_gpu_blocks_override:
        return q.num_gpu_blocks_override * lay.page_bytes, "--num-gpu-blocks-override", []
    if q.backend == "cpu":
        text = q.env.get("VLLM_CPU_KVCACHE_SPACE")
        try:
            space = cpu_kvcache_space(text)
        except ValueError:
            return (
                None,
                "",
                [("cpu-kvcache-space", f"VLLM_CPU_KVCACHE_SPACE={text!r}: vLLM reads whole GiB with int()")],
            )
        if space:
            return space * GIB, f"VLLM_CPU_KVCACHE_SPACE={space}", []
    if q.kv_cache_memory_bytes:
        return float(q.kv_cache_memory_bytes), "--kv-cache-memory-bytes", []
    return q.budget_bytes, "the memory left after the weights and activations", []


def in_flight(q: StartQuery) -> int:
    batched = q.max_num_batched_tokens or (2048 if q.backend == "cpu" else kvcache.serve_batched_tokens(None))
    return kvcache.in_flight_tokens(batched, q.backend, async_scheduling=q.backend != "cpu")


def ask(q: StartQuery) -> StartAnswer:
    """Does this command start, and with what cache (module doc)."""
    refusals, fixable = _shape_checks(q)
    if not fixable:
        return StartAnswer(False, refusals, fixable=False)
    length, said = _length(q)
    refusals += said + _devices(q)
    lay = layout_of(q)
    budget, source, bad = budget_of(q, lay)
    refusals += bad
    answer = StartAnswer(False if refusals else None, refusals, True, lay, None, budget, source, length)
    if budget is None or not length:
        return answer
    answer.capacity = kvcache.capacity(lay, budget, length, in_flight(q), q.vllm_version)
    if not answer.capacity.fits:
        c = answer.capacity
        refusals.append(("cache", f"one {length:,}-token sequence needs {c.needed_gib} GiB of KV cache; "
                                  f"{c.available_gib} GiB is available ({source})"))  # fmt: skip
    answer.starts = not refusals
    return answer


def longest(q: StartQuery) -> int | None:
    """The longest --max-model-len this cache holds, capped at the model's maximum (None: unknown)."""
    lay = layout_of(q)
    budget, _source, bad = budget_of(q, lay)
    if budget is None or bad:
        return None
    upper = q.shape.derived_max_model_len or q.max_model_len or 0
    if q.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in TRUE and q.max_model_len:
        upper = max(upper, q.max_model_len)
    return kvcache.estimate_max_len(lay, int(budget) - lay.page_bytes, upper, in_flight(q)) if upper else None


def space_needed(q: StartQuery) -> int | None:
    """The smallest whole-GiB VLLM_CPU_KVCACHE_SPACE at which this command's cache check passes."""
    length = q.max_model_len or q.shape.derived_max_model_len
    if not length:
        return None
    lay = layout_of(q)
    need = kvcache.needed_bytes(lay, length, in_flight(q)) + lay.page_bytes
    return max(1, cap.cdiv(need, GIB))
