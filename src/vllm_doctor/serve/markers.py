"""The few lines the wrapper itself must notice in vLLM's output, found in the raw chunks as
they pass (bytes.find, no line splitting), with a carried tail for a marker split between two
chunks: the server is up (READY), the engine died (FATAL, kept for when the diagnosis fails),
the stop hangs (HANG)."""

from __future__ import annotations

from typing import Any

from vllm_doctor.read import bulk
from vllm_doctor.serve.options import Outcome

# the engine is up and the HTTP server starts: uvicorn's lines (at its INFO level), vLLM's own
# "Available routes are:" (its logger; also with --uvicorn-log-level warning)
READY_MARKERS = (b"Application startup complete", b"Uvicorn running on", b"Available routes are")
# fallback when the diagnosis itself fails: lines that mean the engine died
FATAL_MARKERS = (b"EngineDeadError", b"EngineCore encountered an issue", b"Engine core initialization failed")
HANG_MARKER = b"Waiting for connections to close"
FATAL_LINES = 5  # fatal lines kept
FATAL_CHARS = 400  # characters kept of each
HEAD = 4 * FATAL_CHARS  # bytes kept of a line's start: enough for FATAL_CHARS characters
KEEP = max(len(m) for m in (*READY_MARKERS, *FATAL_MARKERS, HANG_MARKER)) - 1


class Markers:
    """Scans one stream's chunks (stdout and stderr get one each) and records what it finds in
    the Outcome: ready, hung, fatal_lines. Holds at most HEAD + KEEP bytes between chunks."""

    def __init__(self, outcome: Outcome):
        self.outcome = outcome
        self._tail = b""  # the last KEEP bytes of the current line
        self._head = b""  # the first HEAD bytes of the current line
        self._open: bytes | None = None  # a fatal line whose newline has not come yet

    def feed(self, data: bytes) -> None:
        o = self.outcome
        n = len(self._tail)
        edge = self._tail + data[:KEEP] if n else b""
        if self._open is None and not _any(data) and not (n and _any(edge)):
            self._advance(data)  # no marker here (most chunks): one scan, not a search per marker
            return
        start = self._close_open(data) if self._open is not None else 0
        if not o.ready and any(_found(m, data, edge, n) for m in READY_MARKERS):
            o.ready = True
        if not o.hung and _found(HANG_MARKER, data, edge, n):
            o.hung = True
        if self._open is None and len(o.fatal_lines) < FATAL_LINES:
            for m in FATAL_MARKERS:
                at = data.find(m, start)
                if at < 0:
                    crossing = _straddles(m, edge, n) if start == 0 else -1
                    if crossing < 0:
                        continue
                    at = crossing - n
                self._fatal_at(data, at)
                if self._open is not None:
                    break  # the rest of that line comes in the next chunk
        self._advance(data)

    def finish(self) -> None:
        """The end of the stream: a fatal line still open is kept as it is."""
        if self._open is not None:
            self._keep(self._open)
            self._open = None

    def _fatal_at(self, data: bytes, at: int) -> None:
        """The line holding a marker at `at` (negative: the marker began in the last chunk)."""
        s = data.rfind(b"\n", 0, max(at, 0)) + 1
        prefix = self._head if s == 0 else b""
        e = data.find(b"\n", max(at, 0))
        if e >= 0:
            self._keep(prefix + data[s : min(e, s + HEAD)])
            return
        line = (prefix + data[s : s + HEAD])[:HEAD]
        if len(line) >= HEAD:
            self._keep(line)
        else:
            self._open = line

    def _close_open(self, data: bytes) -> int:
        """Complete the open fatal line; returns where the rest of the chunk starts."""
        assert self._open is not None
        e = data.find(b"\n")
        line = self._open + data[: HEAD - len(self._open) if e < 0 else min(e, HEAD - len(self._open))]
        if e < 0 and len(line) < HEAD:
            self._open = line
            return len(data)
        self._keep(line)
        self._open = None
        return e + 1 if e >= 0 else len(data)

    def _keep(self, line: bytes) -> None:
        self.outcome.fatal_lines.append(line[:HEAD].decode("utf-8", "replace")[:FATAL_CHARS])

    def _advance(self, data: bytes) -> None:
        nl = data.rfind(b"\n")
        if nl >= 0:
            self._head = data[nl + 1 : nl + 1 + HEAD]
            self._tail = data[max(nl + 1, len(data) - KEEP) :]
            return
        if len(self._head) < HEAD:
            self._head += data[: HEAD - len(self._head)]
        self._tail = (self._tail + data[-KEEP:])[-KEEP:]


_ALL = (*READY_MARKERS, *FATAL_MARKERS, HANG_MARKER)
_SCAN: Any = None


def _any(data: bytes) -> bool:
    """Whether data holds one of the markers: one multi-literal scan where hyperscan is there."""
    global _SCAN
    if _SCAN is None:
        _SCAN = bulk.finder(_ALL)
    return bulk.holds(_SCAN, _ALL, data)


def _straddles(marker: bytes, edge: bytes, n: int) -> int:
    """Where `marker` begins in edge (the last chunk's tail, n bytes, then the new chunk's
    head) when it crosses the boundary between them; -1 when it does not."""
    at = edge.find(marker, max(0, n - len(marker) + 1))
    return at if 0 <= at < n else -1


def _found(marker: bytes, data: bytes, edge: bytes, n: int) -> bool:
    return marker in data or (n > 0 and _straddles(marker, edge, n) >= 0)
