"""Other processes as /proc shows them: a command line, a parent, the process listening on a port.
Each answer is None where /proc does not say (another user's process, no procfs)."""

from __future__ import annotations

import os

from vllm_doctor.capacity.colocated import PROC, cmdline
from vllm_doctor.serveargs import items, server_words

LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on `port` (IPv4 and IPv6)."""
    out = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == LISTEN and int(parts[1].rsplit(":", 1)[1], 16) == port:
                out.add(parts[9])
    return out


def socket_owner(inodes: set[str]) -> int | None:
    """The first process holding one of these sockets, from the /proc/*/fd it may read."""
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(entry / "fd" / fd) in wanted:
                    return int(entry.name)
            except OSError:
                continue
    return None


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
    """/proc/meminfo in bytes: MemTotal, MemAvailable, ..."""
    out = {}
    try:
        for line in (PROC / "meminfo").read_text().splitlines():
            name, _, rest = line.partition(":")
            value = rest.split()
            if value and value[0].isdigit():
                out[name] = int(value[0]) * (1024 if value[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return out
