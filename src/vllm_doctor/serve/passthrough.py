"""The pass-through: the server's bytes go from its pipes to our stdout/stderr in chunks, as
they arrive (os.read / os.write, never line by line), and each chunk is then handed, as it
is, to whoever reads on the side (capture, markers, live watch). vllm-doctor's own lines go
to stderr only at a line boundary, so they never split one of vLLM's lines.
"""

from __future__ import annotations

import os
import select
import selectors
import threading
from collections import deque
from collections.abc import Callable

from vllm_doctor.render.visible import visible

READ_SIZE = 1 << 20  # bytes asked of a pipe at a time (the pipes are widened to this)
BURST = 8  # reads of one pipe before the others get a look (while it stays full)


class Output:
    """Our stdout and stderr: every byte written, whatever the reader does; a reader that goes
    away (EPIPE) only stops that stream, never the server or the capture."""

    def __init__(self, fds: tuple[int, ...]):
        self.dead: set[int] = set()
        self.mid_line: dict[int, bool] = dict.fromkeys(fds, False)
        self._notes: deque[str] = deque()
        self._lock = threading.Lock()

    def write(self, fd: int, data: bytes | memoryview) -> None:
        if fd in self.dead or not data:
            return
        view = memoryview(data)
        try:
            while view:
                try:
                    view = view[os.write(fd, view) :]
                except BlockingIOError:  # a non-blocking stdout (rare): wait for room, drop nothing
                    select.select([], [fd], [], 5.0)
        except OSError:  # the reader went away (EPIPE) or the fd is closed: keep capturing
            self.dead.add(fd)
            return
        self.mid_line[fd] = data[-1:] != b"\n"

    def note(self, message: str) -> None:
        """Queue one line of vllm-doctor's own, printed at the next line boundary."""
        with self._lock:
            self._notes.append(message)

    def flush_notes(self, fd: int, force: bool = False) -> None:
        if not self._notes:
            return
        mid = any(self.mid_line.values())
        if mid and not force:
            return
        with self._lock:
            notes = list(self._notes)
            self._notes.clear()
        lead = b"\n" if mid else b""  # only when vLLM has ended mid-line
        text = visible("".join(n + "\n" for n in notes))  # what a note quotes: escapes, not commands
        self.write(fd, lead + text.encode("utf-8", "replace"))


class Pump:
    """Reads the child's pipes (fd -> our fd) without blocking on any one of them."""

    def __init__(self, routes: dict[int, int], out: Output, side: Callable[[int, bytes], None]):
        self.routes = routes
        self.out = out
        self.side = side  # (pipe fd, chunk), after the chunk has been written
        self.sel = selectors.DefaultSelector()
        for fd in routes:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)

    @property
    def open(self) -> bool:
        """Some writer still holds a pipe."""
        return bool(self.sel.get_map())

    def step(self, timeout: float) -> None:
        """Wait up to `timeout` for output, then move what is there."""
        for key, _ in self.sel.select(timeout):
            self._drain(key.fd)

    def _drain(self, fd: int) -> None:
        for _ in range(BURST):
            try:
                data = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.sel.unregister(fd)
                return
            self.out.write(self.routes[fd], data)
            self.side(fd, data)
            if len(data) < READ_SIZE // 2:
                return  # the pipe is (nearly) empty: back to select rather than a read for nothing

    def close(self) -> None:
        self.sel.close()


def plain_copy(routes: dict[int, int], out: Output, capture: Callable[[bytes], None]) -> list[threading.Thread]:
    """The fallback after a bug in the pump: one thread per pipe copies it through, and to the
    capture, and nothing else. Returns the threads (the caller waits for the child)."""

    def copy(src: int, dst: int) -> None:
        try:
            os.set_blocking(src, True)
        except OSError:
            pass
        try:
            while True:
                data = os.read(src, READ_SIZE)
                if not data:
                    return
                out.write(dst, data)
                try:
                    capture(data)
                except Exception:
                    pass
        except OSError:
            return

    threads = [threading.Thread(target=copy, args=(s, d), daemon=True) for s, d in routes.items()]
    for t in threads:
        t.start()
    return threads
