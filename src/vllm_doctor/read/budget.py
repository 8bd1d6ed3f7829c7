"""A time limit on reading a log (serve's exit diagnosis inside a pod's grace period, logread.read):
the start and the end of a large file are read, the middle's lines counted, not read."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Budget:
    """Once `jump` (time.monotonic()) has passed and LEAST_HEAD bytes are read, a file jumps to the
    tail it can read by `until` at the pace so far (at least LEAST_TAIL): the start and the end of
    a failure are read, the middle's lines counted, not read, and a warning says so (Source.jump)."""

    jump: float
    until: float
    seconds: float  # the whole limit, as the warning names it
    began: float = field(default_factory=time.monotonic)
    jumped: bool = False  # the middle of a file was not read (said in a warning)

    @classmethod
    def within(cls, seconds: float, reading: float = 0.4, tail: float = 0.3) -> Budget:
        """`reading` of the seconds for the start and middle, `tail` more for the tail."""
        now = time.monotonic()
        return cls(now + seconds * reading, now + seconds * (reading + tail), seconds, now)

    def due(self, read: int) -> bool:
        """Whether to jump, `read` bytes read."""
        return read >= LEAST_HEAD and time.monotonic() >= self.jump

    def tail(self, read: int) -> int:
        """The bytes of tail readable by `until` at the pace of the `read` bytes so far."""
        now = time.monotonic()
        pace = read / max(now - self.began, 1e-3)
        return max(LEAST_TAIL, int(pace * max(self.until - now, 0)))

    def said(self, name: str, first: int, last: int, head: int, skipped: int, tail: int) -> str:
        return (f"{name}: the diagnosis had {self.seconds:g} s (serve --diagnose-timeout): it read the first"
                f" {_mib(head)} and the last {_mib(tail)}; lines {first:,}-{last:,} between them ({_mib(skipped)})"
                " were not read")  # fmt: skip


LEAST_HEAD = 4 << 20  # a start's lines (version, arguments, model, KV cache), however slow the reading
LEAST_TAIL = 8 << 20  # a failure's traceback and the minutes before it, however slow the reading


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"
