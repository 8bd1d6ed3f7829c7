"""Other processes as /proc shows them: a command line, a parent, the process listening on a port.
Each answer is None where /proc does not say (another user's process, no procfs)."""

from __future__ import annotations

import os

from vllm_doctor.capacity.colocated import PROC, cmdline

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
    """'pid 123 (python -m http.server 8000)', 'pid 123', or 'a process this user cannot see'."""
    if pid is None:
        return "a process this user cannot see"
    words = cmdline(pid)
    if not words:
        return f"pid {pid}"
    text = " ".join(words)
    return f"pid {pid} ({text[:117] + '...' if len(text) > 120 else text})"


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
