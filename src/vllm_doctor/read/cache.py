"""Where vllm-doctor keeps what it can rebuild: parsed built-in rules, the compiled prefilter.

Everything here is derived data, keyed by what it was made from, and written atomically; a
cache that cannot be read or written is simply not used. VLLM_DOCTOR_NO_CACHE=1 turns it off.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path | None:
    if os.environ.get("VLLM_DOCTOR_NO_CACHE"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if base.startswith("~"):  # no home directory
        return None
    return Path(base) / "vllm-doctor"


def read(name: str) -> bytes | None:
    d = cache_dir()
    if d is None:
        return None
    try:
        return (d / name).read_bytes()
    except OSError:
        return None


def write(name: str, data: bytes) -> None:
    d = cache_dir()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f"{name}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, d / name)
    except OSError:
        pass
