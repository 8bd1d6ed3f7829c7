"""The guardian: a tiny process that outlives the wrapper, so that the wrapper's death (SIGKILL,
the OOM killer) still ends vLLM and leaves no raw capture behind.

vLLM's main process gets PR_SET_PDEATHSIG SIGTERM (process.py), but a server already in its
shutdown ("Waiting for connections to close") ignores SIGTERM, and the death signal reaches
only the direct child, not its EngineCore. So the wrapper starts this process first (its own
process group: a Ctrl-C at the terminal is the wrapper's to forward) and holds the only write
end of a pipe to it. When that pipe closes without a "done", the wrapper is gone: the guardian
deletes the temporary capture (raw, unredacted output), sends SIGTERM to vLLM's process group,
and SIGKILL once the grace period is over (the wrapper's own deadline, when it had forwarded a
signal already). Records on the pipe end in NUL (a path may hold a newline).

This file also runs as a script (`python -I -S guardian.py GRACE`): its top imports the
standard library only, for a start in milliseconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

STEP = 0.05  # seconds between looks at whether the group has gone


# ---- the guardian process ----------------------------------------------------------------------
def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _end(group: int, deadline: float) -> None:
    """SIGTERM to the group, SIGKILL at the deadline if anything of it is left."""
    try:
        os.killpg(group, signal.SIGTERM)
    except OSError:
        return  # gone already
    while time.monotonic() < deadline:
        if not _alive(group):
            return
        time.sleep(STEP)
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass


def watch(fd: int, grace: float) -> None:
    """Read the wrapper's records until the pipe closes, then act on what is left of them."""
    group: int | None = None
    capture: bytes | None = None
    deadline: float | None = None
    buf = b""
    while data := os.read(fd, 4096):
        *records, buf = (buf + data).split(b"\0")
        for record in records:
            word, _, arg = record.partition(b" ")
            if word == b"group":
                group = int(arg)
            elif word == b"capture":
                capture = arg
            elif word == b"deadline":
                deadline = float(arg)
            elif word == b"reaped":  # vLLM is gone: its group's number may be another's soon
                group = None
            elif word == b"done":  # the wrapper finished its work: nothing to do at its exit
                group = capture = None
    if capture:
        try:
            os.unlink(capture)
        except OSError:
            pass
    if group:
        _end(group, deadline if deadline is not None else time.monotonic() + grace)


def main(argv: list[str]) -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the wrapper's signals are not ours
        signal.signal(s, signal.SIG_IGN)
    watch(0, float(argv[1]))


# ---- the wrapper's side ------------------------------------------------------------------------
class Guardian:
    """The wrapper's end of the pipe; every call is a no-op once the guardian could not start."""

    def __init__(self, grace: float):
        self.pid: int | None = None
        self._fd: int | None = None
        self._deadline: float | None = None
        r, w = os.pipe()  # both non-inheritable: vLLM never holds the write end
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), repr(float(grace))],
                stdin=r,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                process_group=0,
            )
            self.pid, self._fd = proc.pid, w
            self._proc = proc  # kept: collected once it has exited (subprocess reaps it then)
        except OSError:
            os.close(w)
        finally:
            os.close(r)

    def _send(self, record: bytes) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, record + b"\0")
        except OSError:  # the guardian is gone: the wrapper goes on without one
            self.close()

    def group(self, pid: int) -> None:
        self._send(b"group %d" % pid)

    def capture(self, path: str) -> None:
        self._send(b"capture " + os.fsencode(path))

    def deadline(self, at: float | None) -> None:
        """The wrapper's SIGKILL deadline (time.monotonic(): one clock for every process)."""
        if at is not None and at != self._deadline:
            self._deadline = at
            self._send(b"deadline %r" % at)

    def reaped(self) -> None:
        self._send(b"reaped")

    def done(self) -> None:
        """The wrapper has finished: vLLM reaped, the capture deleted or kept on purpose."""
        self._send(b"done")
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


if __name__ == "__main__":
    main(sys.argv)
