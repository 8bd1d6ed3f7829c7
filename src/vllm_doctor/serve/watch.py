"""The live watch: stats lines -> one warning when the KV cache stays full with requests waiting.

It reads the capture's pieces (whole lines of both streams) in a thread of its own, through the
read stage (the rules' prefilter over each batch of chunks, logread's line split and long-line
window: only candidate lines become Python objects), so it never slows the pass-through.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable

from vllm_doctor.data import Rule
from vllm_doctor.read.source import without_holes
from vllm_doctor.serve.options import TAG

QUEUED = 4 << 20  # bytes waiting for the watch at most; past this, chunks are dropped
BATCH = 4 << 20  # bytes the watch reads at once at most


class ChunkQueue:
    """Pieces from the pump to the watch. `put` never blocks: when the watch has fallen behind
    (QUEUED bytes waiting), the chunk is dropped and counted, and the watch is told of the gap
    (it drops the line it was in), so a slow or stuck watch never slows the server's output."""

    def __init__(self, limit: int = QUEUED):
        self.limit = limit
        self.dropped = 0
        self._items: deque[tuple[bool, list]] = deque()
        self._bytes = 0
        self._gap = False
        self._closed = False
        self._cv = threading.Condition()

    def put(self, pieces: list) -> None:
        size = sum(len(p) for p in pieces)
        with self._cv:
            if self._closed:
                return
            if self._bytes + size > self.limit:
                self.dropped += 1
                self._gap = True
                return
            self._items.append((self._gap, pieces))
            self._gap = False
            self._bytes += size
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def get(self, limit: int = BATCH) -> list[tuple[bool, list]] | None:
        """What is waiting (at least one item, up to `limit` bytes); None once closed and empty."""
        with self._cv:
            while not self._items:
                if self._closed:
                    return None
                self._cv.wait()
            out: list[tuple[bool, list]] = []
            size = 0
            while self._items and (not out or size < limit):
                item = self._items.popleft()
                out.append(item)
                size += sum(len(p) for p in item[1])
            self._bytes -= size
            return out


class Watcher(threading.Thread):
    def __init__(self, samples: int, rules: list[Rule] | None, notify: Callable[[str], None]):
        super().__init__(name="vllm-doctor-watch", daemon=True)
        self.samples = max(1, samples)
        self.rules = rules  # None: the built-in rules, loaded in this thread (the child is not kept waiting)
        self.notify = notify  # called with one message (no newline) to print at a line boundary
        self.q = ChunkQueue()
        self.warned = False
        self.failed: str | None = None

    @property
    def dropped(self) -> int:
        return self.q.dropped

    def feed(self, pieces: list) -> None:
        if self.failed is None and not self.warned and pieces:
            # NUL holes dropped before they are queued: a hole of megabytes is no reason to drop lines
            self.q.put([without_holes(p) for p in pieces])

    def stop(self) -> None:
        self.q.close()

    def run(self) -> None:
        try:
            # the lowest CPU priority for this thread (Linux schedules threads on their own):
            # on a busy machine the pump and vLLM go first, the watch takes what is left
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        try:
            self._run()
        except Exception as e:  # a bug here must not touch the server
            self.failed = f"{type(e).__name__}: {e}"
            self.notify(
                f"{TAG} note: the live watch stopped after an internal error ({self.failed}); vLLM is not affected"
            )
            self.q.close()

    def _run(self) -> None:
        from vllm_doctor.facts import Facts
        from vllm_doctor.knowledge.rulebook import LOG_KINDS, builtin
        from vllm_doctor.matching.engine import Engine
        from vllm_doctor.read.logread import ChunkLines

        rules = builtin(LOG_KINDS) if self.rules is None else self.rules
        # the watch warns of a saturated queue only, which no access line feeds (their statuses
        # are request-errors', told at the exit): without their rule, half a serving log's lines
        # are no hit to read one by one, and the watch keeps up with the output
        rules = [r for r in rules if r.series != "access"]
        engine = Engine(rules)
        reader = ChunkLines(engine.prefilter)
        facts = Facts()
        while not self.warned:
            batch = self.q.get()
            if batch is None:
                return
            data = bytearray()
            for gap, pieces in batch:
                if gap:  # the bytes before were dropped: read what came before, then skip
                    lines = reader.feed(data)
                    data.clear()
                    reader.gap()
                    self._check(rules, engine, lines, facts)
                for p in pieces:
                    data += p
            self._check(rules, engine, reader.feed(data), facts)

    def _check(self, rules, engine, lines, facts) -> None:
        """Match the candidate lines; warn once when the cache has stayed full long enough."""
        from vllm_doctor.knowledge.checks import Options
        from vllm_doctor.knowledge.diagnose import diagnose

        if not lines or self.warned:
            return
        before = facts.stats.samples
        engine.run(lines, facts)
        if facts.stats.samples == before or facts.stats.full_run < self.samples:
            return
        for d in diagnose(rules, {}, facts, Options()):
            if d.category == "queue-saturation":
                self.warned = True
                fix = f" First fix: {d.fixes[0].action}." if d.fixes else ""
                self.notify(f"{TAG} warning: {d.title} ({d.category}). {d.summary}{fix}")
                break
