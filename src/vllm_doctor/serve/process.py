"""vLLM's processes: started in a process group of their own, signalled as a group, and
whatever outlives the main process reaped and named (Linux /proc; elsewhere the group).

A descendant can leave the group (setsid(), setpgid()); a forwarded signal reaches it too
(`signal_left` walks parent links down from the child). On Linux the wrapper is a child
subreaper (PR_SET_CHILD_SUBREAPER), so such a process, once its parent is gone, becomes the
wrapper's child instead of init's, and `family` finds it by walking parent links down from
the wrapper. The child gets PR_SET_PDEATHSIG: if the wrapper is killed (SIGKILL, the OOM
killer), vLLM receives SIGTERM and shuts its engine down as on a Ctrl-C; one that ignores it
(hung in its shutdown) and the rest of the group are ended by the guardian (guardian.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
DEATH_SIGNAL = signal.SIGTERM  # vLLM's own shutdown: it stops its EngineCore and workers


def _prctl() -> Any:
    """libc's prctl, looked up before any fork (Linux), else None."""
    if sys.platform != "linux":
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).prctl
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


def become_subreaper() -> bool:
    """Orphaned descendants of this process become its children, not init's (Linux)."""
    prctl = _prctl()
    return bool(prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _death_signal(prctl: Any, parent: int) -> Any:
    """The child's preexec: DEATH_SIGNAL once the wrapper dies; at once when it already has."""
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:  # the wrapper died between fork and prctl
            os.kill(os.getpid(), DEATH_SIGNAL)

    return preexec


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The child with its output on two pipes (raises OSError when it cannot run)."""
    become_subreaper()
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
        preexec_fn=_death_signal(_prctl(), os.getpid()),
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


def _table() -> dict[int, tuple[int, int, str, str]]:
    """pid -> (parent pid, process group, state, name) of every process in /proc (Linux)."""
    out: dict[int, tuple[int, int, str, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for d in entries:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                st = f.read().decode("utf-8", "replace")
            fields = st[st.rindex(")") + 2 :].split()
            out[int(d)] = (int(fields[1]), int(fields[2]), fields[0], st[st.index("(") + 1 : st.rindex(")")])
        except (OSError, ValueError, IndexError):
            continue
    return out


def _command(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        cmd = ""
    return cmd[:200] or name


def children() -> set[int]:
    """The pids of this process's children (Linux /proc)."""
    me = os.getpid()
    return {pid for pid, row in _table().items() if row[0] == me}


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes of a process group, from /proc (Linux)."""
    me = os.getpid()
    return [
        (pid, _command(pid, name))
        for pid, (_ppid, pgrp, state, name) in sorted(_table().items())
        if pgrp == pgid and pid != me and state not in ("Z", "X")
    ]


def _below(table: dict[int, tuple[int, int, str, str]], root: int, skip: set[int]) -> set[int]:
    """The descendants of `root` in a /proc table (parent links walked down), less `skip` and theirs."""
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _pgrp, _state, _name) in table.items():
        kids.setdefault(ppid, []).append(pid)
    below, todo = set(), [p for p in kids.get(root, []) if p not in skip]
    while todo:
        p = todo.pop()
        if p not in below:
            below.add(p)
            todo += kids.get(p, [])
    return below


def signal_left(pid: int, signum: int) -> list[int]:
    """Send a signal to the descendants of our child `pid` that left its process group
    (setsid(), setpgid()), which a signal to the group misses; returns their pids (Linux /proc).
    Nothing once `pid` is no child of ours: it was waited for, and may be another process now."""
    table = _table()
    sent: list[int] = []
    if table.get(pid, (0,))[0] != os.getpid():  # not our child (any more): the pid may be another's now
        return sent
    for p in sorted(_below(table, pid, set())):
        if table[p][1] != pid and table[p][2] not in ("Z", "X"):
            try:
                os.kill(p, signum)
                sent.append(p)
            except OSError:
                pass
    return sent


def family(pgid: int, exclude: Iterable[int] = ()) -> list[tuple[int, str, bool]]:
    """(pid, command line, left the group) of what is left of vLLM: its process group, and the
    descendants of this process that are not in it (those that called setsid(); orphans come
    to us as the subreaper). `exclude`: our own children that are not vLLM's. Zombies among
    our children other than the group leader are collected on the way."""
    table = _table()
    me = os.getpid()
    skip = set(exclude) | {me}
    below = _below(table, me, skip)
    out = []
    for pid in sorted(below | {p for p, row in table.items() if row[1] == pgid}):
        ppid, pgrp, state, name = table[pid]
        if pid in skip:
            continue
        if state in ("Z", "X"):
            if ppid == me and pid != pgid:  # an orphan that died as our child
                _collect(pid)
            continue
        out.append((pid, _command(pid, name), pgrp != pgid))
    return out


def _collect(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:
        pass


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def reap(pgid: int, exclude: Iterable[int] = ()) -> tuple[list[dict[str, Any]], str | None]:
    """Kill whatever is left of vLLM: its process group (EngineCore, Worker, resource_tracker)
    and the descendants that left it.

    Returns the survivors ({pid, command, killed, left_group}) and the line that names them
    (None when nothing was left)."""
    left = family(pgid, exclude)
    if not left and sys.platform == "linux":
        return [], None
    if not left and group_alive(pgid):
        left = [(0, f"process group {pgid}", False)]
    if not left:
        return [], None
    for p, _cmd, _out in left:
        if p:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
    signal_group(pgid, signal.SIGKILL, waited=True)
    time.sleep(0.1)
    for p, _cmd, _out in left:
        if p:
            _collect(p)  # those that came to us as the subreaper
    still = {p for p, _, _ in family(pgid, exclude)}
    survivors = [
        {"pid": p or None, "command": cmd, "killed": p not in still, "left_group": out} for p, cmd, out in left
    ]
    return survivors, survivors_line(left, still)


def survivors_line(left: list[tuple[int, str, bool]], still: set[int]) -> str:
    names = ", ".join(
        (f"pid {p} {cmd.split(' ')[0] or '?'}" + (" (had left the process group)" if out else "")) if p else cmd
        for p, cmd, out in left[:6]
    )
    more = f" and {len(left) - 6} more" if len(left) > 6 else ""
    failed = [p for p, _, _ in left if p in still]
    tail = f"; {len(failed)} could not be killed" if failed else ""
    them = "them" if len(left) > 1 else "it"
    return (
        f"{len(left)} of vLLM's processes outlived the main one ({names}{more}); "
        f"killed {them} so that no memory stays held{tail}"
    )
