"""The log's server as one question to the capacity model (capacity/start.py): its command as a
StartQuery, the same command with a fix applied, and the re-ask every fix passes before it is shown.

The log states the flags (non-default args), the backend, vLLM's KV space ("Explicitly set (1.0/..)
GiB" is VLLM_CPU_KVCACHE_SPACE), the budget of a GPU's cache ("available KV cache memory") and, on
the CPU backend, its host: the CPUs ("Reducing Torch threads from N", the OpenMP binding's core
ids), the NUMA nodes allowed and the VLLM_CPU_OMP_THREADS_BIND it ran with. A bind string is cut
from the log's host, never from the machine running vllm-doctor (another host, for someone else's
log); where the log does not print its CPUs, the command turns the binding off (nobind) and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vllm_doctor.knowledge.contract import CheckInput, CheckResult, check

if TYPE_CHECKING:
    from vllm_doctor.capacity.shape import ModelShape
    from vllm_doctor.capacity.start import StartQuery

GIB = 2**30
BIND = "VLLM_CPU_OMP_THREADS_BIND"
SPACE = "VLLM_CPU_KVCACHE_SPACE"
# the variables of a start the corrected command carries as leading VAR=value words
START_ENV = (SPACE, BIND, "VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE")
# the names query() reads, for the declaration of the check that calls it
READS = frozenset({
    "device", "max_model_len", "tp", "tensor_parallel_size", "pipeline_parallel_size", "kv_cache_dtype", "dtype",
    "block_size", "max_num_batched_tokens", "enable_prefix_caching", "disable_hybrid_kv_cache_manager",
    "kv_cache_memory_bytes", "num_gpu_blocks_override", "quantization", "vllm_version", "cpu_kvcache_space",
    "kv_cache.explicit_gib", "available_gib", "kv_cache.available_gib", "allowed", "cpu.torch_threads",
    "cpu.core_ids", "cpu.reserved_cpus", "cpu.omp_threads_bind",
})  # fmt: skip
# the flags a fix may change that the capacity model takes (others: nothing to re-ask)
ASKED = {
    "--max-model-len": "max_model_len", "--tensor-parallel-size": "tp", "--kv-cache-dtype": "kv_cache_dtype",
    "--block-size": "block_size", "--kv-cache-memory-bytes": "kv_cache_memory_bytes",
    "--num-gpu-blocks-override": "num_gpu_blocks_override", "--quantization": "quantization",
    "--pipeline-parallel-size": "pp",
}  # fmt: skip

SPLITS = ("--tensor-parallel-size", "--pipeline-parallel-size")  # fixes that move the weights per GPU
_TP = ("tp-heads", "tp-kv-heads", "tp-vocab", "cpu-numa", "cpu-bind", "cache", "gpus")
ADDRESSES = {  # the refusals a fix to this flag is for
    "--tensor-parallel-size": _TP, "--pipeline-parallel-size": ("pp-layers", "gpus", "cpu-numa", "cpu-bind"),
    "--max-model-len": ("context", "cache"), "--kv-cache-dtype": ("cache",), "--block-size": ("cache",),
    "--kv-cache-memory-bytes": ("cache",), "--num-gpu-blocks-override": ("cache",), "--quantization": ("cpu-fp8",),
    SPACE: ("cache", "cpu-kvcache-space"), BIND: ("cpu-numa", "cpu-bind"), "VLLM_ALLOW_LONG_MAX_MODEL_LEN": ("context",),
}  # fmt: skip


def as_int(value: Any) -> int | None:
    """A log's number as a whole one ('2', '2.0', '1,024'); None for none, junk, NaN or infinity."""
    try:
        return int(float(str(value).replace(",", ""))) if value is not None and value is not False else None
    except (ValueError, OverflowError):
        return None


def log_env(get: Callable[..., Any]) -> dict[str, str]:
    """The variables of the log's start that it states: the CPU backend's explicit KV space and a
    thread binding other than 'auto'."""
    if str(get("device") or "").lower() != "cpu":
        return {}
    env = {}
    explicit = get("cpu_kvcache_space", "kv_cache.explicit_gib")
    if explicit is not None and not as_int(get("kv_cache_memory_bytes")):
        env[SPACE] = str(int(float(explicit)))
    bind = str(get("cpu.omp_threads_bind") or "auto").strip()
    if bind not in ("", "auto"):
        env[BIND] = bind
    return env


def numa_nodes(get: Callable[..., Any]) -> int | None:
    """The NUMA nodes the log's host allowed ("Allowed NUMA nodes are [0]"); None where it does not say."""
    allowed = get("allowed")
    return len([n for n in str(allowed).split(",") if n.strip()]) if allowed is not None else None


def log_cpus(get: Callable[..., Any]) -> int | None:
    """The CPUs of the log's host as it prints them: torch's threads before vLLM reduced them, or
    past the highest CPU id its OpenMP binding named; None where it prints neither."""
    ids = [
        int(x)
        for n in ("cpu.core_ids", "cpu.reserved_cpus")
        for x in str(get(n) or "").split(",")
        if x.strip().isdigit()
    ]
    known = [n for n in (as_int(get("cpu.torch_threads")), max(ids) + 1 if ids else None) if n]
    return max(known) if known else None


def bind_note(get: Callable[..., Any], env: dict[str, str], world: int) -> str | None:
    """What the corrected command's thread binding assumes, where it added one."""
    if world < 2 or env.get(BIND) in (None, log_env(get).get(BIND)):
        return None
    cpus = log_cpus(get)
    if env[BIND] != "nobind":
        return f"{BIND}={env[BIND]} cut from the {cpus} CPUs the log's host has"
    if cpus is None:
        return f"{BIND}=nobind: the log prints no CPUs of its host to cut a bind string from"
    return f"{BIND}=nobind: the log's host has {cpus} CPUs for {world} ranks"


def fix_env(get: Callable[..., Any], env: dict[str, str], flag: str, value: str | None, world: int) -> dict[str, str]:
    """The environment of the command with the fix applied: the fix's own variable, and on the CPU
    backend a bind string cut from the log's host's CPUs for ranks its NUMA nodes cannot each take."""
    env = dict(env)
    if flag in START_ENV and value is not None:
        env[flag] = str(value)
    if str(get("device") or "").lower() == "cpu":
        _bind(env, world, numa_nodes(get), log_cpus(get))
    return env


def _bind(env: dict[str, str], world: int, nodes: int | None, cpus: int | None) -> None:
    """VLLM_CPU_OMP_THREADS_BIND for `world` CPU ranks when 'auto' may need more NUMA nodes than
    there are (unknown: one): a CPU list per rank of the host's CPUs, else no binding at all."""
    from vllm_doctor.capacity.start import bind_string

    if world > 1 and env.get(BIND, "auto") == "auto" and (nodes or 1) < world:
        env[BIND] = (bind_string(cpus, world) if cpus else None) or "nobind"


def query(get: Callable[..., Any], shape: ModelShape | None) -> StartQuery | None:
    """The log's start as a StartQuery (`get(*names)`: the first known value); None without a model
    or a V1 backend to tell."""
    from vllm_doctor.capacity import start

    if shape is None:
        return None
    cpu = str(get("device") or "").lower() == "cpu"
    env = log_env(get)
    bytes_given = as_int(get("kv_cache_memory_bytes"))
    budget = None
    printed = get("available_gib")  # the cache check's "available": the budget less the null block
    if printed is not None:
        budget = (float(printed) + 0.005) * GIB  # the upper edge of its rounding: vLLM's own estimate fits
    elif get("kv_cache.available_gib") is not None:
        budget = float(get("kv_cache.available_gib")) * GIB
    nodes = numa_nodes(get)
    q = start.StartQuery(
        shape, "cpu" if cpu else "cuda", as_int(get("max_model_len")), as_int(get("tp", "tensor_parallel_size")) or 1,
        as_int(get("pipeline_parallel_size")) or 1, get("kv_cache_dtype"), get("dtype"), as_int(get("block_size")),
        as_int(get("max_num_batched_tokens")), get("enable_prefix_caching") is not False,
        not get("disable_hybrid_kv_cache_manager"), bytes_given, as_int(get("num_gpu_blocks_override")),
        get("quantization"), env, budget, get("vllm_version") or start.DEFAULT_VERSION, nodes, log_cpus(get),
    )  # fmt: skip
    if printed is not None:  # the printed figure is the budget less one block
        q.budget_bytes = (q.budget_bytes or 0) + start.layout_of(q).page_bytes
    return q


def with_fix(q: StartQuery, flag: str, value: str | None, weights_gib: Any = None) -> StartQuery | None:
    """The same start with the fix applied (None: a fix the model does not take). A TP above 1 on
    the CPU backend without NUMA nodes for its ranks gets a bind string cut from the log's host's
    CPUs (nobind where the log does not print them); another split on a GPU, the cache per GPU that
    split leaves (split_budget), where the log says the weights per GPU."""
    env = dict(q.env)
    if flag in START_ENV:
        env[flag] = str(value)
        return replace(q, env=env)
    field = ASKED.get(flag)
    if field is None or value is None:
        return None
    new = value if field in ("kv_cache_dtype", "quantization") else as_int(value)
    if new is None:
        return None
    changes: dict[str, Any] = {field: new}
    fixed = replace(q, **changes, env=env)
    if field in ("tp", "pp") and q.backend != "cpu":
        fixed.budget_bytes = split_budget(q, fixed, weights_gib)
    if q.backend == "cpu":
        _bind(fixed.env, fixed.tp * fixed.pp, q.numa_nodes, q.cpus)
    return fixed


def split_budget(q: StartQuery, fixed: StartQuery, weights_gib: Any) -> float | None:
    """The cache per GPU at another TP x PP: the log's budget, plus the weights per GPU the split
    frees (less what a smaller one adds), less the 0.5 GiB of non-torch memory (NCCL) TP past 1
    adds (capacity/serving.py's default); None where the log gives no budget or no weights per GPU."""
    weights = _number(weights_gib)
    if q.budget_bytes is None or not weights:
        return None
    per_gpu = weights * GIB
    old, new = q.tp * q.pp, fixed.tp * fixed.pp
    nccl = 0.5 * GIB if q.tp == 1 < fixed.tp else -0.5 * GIB if fixed.tp == 1 < q.tp else 0.0
    return q.budget_bytes + per_gpu - per_gpu * old / new - nccl


def _number(value: Any) -> float | None:
    try:
        return float(value) if value is not None and value is not False else None
    except (TypeError, ValueError):
        return None


def _values_get(values: dict[str, Any]) -> Callable[..., Any]:
    return lambda *names: next((values[n] for n in names if values.get(n) is not None), None)


def reask(flag: str | None, value: str | None, values: dict[str, Any], shape: ModelShape | None) -> str | None:
    """Why the command with this fix still does not start, or None (it starts, or cannot be asked)."""
    if not flag or shape is None:
        return None
    q = query(_values_get(values), shape)
    if q is None:
        return None
    fixed = with_fix(q, flag, value, values.get("weights_gib"))
    if fixed is None:
        return None
    from vllm_doctor.capacity.start import ask

    before, after = {w for w, _ in ask(q).refusals}, ask(fixed)
    # what the fix breaks, or what it is for and still refuses; a refusal the log's own start passed
    # (a config that is not quite the served model's) is not the fix's to mend
    left = [why for what, why in after.refusals if what not in before or what in ADDRESSES.get(flag, ())]
    if left or not after.fixable:
        return f"with {flag} {value} it still does not start: {'; '.join(left) or after.reason}"
    return None


@check(
    reads=READS | {"free_gib", "needed_gib", "workers"},
    returns={
        "kvcache_space_needed",
        "kvcache_space_below_free",
        "start_unfixable",
        "start_refused",
        "cpu_bind_string",
        "cpu_bind_why",
        "log_cpus",
    },
)
def start_model(inp: CheckInput) -> CheckResult:
    """The capacity model's answer for the log's command: whether it starts and why not, whether any
    change can start it; on the CPU backend the whole-GiB VLLM_CPU_KVCACHE_SPACE it needs and a bind
    string for its ranks cut from the log's host's CPUs (or why none can be cut)."""
    from vllm_doctor.capacity import start

    out: dict[str, Any] = {}
    cpu = str(inp.get("device") or "").lower() == "cpu"
    q = query(inp.get, inp.options.shape)
    need = None
    if q is not None:
        answer = start.ask(q)
        out["start_unfixable"] = not answer.fixable
        if answer.starts is False:
            out["start_refused"] = answer.reason
        need = start.space_needed(q) if cpu and answer.fixable else None
    elif cpu and inp.get("needed_gib") is not None:  # no config: vLLM's figure, and a block on top of it
        need = int(float(inp.get("needed_gib"))) + 1
    if not cpu or out.get("start_unfixable"):
        return CheckResult(out)
    if need is not None:
        out["kvcache_space_needed"] = need
    free = inp.get("free_gib")
    if free is not None and (need or 1) < float(free):
        out["kvcache_space_below_free"] = max(need or 1, int(float(free) // 2))
    world = as_int(inp.get("workers")) or (q.tp * q.pp if q else as_int(inp.get("tp", "tensor_parallel_size")) or 1)
    cpus = log_cpus(inp.get)
    bind = start.bind_string(cpus, world) if world > 1 and cpus else None
    if bind:
        out["cpu_bind_string"], out["log_cpus"] = bind, cpus
    elif world > 1:
        out["cpu_bind_why"] = (f"the log's host has {cpus} CPUs for {world} ranks" if cpus
                               else "the log prints no CPUs of its host to cut a bind string from")  # fmt: skip
    return CheckResult(out)


def figures(flag: str | None, value: str | None, values: dict[str, Any], shape: ModelShape | None) -> str | None:
    """The before/after figures of a fix that the re-ask says starts: what refused, and the cache
    after; for another split on a GPU that could not be asked for its cache, what it assumes."""
    if not flag or value is None:
        return None
    if shape is None:
        return _assumes(flag, value, values, "no model config to ask (pass --config)")
    from vllm_doctor.capacity.start import ask

    q = query(_values_get(values), shape)
    fixed = with_fix(q, flag, value, values.get("weights_gib")) if q is not None else None
    if q is None or fixed is None:
        return None
    if fixed.budget_bytes is None and flag in SPLITS and q.backend != "cpu":
        return _assumes(flag, value, values, "the log gives no KV budget and weights per GPU to move to it")
    before, after = ask(q), ask(fixed)
    if after.starts is not True or before.starts is not False or after.capacity is None:
        return None
    c = after.capacity
    return (f"Re-checked: before, {before.refusals[0][1]}; with it, the start passes "
            f"({c.tokens:,} KV tokens; one {after.max_model_len:,}-token sequence needs {c.needed_gib} of {c.available_gib} GiB).")  # fmt: skip


def _assumes(flag: str, value: str, values: dict[str, Any], why: str) -> str | None:
    """What a TP or PP fix on a GPU takes on trust where it cannot be asked again."""
    if flag not in SPLITS or str(values.get("device") or "").lower() == "cpu":
        return None
    return (f"Not re-checked for the cache: {why}; it assumes {value} GPUs each with this one's memory, "
            "each holding its share of the weights and KV heads.")  # fmt: skip
