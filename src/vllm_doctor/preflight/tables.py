"""The preflight's tables, read from rules/tables/preflight.toml (data, not rules: the rule loader
skips rules/tables/): vLLM's numbers the checks compare against (the open-files target, the swap
fractions, the CPU backend's defaults, the vocabulary padding, file names), the lowest compute
capability per quantisation method and dtype, the quantisation methods per vLLM release and those
that quantise as they load."""

from __future__ import annotations

import functools
from typing import Any

FILE = "preflight.toml"


@functools.cache
def table() -> dict[str, Any]:
    import tomllib

    from vllm_doctor.matching.loader import TABLES, builtin_dir

    return tomllib.loads((builtin_dir() / TABLES / FILE).read_text(encoding="utf-8"))


def vllm(name: str) -> Any:
    """A number or name of vLLM the checks compare against ([vllm]: nofile_target, cpu_block_size, ...)."""
    return table()["vllm"][name]


def host(name: str) -> Any:
    """A fact of the hosts vLLM runs on ([host]: container_shm_mib)."""
    return table()["host"][name]


def min_capability(method: str) -> int | None:
    """The lowest compute capability (major x 10 + minor) of a quantisation method; None: not known."""
    return table()["min_capability"].get(method)


def dtype_min_capability(dtype: str) -> int | None:
    return table()["dtype_min_capability"].get(dtype)


def dtype_auto_fallback_since() -> str:
    """The first vLLM release whose --dtype auto falls back to float16 where bfloat16 is not supported."""
    return table()["dtype_auto_fallback"]["since"]


def quantization() -> dict[str, Any]:
    """source_file, fallback_version, online (methods) and methods (release -> its list)."""
    return table()["quantization"]


def fallback_methods() -> tuple[list[str], str]:
    """The quantisation methods of the release the table falls back to, and that release."""
    q = quantization()
    return list(q["methods"][q["fallback_version"]]), q["fallback_version"]
