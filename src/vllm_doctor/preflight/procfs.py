"""Other processes as the system shows them (psutil): a command line, the process listening on a
port, the host's memory. Each answer is None where the system does not say (another user's process)."""

from __future__ import annotations

import os

import psutil

from vllm_doctor.capacity.colocated import cmdline
from vllm_doctor.serveargs import items, server_words


def listener(port: int) -> int | None:
    """The process listening on TCP `port` (IPv4 or IPv6), None where this user cannot see it."""
    try:
        found = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return next(
        (c.pid for c in found if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid), None
    )


def describe(pid: int | None) -> str:
    """'pid 123 (python -m http.server)', 'pid 123 (vllm serve my/model)', 'pid 123', or 'a process
    this user cannot see'. The program only, never the rest of another process's command line: it
    may hold an API key that no mask knows the form of."""
    if pid is None:
        return "a process this user cannot see"
    words = cmdline(pid)
    if not words:
        return f"pid {pid}"
    served = server_words(words)
    if served is not None:
        model = dict(items(served)[1]).get("model") or items(served)[0]
        return f"pid {pid} (vllm serve {model[:100] if model else '…'})"
    program = [os.path.basename(words[0])]
    if program[0].startswith("python") and len(words) > 1:
        program += ["-m", words[2]] if words[1] == "-m" and len(words) > 2 else [os.path.basename(words[1])]
    return f"pid {pid} ({' '.join(program)[:100]})"


def meminfo() -> dict[str, int]:
    """The host's memory in bytes, as /proc/meminfo names it: MemTotal, MemAvailable (empty: unknown)."""
    try:
        mem = psutil.virtual_memory()
    except (psutil.Error, OSError):
        return {}
    return {"MemTotal": mem.total, "MemAvailable": mem.available}
