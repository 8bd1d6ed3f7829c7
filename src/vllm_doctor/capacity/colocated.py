"""Which vLLM server each GPU process belongs to, and the --gpu-memory-utilization it asked for,
from /proc/<pid>/cmdline on this machine (the process, or its parent: V1's EngineCore and the
workers are spawned children whose own command line is multiprocessing's).

Several servers on one GPU each take their fraction of the card's total memory; the fractions must
sum under 1.0 or the later start fails. Only the utilization, the model and the server's pid are
kept: a command line may hold an API key, and no other argument leaves this module.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization (V0 and V1)
ANCESTORS = 3  # EngineCore -> API server; a worker -> EngineCore -> API server


def _argv(pid: int, proc: Path) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _parent(pid: int, proc: Path) -> int | None:
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1]) or None
    except (OSError, ValueError, IndexError):
        return None
    return None


def is_server(argv: list[str]) -> bool:
    """`vllm serve ...` or `python -m vllm.entrypoints.openai.api_server ...`."""
    words = [a.rsplit("/", 1)[-1] for a in argv[:6]]
    return ("vllm" in words and "serve" in argv[:7]) or any("vllm.entrypoints" in a for a in argv[:6])


def _flag(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        for form in (f"--{name}", f"--{name.replace('-', '_')}"):
            if a == form and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(form + "="):
                return a.split("=", 1)[1]
    return None


def server_of(pid: int, proc: Path = Path("/proc")) -> tuple[int, str | None, float, bool] | None:
    """(the server's pid, its model, its utilization, whether the flag was given), or None when
    neither the process nor its parents are a vLLM server."""
    current: int | None = pid
    for _ in range(ANCESTORS + 1):
        if current is None:
            return None
        argv = _argv(current, proc)
        if is_server(argv):
            value = _flag(argv, "gpu-memory-utilization")
            try:
                util = float(value) if value is not None else DEFAULT_UTILIZATION
            except ValueError:
                util = DEFAULT_UTILIZATION
            model = _flag(argv, "model")
            if model is None and "serve" in argv:
                after = argv[argv.index("serve") + 1 :]
                model = after[0] if after and not after[0].startswith("-") else None
            return current, model[:200] if model else None, util, value is not None
        current = _parent(current, proc)
    return None
