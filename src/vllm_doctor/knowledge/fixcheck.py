"""Fixes held to the numbers: one check for every rule's fixes, run where they are rendered.

A fix says what it does to which flag (`flag`, `direction`, `value` in the rule file). Before it
is shown, its value is compared with the flag's current value (the log's facts and command line):
a "lower" that is not below the current value, a "raise" not above it, a value equal to the
current one, a --gpu-memory-utilization past arithmetic.SAFE_UTILIZATION (0.95) or beside an
explicit KV space, a TP size that is the current one or does not divide the heads, a
--max-model-len cut for a queue (the paged cache reserves nothing per maximum length) or below
--target-len: each is refused (a utilization outside (0, 1] that vLLM refuses itself is set to a
fraction on every backend), with the reason, and the engine tries the fix's next variant or
drops it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm_doctor.capacity.modelcfg import ModelShape

TP_FLAG = "--tensor-parallel-size"
UTIL_FLAG = "--gpu-memory-utilization"
LEN_FLAG = "--max-model-len"
SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
# the KV space set explicitly: vLLM sizes the cache from it, not from the utilization
KV_SPACE_FACTS = ("kv_cache_memory_bytes", "cpu_kvcache_space", "kv_cache.explicit_gib")
# the categories of a running server whose queue waits on a full cache
QUEUE_CATEGORIES = ("queue-saturation",)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(str(value).replace(",", ""))
    except ValueError:
        return None


def current(flag: str, values: dict[str, Any]) -> Any:
    """The flag's value in this log: `--max-model-len` is the fact max_model_len."""
    name = flag.lstrip("-").replace("-", "_")
    if flag == SPACE_ENV:
        return next(
            (values[n] for n in ("cpu_kvcache_space", "kv_cache.explicit_gib", "kv_gib") if values.get(n) is not None),
            None,
        )
    if flag == TP_FLAG:
        return values.get("tp") if values.get("tp") is not None else values.get("tensor_parallel_size")
    return values.get(name)


def release_default(flag: str, values: dict[str, Any]) -> float | None:
    """The number a flag left out holds in the log's release (capacity/defaults.py, from the atlas);
    None where the atlas has no number for it."""
    from vllm_doctor.capacity import defaults

    version = values.get("vllm_version")
    if flag == UTIL_FLAG:
        return defaults.utilization(version, defaults.backend(values.get("device")))
    value = defaults.release(version).get(flag.lstrip("-").replace("-", "_"))
    return _number(value)


def refuse(
    flag: str | None,
    direction: str | None,
    value: str | None,
    values: dict[str, Any],
    *,
    category: str = "",
    shape: ModelShape | None = None,
    target_len: int | None = None,
) -> str | None:
    """Why this fix contradicts the numbers, or None when nothing known contradicts it."""
    if not flag:
        return None
    now = current(flag, values)
    new, old = _number(value), _number(now)
    if value is not None and now is not None and (new == old if new is not None else str(now) == value):
        return f"{flag} is {now} already"
    if direction == "enable" and now is True:
        return f"{flag} is on already"
    if new is not None and old is not None:
        if direction == "lower" and new >= old:
            return f"{value} is not below the current {flag} {now}"
        if direction == "raise" and new <= old:
            return f"{value} is not above the current {flag} {now}"
    if direction == "raise" and now is None:  # unset: the release's default holds (0.34's utilization: 1.0)
        from vllm_doctor.capacity.arithmetic import SAFE_UTILIZATION

        default = release_default(flag, values)
        whose = f"vLLM {values['vllm_version']}'s" if values.get("vllm_version") else "vLLM's"
        if default is not None and new is not None and new <= default:
            return f"{value} is not above {whose} default {flag} {default:g}"
        if default is not None and flag == UTIL_FLAG and new is None and default >= SAFE_UTILIZATION:
            return f"{whose} default {flag} is {default:g} already (the extensible KV cache takes all it measures)"
    if flag == UTIL_FLAG:
        if old is not None and not 0 < old <= 1 and new is not None and 0 < new <= 1:
            return None  # vLLM refuses the value itself, on every backend: a fraction is the fix, not a size
        # an explicit KV space says it first, then the backend
        return _utilization(direction, new, old, values) or _backend(flag, direction, value, values)
    why = _backend(flag, direction, value, values)
    if why:
        return why
    if flag == TP_FLAG and new is not None:
        why = _tp(int(new), values, shape)
    if flag == LEN_FLAG and direction == "lower":
        if category in QUEUE_CATEGORIES:
            return "the paged KV cache reserves nothing per --max-model-len: a shorter maximum frees no space"
        if target_len and new is not None and new < target_len:
            return f"{value} is below --target-len {target_len}: the target's sequences would not fit"
    if why is None and value:  # the command with the fix applied, asked again (knowledge/startask.py)
        from vllm_doctor.knowledge.startask import reask

        why = reask(flag, value, values, shape)
    return why


def _backend(flag: str, direction: str | None, value: str | None, values: dict[str, Any]) -> str | None:
    """A fix the backend in front of it cannot take: on the CPU backend the cache is
    VLLM_CPU_KVCACHE_SPACE (whole GiB), there are no GPUs to add and no fp8 quantisation kernel."""
    cpu = str(values.get("device") or "").lower() == "cpu"
    if flag == SPACE_ENV:
        if not cpu:
            return f"{SPACE_ENV} sizes the cache of the CPU backend only"
        if value is not None and not str(value).strip().isdigit():
            return f"{SPACE_ENV}={value}: vLLM reads whole GiB with int()"
    if not cpu:
        return None
    if flag == UTIL_FLAG:
        return f"on the CPU backend the cache is sized by {SPACE_ENV}, not by the utilization"
    if flag == "--quantization" and "fp8" in str(value or "").lower():
        return "the CPU backend has no fp8 quantisation kernel"
    if flag == TP_FLAG and direction == "raise" and value is None:
        return "the CPU backend has no GPUs to add"
    return None


def _utilization(direction: str | None, new: float | None, old: float | None, values: dict[str, Any]) -> str | None:
    from vllm_doctor.capacity.arithmetic import SAFE_UTILIZATION

    explicit = next((name for name in KV_SPACE_FACTS if values.get(name) is not None), None)
    if explicit:
        return f"the KV space is set explicitly ({explicit}): the utilization does not size the cache"
    if new is not None and new > SAFE_UTILIZATION:
        return f"{new} is past {SAFE_UTILIZATION}"
    if direction == "raise" and old is not None and old >= SAFE_UTILIZATION:
        return f"{UTIL_FLAG} is {old} already, at the {SAFE_UTILIZATION} ceiling"
    return None


def _tp(tp: int, values: dict[str, Any], shape: ModelShape | None) -> str | None:
    from vllm_doctor.capacity.arithmetic import tp_ok

    if tp < 1:
        return f"{TP_FLAG} {tp} is no size"
    heads = _count(
        values.get("heads") or values.get("num_attention_heads") or (shape.attention_heads if shape else None)
    )
    kv_heads = _count(values.get("kv_heads") or values.get("num_kv_heads") or (shape.kv_heads if shape else None))
    if not tp_ok(tp, heads, kv_heads):
        return f"{TP_FLAG} {tp} does not divide {heads} attention heads and {kv_heads} KV heads"
    dimension = _count(values.get("dimension"))
    if dimension and dimension % tp:
        return f"{TP_FLAG} {tp} does not divide the dimension {dimension}"
    return None


def _count(value: Any) -> int | None:
    """A count the log printed (heads, a dimension); None for none, or for text that is no count
    (a mangled line's 5000-digit run stays text: engine.number)."""
    try:
        return int(value) if value else None
    except (TypeError, ValueError):
        return None
