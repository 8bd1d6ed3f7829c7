"""explain --follow: a stream that stays open (`kubectl logs -f … | vllm-doctor explain - --follow`),
or a log file a server is still writing (`vllm-doctor explain --follow server.log`), diagnosed as
it arrives.

Each chunk goes to a capture file and through the read stage (logread.ChunkLines over the rules'
prefilter); once a chunk brings candidate lines, the capture is diagnosed again (at most once every
INTERVAL seconds or BACKOFF times the last look, and after that long of quiet), and each diagnosis
not seen before is said in one line as it appears (a wrapper error waits: its cause may be the next
line). At the end of the stream, or on Ctrl-C, the whole capture is diagnosed once more, with the
model's config and the GPUs as explain uses them, and that is the report. A regular file named on
the command line has no end, as `tail -f` reads it: at its end the follow looks again every POLL
seconds (from the start when the file was truncated, as a copytruncate rotation does) until Ctrl-C
or SIGTERM (which end a pipe's follow the same way), and the report holds all the file holds by
then.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from vllm_doctor.data import Report, Rule
from vllm_doctor.knowledge.checks import Options
from vllm_doctor.render.redact import redact

INTERVAL = 1.0  # seconds between diagnoses of the stream so far, at the least
# each look diagnoses the whole capture, so a long stream's looks grow: the next waits BACKOFF
# times as long as the last took, which keeps the looks under a fifth of the time however long it runs
BACKOFF = 4.0
CHUNK = 1 << 16
POLL = 0.25  # seconds between looks at a followed file's end for appended data
GZIP = b"\x1f\x8b"  # a compressed log is read to its end: nothing is appended to one


def follow(fd: int, rules: list[Rule], options: Options, say: Callable[[str], None], name: str = "-") -> Report:
    """Read `fd` to its end (or Ctrl-C, SIGTERM), saying each new diagnosis; the report of all of it.
    A regular file named on the command line (not "-") is followed past its end, as `tail -f` does."""
    from vllm_doctor import pipeline
    from vllm_doctor.matching.engine import Engine
    from vllm_doctor.read.logread import ChunkLines

    if options.gpu and options.gpu_snapshot is None:
        from vllm_doctor.capacity.gpu import snapshot

        options = replace(options, gpu_snapshot=snapshot())  # once, not at every look
    interim = replace(options, lookup_model=False, offline=True)  # no Hub request per look
    lines = ChunkLines(Engine(rules).prefilter)
    seen: set[tuple[str, int]] = set()
    tail = name != "-" and stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 2, 0) != GZIP
    with tempfile.NamedTemporaryFile(prefix="vllm-doctor-follow-", suffix=".log") as capture:
        gap = INTERVAL

        def look(opts: Options, final: bool = False) -> Report:
            nonlocal gap
            capture.flush()
            started = time.monotonic()
            report = pipeline.explain([capture.name], rules, opts)
            gap = max(INTERVAL, (time.monotonic() - started) * BACKOFF)
            report.paths = [name]
            if not final:  # the final report says it all
                _announce(report, seen, say)
            return report

        due, last = False, 0.0
        try:
            with _sigterm_interrupts():
                while True:
                    wait = max(0.0, last + gap - time.monotonic()) if due else None
                    chunk = _next(fd, wait, tail)
                    if chunk is None:
                        last, due = time.monotonic(), False  # quiet after candidate lines: look now
                        look(interim)
                        continue
                    if not chunk:
                        break
                    capture.write(chunk)
                    due = due or bool(lines.feed(chunk))
                    if due and time.monotonic() - last >= gap:
                        last, due = time.monotonic(), False
                        look(interim)
        except KeyboardInterrupt:
            pass  # Ctrl-C (or SIGTERM) ends the stream: the report of what came
        while tail and (chunk := os.read(fd, CHUNK)):  # what the file holds by now, read yet or not
            capture.write(chunk)
        return look(options, final=True)


def _next(fd: int, wait: float | None, tail: bool) -> bytes | None:
    """The next chunk; b"" at the stream's end; None when `wait` seconds pass without one. A
    followed file has no end: at its end, look again every POLL seconds."""
    if not tail:
        return os.read(fd, CHUNK) if select.select([fd], [], [], wait)[0] else None
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        chunk = os.read(fd, CHUNK)
        if chunk:
            return chunk
        if os.fstat(fd).st_size < os.lseek(fd, 0, os.SEEK_CUR):  # truncated: from its start, as tail -f
            os.lseek(fd, 0, os.SEEK_SET)
            continue
        left = POLL if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(POLL, left))


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the follow as Ctrl-C does (the report of what came), then is as it was."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        before = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _announce(report: Report, seen: set[tuple[str, int]], say: Callable[[str], None]) -> None:
    """One line per diagnosis above info not said before (by rule and first line). A wrapper
    error or an unrecognised failure waits for the final report: its cause may come next."""
    for d in report.diagnoses:
        key = (d.rule, d.evidence[0].line if d.evidence else 0)
        if d.severity == "info" or d.wrapper or d.fallback or key in seen:
            continue
        seen.add(key)
        where = f"line {key[1]}: " if key[1] else ""
        fix = f" Fix: {d.fixes[0].action}" if d.fixes else ""
        say(redact(f"vllm-doctor: {where}{d.severity} {d.category}: {d.summary}{fix}"))  # as the report masks it
