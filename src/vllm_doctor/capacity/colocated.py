"""Which vLLM server each GPU process belongs to, and the --gpu-memory-utilization it asked for,
from /proc/<pid>/cmdline on this machine (the process, or its parent: V1's EngineCore and the
workers are spawned children whose own command line is multiprocessing's).

Several servers on one GPU each take their fraction of the card's total memory; the fractions must
sum under 1.0 or the later start fails (oversubscribed). Only the utilization, the model and the
server's pid are kept: a command line may hold an API key, and no other argument leaves this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from vllm_doctor.serveargs import items, server_words

DEFAULT_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization (V0 and V1)
ANCESTORS = 3  # EngineCore -> API server; a worker -> EngineCore -> API server
PROC = Path("/proc")


def oversubscribed(shares: Iterable[float]) -> bool:
    """Servers on one GPU whose --gpu-memory-utilization fractions sum to 1.0 or more: the later
    start fails. V1 refuses to start when the free memory is under total x utilization ("Free memory
    on device ... is less than desired GPU memory utilization", gpu_worker.py; 0.14+ v1/worker/
    utils.py), and a running server holds its whole fraction plus its CUDA context, which lies
    outside the fraction (the startup snapshot is taken after it): at exactly 1.0 the second server
    sees less free than it asks for. Rounded to hundredths, so 0.7 + 0.3 is 1.0, not 0.99999."""
    return round(sum(shares), 2) >= 1.0


def cmdline(pid: int, proc: Path = PROC) -> list[str] | None:
    """A process's command line, or None where /proc does not say (gone, another user's)."""
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a] or None


def parent(pid: int, proc: Path = PROC) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the name, which may hold spaces
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def server_of(pid: int, proc: Path = PROC) -> tuple[int, str | None, float, bool] | None:
    """(the server's pid, its model, its utilization, whether the flag was given), or None when
    neither the process nor its parents are a vLLM server."""
    current: int | None = pid
    for _ in range(ANCESTORS + 1):
        if current is None or current <= 1:
            return None
        served = server_words(cmdline(current, proc) or [])
        if served is not None:
            positional, flags = items(served)
            given = dict(flags)
            value = given.get("gpu_memory_utilization")
            try:
                util = float(value) if value is not None else DEFAULT_UTILIZATION
            except ValueError:
                util = DEFAULT_UTILIZATION
            model = given.get("model") or positional
            return current, model[:200] if model else None, util, value is not None
        current = parent(current, proc)
    return None
