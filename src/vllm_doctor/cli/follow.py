"""explain --follow: a stream that stays open (`kubectl logs -f … | vllm-doctor explain - --follow`),
or a log file a server is still writing (`vllm-doctor explain --follow server.log`), diagnosed as
it arrives.

Each chunk goes to a bounded spool (read/spool.py: the stream's head and a rolling tail) and past
the rules' prefilter, which only says whether it holds a candidate line (no line is decoded
here: the reading keeps up with the bytes); once a chunk brings one, the spool is diagnosed
again (at most once every INTERVAL seconds or BACKOFF times the last look, and after that long
of quiet), and each diagnosis not seen before is said in one line as it appears (a wrapper
error waits: its cause may be the next line). At the end of the stream, or on Ctrl-C or SIGTERM,
the spool is diagnosed once more, with the model's config and the GPUs as explain uses them, and
that is the report. A regular file named on the command line has no end, as `tail -F` reads it
(read/tailf.py: a rotation, a truncation and a symlink pointed elsewhere are followed, each said
on stderr and in the report's notes): at its end the follow looks again every POLL seconds until
Ctrl-C or SIGTERM, and the report holds what was read by then (and what the file holds past it,
up to a tail's worth).
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

from vllm_doctor.data import Diagnosis, Report, Rule
from vllm_doctor.knowledge.checks import Options

INTERVAL = 1.0  # seconds between diagnoses of the stream so far, at the least
# each look diagnoses the whole spool, so a look can take a while: the next waits BACKOFF
# times as long as the last took, which keeps the looks under a fifth of the time however long it runs
BACKOFF = 4.0
CHUNK = 1 << 20
POLL = 0.25  # seconds between looks at a followed file's end for appended data
FINAL = 1.5  # seconds the final look may take, at the pace of the looks before it: its tail is cut to fit
LEAST_TAIL = 512 << 10  # bytes of tail the final look diagnoses however slow (a failure's traceback and more)
GZIP = b"\x1f\x8b"  # a compressed log is read to its end: nothing is appended to one


def follow(fd: int, rules: list[Rule], options: Options, say: Callable[[str], None], name: str = "-") -> Report:
    """Read `fd` to its end (or Ctrl-C, SIGTERM), saying each new diagnosis; the report of all of it.
    A regular file named on the command line (not "-") is followed past its end, as `tail -F` does."""
    from vllm_doctor import pipeline
    from vllm_doctor.matching.engine import Engine
    from vllm_doctor.read.spool import Spool
    from vllm_doctor.read.tailf import Followed

    if options.gpu and options.gpu_snapshot is None:
        from vllm_doctor.capacity.gpu import snapshot

        options = replace(options, gpu_snapshot=snapshot())  # once, not at every look
    interim = replace(options, lookup_model=False, offline=True)  # no Hub request per look
    hits = _Hits(Engine(rules).prefilter)
    notes: list[str] = []

    def note(text: str) -> None:  # an event of the followed file: on stderr now, in the report's notes
        notes.append(text)
        print(f"vllm-doctor: {text}", file=sys.stderr, flush=True)

    tail = name != "-" and stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 2, 0) != GZIP
    source = Followed(fd, name, note) if tail else None
    with Spool() as spool, _Looks(spool, lambda path: pipeline.explain([path], rules, interim), say) as looks:
        due = interrupted = False
        try:
            with _stop_on_signals() as stop:
                while True:
                    chunk = _next(fd, source, looks.wait(due), stop)
                    looks.collect()
                    if chunk is None:  # quiet after candidate lines (or a look to collect): look now
                        due = due and not looks.start()
                        continue
                    if not chunk:
                        break
                    spool.write(chunk)
                    due = hits.any(chunk) or due
                    if due and looks.wait(due) == 0:
                        due = not looks.start()
        except KeyboardInterrupt:
            interrupted = True  # Ctrl-C (or SIGTERM) ends the stream: the report of what came, at once
        looks.stop()
        if source is not None:
            _drain(source, spool)
            source.close()
        spool.trim(looks.tail_within(FINAL, spool.head, spool.tail))  # the report comes at once
        report = pipeline.explain([spool.name], rules, options)
        if not interrupted:  # the stream's end: what came after the last look is said as it was before
            _announce(report.diagnoses, looks.seen, say)
    report.paths = [name]
    report.warnings.extend(notes + spool.notes())
    return report


class _Looks:
    """The looks at the spool while it is read: each diagnoses a copy of it in a child process
    (where there is fork), so the reading goes on meanwhile, and what it found is said when it
    ends. The next starts INTERVAL seconds or BACKOFF times the last look's time after it."""

    def __init__(self, spool, explain: Callable[[str], Report], say: Callable[[str], None]):
        self.spool, self.explain, self.say = spool, explain, say
        self.copy = tempfile.NamedTemporaryFile(prefix="vllm-doctor-look-", suffix=".log")
        self.seen: set[tuple[str, int]] = set()
        self.gap, self.last = INTERVAL, 0.0
        self.child: tuple[int, int] | None = None  # pid, the read end of its pipe
        self.size, self.pace = 0, 0.0  # the last look's bytes; seconds per byte of a look of megabytes

    def __enter__(self) -> _Looks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.copy.close()

    def wait(self, due: bool) -> float | None:
        """How long the reading may wait for bytes: until the next look is due, or POLL while a
        look runs (to say what it found)."""
        if self.child is not None:
            return POLL
        return max(0.0, self.last + self.gap - time.monotonic()) if due else None

    def start(self) -> bool:
        """Start a look, unless one runs."""
        if self.child is not None:
            return False
        self.last = time.monotonic()
        shutil.copyfile(self.spool.name, self.copy.name)
        self.size = os.path.getsize(self.copy.name)
        if not hasattr(os, "fork"):
            _announce(self.explain(self.copy.name).diagnoses, self.seen, self.say)
            self._done()
            return True
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: the look, its diagnoses down the pipe, and gone
            status = 1
            try:
                os.close(r)
                quiet = os.open(os.devnull, os.O_WRONLY)  # says nothing, and holds no pipe of ours open
                os.dup2(quiet, 1)
                os.dup2(quiet, 2)
                with os.fdopen(w, "wb") as out:
                    out.write(pickle.dumps(self.explain(self.copy.name).diagnoses))
                status = 0
            finally:
                os._exit(status)
        os.close(w)
        self.child = (pid, r)
        return True

    def collect(self) -> None:
        """Say what a finished look found."""
        if self.child is None or not select.select([self.child[1]], [], [], 0)[0]:
            return
        pid, r = self.child
        with os.fdopen(r, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        self.child = None
        if data:  # nothing when the look failed: the final report says what it says
            _announce(pickle.loads(data), self.seen, self.say)
        self._done()

    def stop(self) -> None:
        if self.child is not None:
            pid, r = self.child
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            self.child = None

    def _done(self) -> None:
        took = time.monotonic() - self.last
        self.gap = max(INTERVAL, took * BACKOFF)
        if self.size >= 2 << 20:  # a smaller look's time is mostly what any look costs
            self.pace = took / self.size

    def tail_within(self, seconds: float, head: int, most: int) -> int:
        """How much tail a look diagnoses in `seconds` at the pace of the looks so far (`most`
        before a look of megabytes): lines that cost the engine more get a shorter tail."""
        if not self.pace:
            return most
        return int(min(most, max(LEAST_TAIL, seconds / self.pace - head)))


def _next(fd: int, source, wait: float | None, stop: list[bool]) -> bytes | None:
    """The next chunk; b"" at the stream's end; None when `wait` seconds pass without one. A
    followed file has no end: at its end, look again every POLL seconds. Ctrl-C or SIGTERM
    (`stop`) is raised here, between two chunks, never inside a read: no chunk is lost to it."""
    deadline = None if wait is None else time.monotonic() + wait
    while not stop[0]:
        if source is not None and (chunk := source.read(CHUNK)):
            return chunk
        left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
        if left <= 0:
            return None
        if source is None:
            if select.select([fd], [], [], left)[0]:
                return os.read(fd, CHUNK)
        else:
            time.sleep(left)
    raise KeyboardInterrupt


def _drain(source, spool) -> None:
    """What the file holds by now, read yet or not, up to a tail's worth: a file that keeps
    growing ends nothing (the report comes at once)."""
    budget = spool.tail
    while budget > 0 and (chunk := source.read(min(CHUNK, budget))):
        spool.write(chunk)
        budget -= len(chunk)


class _Hits:
    """Whether a chunk holds a candidate line, at the prefilter's speed: its anchors found in
    the raw bytes (and across the cut from the chunk before), no line decoded."""

    def __init__(self, prefilter):
        self.pf = prefilter
        self.bulk = [prefilter.anchors[i].encode() for i in prefilter.bulk_ids]
        self.overlap = max(prefilter.lengths, default=1)
        self.carry = b""

    def any(self, chunk: bytes) -> bool:
        data = self.carry + chunk
        self.carry = data[-self.overlap :]
        return bool(self.pf.scan_general(data)) or any(a in data for a in self.bulk)


@contextmanager
def _stop_on_signals() -> Iterator[list[bool]]:
    """Ctrl-C and SIGTERM end the follow (the report of what came): their handler only says so,
    and _next stops between two chunks; then the handlers are as they were."""
    stop = [False]

    def interrupt(signum: int, frame: object) -> None:
        stop[0] = True

    try:
        before = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield stop
        return
    try:
        yield stop
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _announce(diagnoses: list[Diagnosis], seen: set[tuple[str, int]], say: Callable[[str], None]) -> None:
    """One line per diagnosis above info not said before (by rule and first line). A wrapper
    error or an unrecognised failure waits for the final report: its cause may come next."""
    for d in diagnoses:
        key = (d.rule, d.evidence[0].line if d.evidence else 0)
        if d.severity == "info" or d.wrapper or d.fallback or key in seen:
            continue
        seen.add(key)
        where = f"line {key[1]}: " if key[1] else ""
        fix = f" Fix: {d.fixes[0].action}" if d.fixes else ""
        say(f"vllm-doctor: {where}{d.severity} {d.category}: {d.summary}{fix}")
