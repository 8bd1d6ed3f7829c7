"""Signals to the wrapper go to vLLM's process group: forwarded at once by the handler, then
accounted for in the loop (the note, the grace deadline, SIGKILL after it or a third interrupt).
The child's descendants that left the group (setsid()) are sent each of them too."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from vllm_doctor.serve.options import TAG, Outcome, signal_name
from vllm_doctor.serve.process import signal_group, signal_left

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Forwarder:
    def __init__(self, outcome: Outcome, note: Callable[[str], None], grace: float):
        self.outcome = outcome
        self.note = note
        self.grace = grace
        self.pid: int | None = None  # the child's, once it runs (it leads its process group)
        self.deadline: float | None = None  # SIGKILL at this time.monotonic()
        self._pending: list[int] = []  # caught before the child existed
        self._sent: list[int] = []  # forwarded by the handler, not yet accounted for
        self._interrupts = 0
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in FORWARDED:
            try:
                self._old[s] = signal.signal(s, self._on_signal)
            except (ValueError, OSError):
                pass

    def restore(self) -> None:
        for s, h in self._old.items():
            try:
                signal.signal(s, h)
            except (ValueError, OSError, TypeError):
                pass

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """Forward at once; everything else (notes, the grace deadline) happens in the loop,
        since a handler may run while the loop holds a lock."""
        if self.pid is None:
            self._pending.append(signum)
            return
        signal_left(self.pid, signum)  # first, while the child (not yet told) still links to them
        signal_group(self.pid, signum)
        self._sent.append(signum)

    def account(self, exited: Callable[[], bool]) -> None:
        """In the loop: forward what came before the child existed, note what was forwarded,
        start the grace period on the first signal, kill on the third interrupt."""
        if self.pid is None:
            return
        while self._pending:  # came while the child was starting
            signum = self._pending.pop(0)
            signal_left(self.pid, signum)
            signal_group(self.pid, signum)
            self._sent.append(signum)
        while self._sent:
            signum = self._sent.pop(0)
            name = signal_name(signum)
            self.outcome.signals_forwarded.append(name)
            self._interrupts += 1
            if exited():
                continue
            if self.deadline is None and not self.outcome.escalated:
                self.deadline = time.monotonic() + self.grace
                self.note(
                    f"{TAG} forwarded {name} to vLLM (process group {self.pid}); "
                    f"SIGKILL in {self.grace:g} s if it has not exited by then"
                )
            elif self._interrupts >= 3:
                self.kill(f"a third interrupt ({name})")

    def kill(self, why: str) -> None:
        """SIGKILL to the group, said once (only while the child has not been waited for)."""
        if self.pid is None or self.outcome.escalated:
            return
        self.outcome.escalated = True
        hang = " while it was waiting for connections to close" if self.outcome.hung else ""
        self.note(f"{TAG} vLLM did not exit{hang}; sent SIGKILL to its process group after {why}")
        signal_left(self.pid, signal.SIGKILL)  # first, while the child still links to them
        signal_group(self.pid, signal.SIGKILL)
