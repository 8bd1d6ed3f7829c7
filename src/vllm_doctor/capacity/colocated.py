"""Which vLLM server each GPU process belongs to, and the --gpu-memory-utilization it asked for,
from each process's command line on this machine (psutil; the process, or its parent: V1's EngineCore and the
workers are spawned children whose own command line is multiprocessing's).

Several servers on one GPU each take their fraction of the card's total memory; the fractions must
sum under 1.0 or the later start fails (oversubscribed). Only the utilization, the model and the
server's pid are kept: a command line may hold an API key, and no other argument leaves this module.
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm_doctor.capacity.defaults import utilization
from vllm_doctor.serveargs import items, server_words

ANCESTORS = 3  # EngineCore -> API server; a worker -> EngineCore -> API server


def oversubscribed(shares: Iterable[float]) -> bool:
    """Servers on one GPU whose --gpu-memory-utilization fractions sum to 1.0 or more: the later
    start fails. V1 refuses to start when the free memory is under total x utilization ("Free memory
    on device ... is less than desired GPU memory utilization", gpu_worker.py; 0.14+ v1/worker/
    utils.py), and a running server holds its whole fraction plus its CUDA context, which lies
    outside the fraction (the startup snapshot is taken after it): at exactly 1.0 the second server
    sees less free than it asks for. Rounded to hundredths, so 0.7 + 0.3 is 1.0, not 0.99999."""
    return round(sum(shares), 2) >= 1.0


def cmdline(pid: int) -> list[str] | None:
    """A process's command line, or None where the system does not say (gone, another user's)."""
    import psutil  # lazily: explain's cold start reads no process

    try:
        return [a for a in psutil.Process(pid).cmdline() if a] or None
    except (psutil.Error, OSError, ValueError):
        return None


def parent(pid: int) -> int | None:
    """A process's parent pid, or None where the system does not say."""
    import psutil

    try:
        return psutil.Process(pid).ppid()
    except (psutil.Error, OSError, ValueError):
        return None


def server_of(pid: int) -> tuple[int, str | None, float, bool] | None:
    """(the server's pid, its model, its utilization, whether the flag was given), or None when
    neither the process nor its parents are a vLLM server."""
    current: int | None = pid
    for _ in range(ANCESTORS + 1):
        if current is None or current <= 1:
            return None
        served = server_words(cmdline(current) or [])
        if served is not None:
            positional, flags = items(served)
            given = dict(flags)
            value = given.get("gpu_memory_utilization")
            try:
                util = float(value) if value is not None else utilization(None)
            except ValueError:
                util = utilization(None)  # (its release unknown: the default one's)
            model = given.get("model") or positional
            return current, model[:200] if model else None, util, value is not None
        current = parent(current)
    return None
