"""vLLM's own defaults by release, as each release's config classes say them (the atlas:
src/vllm_doctor/atlas/defaults.json, read from the wheels by scripts/vllm_atlas.py), and the few
rules by which vLLM resolves a default left open:

* --gpu-memory-utilization: a number in the config class up to 0.33 (0.9, then 0.92); from 0.34
  None, resolved by CacheConfig.resolved_gpu_memory_utilization: 1.0 with the extensible KV cache
  (sized from memory measured after warmup and CUDA graph capture; on by default on CUDA and ROCm),
  else DEFAULT_GPU_MEMORY_UTILIZATION (0.92).
* the version a log or a command does not name: DEFAULT_VERSION, the release the lab records.

Every command that assumes a default asks here (check, plan, explain's fix checks and the
colocated processes' share), so none assumes 0.9 where the release says otherwise, and no fix moves
a value below its release's default.
"""

from __future__ import annotations

from typing import Any

from vllm_doctor.capacity.arithmetic import SAFE_UTILIZATION
from vllm_doctor.capacity.kvcache import CUDA_BLOCK_SIZE
from vllm_doctor.versions import version_tuple

DEFAULT_VERSION = "0.32.0"  # the release the lab records; what a log or command that names none runs
EXTENSIBLE_BACKENDS = ("cuda", "rocm")  # where 0.34's extensible KV cache is on by default
CONSERVATIVE = 0.90  # the level a lower --gpu-memory-utilization is raised to at least


def backend(device: str | None) -> str:
    """The backend a log's device names, as the defaults are keyed: "cpu", else "cuda"."""
    return "cpu" if str(device or "").lower() == "cpu" else "cuda"


def release(version: str | None) -> dict[str, Any]:
    """The release's defaults by name (the nearest release the atlas read, at or below it); a
    version that is no version (a mangled log's) reads as none named."""
    from vllm_doctor.atlas import defaults

    try:
        return defaults(version or DEFAULT_VERSION)
    except ValueError:
        return defaults(DEFAULT_VERSION)


def extensible_cache(version: str | None, backend: str = "cuda") -> bool:
    """Whether the release sizes the KV cache again after warmup (0.34+, CUDA and ROCm by default)."""
    d = release(version)
    if "enable_extensible_kv_cache" not in d:
        return False
    on = d["enable_extensible_kv_cache"]
    return bool(on) if on is not None else backend in EXTENSIBLE_BACKENDS


def utilization(version: str | None, backend: str = "cuda", extensible: bool | None = None) -> float:
    """--gpu-memory-utilization when the command leaves it out, as the release resolves it."""
    d = release(version)
    value = d.get("gpu_memory_utilization")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if extensible if extensible is not None else extensible_cache(version, backend):
        return 1.0
    fallback = d.get("DEFAULT_GPU_MEMORY_UTILIZATION")
    return float(fallback) if isinstance(fallback, (int, float)) else CONSERVATIVE


def block_size(version: str | None) -> int:
    """The KV block size on CUDA when the command leaves it out: the release's number (16 up to
    0.33; 0.34's CacheConfig.DEFAULT_BLOCK_SIZE is 64), before a backend's own preference (MLA)."""
    d = release(version)
    for name in ("block_size", "DEFAULT_BLOCK_SIZE"):
        value = d.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return CUDA_BLOCK_SIZE


def raise_target(version: str | None, backend: str = "cuda") -> float:
    """What a lower utilization is raised to: the release's default, at least 0.90, never past 0.95;
    0.90 where the log names no release (a default guessed is no reason to raise past it)."""
    if not version_tuple(version):
        return CONSERVATIVE
    return min(SAFE_UTILIZATION, max(CONSERVATIVE, utilization(version, backend)))
