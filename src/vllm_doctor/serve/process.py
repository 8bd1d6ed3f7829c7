"""vLLM's processes: started in a process group of their own, signalled as a group, and
whatever outlives the main process reaped and named (Linux /proc; elsewhere the group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The child with its output on two pipes (raises OSError when it cannot run)."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        bufsize=0,
        # its own process group, so that signals reach all of vLLM; not its own session: a new
        # session is a new scheduler autogroup on Linux, and on a small machine a busy vLLM
        # in one starves everything else (seen here: a 10 s stall of a /metrics scraper)
        process_group=0,
    )
    for pipe in (proc.stdout, proc.stderr):
        widen_pipe(pipe.fileno() if pipe is not None else -1)
    return proc


def widen_pipe(fd: int, size: int = 1 << 20) -> None:
    """A larger pipe (Linux): the child blocks less often and each read moves more bytes."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
    except (OSError, ImportError, ValueError):
        pass  # a smaller limit (/proc/sys/fs/pipe-max-size) or not Linux: the default is fine


def signal_group(pid: int, signum: int, waited: bool = False) -> None:
    """Send a signal to the process group `pid` leads, else (the group is gone or not ours:
    the child may have left it) to the process itself; a process already gone is no error.

    `waited`: the main process has been waited for, so its pid may belong to another process
    by now and only the group is signalled."""
    try:
        os.killpg(pid, signum)
    except OSError:
        if waited:
            return
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes of a process group, from /proc (Linux)."""
    out: list[tuple[int, str]] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for d in entries:
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read().decode("utf-8", "replace")
            fields = st[st.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            out.append((int(d), cmd[:200] or st[st.index("(") + 1 : st.rindex(")")]))
        except (OSError, ValueError, IndexError):
            continue
    return out


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reap(pgid: int) -> tuple[list[dict[str, Any]], str | None]:
    """Kill whatever is left of vLLM's process group (EngineCore, Worker, resource_tracker).

    Returns the survivors ({pid, command, killed}) and the line that names them (None when
    nothing was left)."""
    left = group_members(pgid)
    if not left and sys.platform == "linux":
        return [], None
    if not left and group_alive(pgid):
        left = [(0, f"process group {pgid}")]
    if not left:
        return [], None
    for p, _cmd in left:
        if p:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    signal_group(pgid, signal.SIGKILL, waited=True)
    time.sleep(0.1)
    still = {p for p, _ in group_members(pgid)}
    survivors = [{"pid": p or None, "command": cmd, "killed": p not in still} for p, cmd in left]
    return survivors, survivors_line(left, still)


def survivors_line(left: list[tuple[int, str]], still: set[int]) -> str:
    names = ", ".join(f"pid {p} {cmd.split(' ')[0] or '?'}" if p else cmd for p, cmd in left[:6])
    more = f" and {len(left) - 6} more" if len(left) > 6 else ""
    failed = [p for p, _ in left if p in still]
    tail = f"; {len(failed)} could not be killed" if failed else ""
    them = "them" if len(left) > 1 else "it"
    return (
        f"{len(left)} of vLLM's processes outlived the main one ({names}{more}); "
        f"killed {them} so that no memory stays held{tail}"
    )
