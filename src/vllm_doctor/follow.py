"""explain --follow: a stream that stays open (`kubectl logs -f … | vllm-doctor explain - --follow`)
diagnosed as it arrives.

Each chunk goes to a capture file and through the read stage (logread.ChunkLines over the rules'
prefilter); once a chunk brings candidate lines, the capture is diagnosed again (at most once
every INTERVAL seconds, and after INTERVAL of quiet), and each diagnosis not seen before is said
in one line as it appears (a wrapper error waits: its cause may be the next line). At the end of
the stream, or on Ctrl-C, the whole capture is diagnosed once more, with the model's config and the
GPUs as explain uses them, and that is the report.
"""

from __future__ import annotations

import os
import select
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

from vllm_doctor.data import Report, Rule
from vllm_doctor.knowledge.checks import Options

INTERVAL = 1.0  # seconds between diagnoses of the stream so far
CHUNK = 1 << 16


def follow(fd: int, rules: list[Rule], options: Options, say: Callable[[str], None]) -> Report:
    """Read `fd` to its end (or Ctrl-C), saying each new diagnosis; the report of all of it."""
    from vllm_doctor import pipeline
    from vllm_doctor.matching.engine import Engine
    from vllm_doctor.read.logread import ChunkLines

    if options.gpu and options.gpu_snapshot is None:
        from vllm_doctor.capacity.gpu import snapshot

        options = replace(options, gpu_snapshot=snapshot())  # once, not at every look
    interim = replace(options, lookup_model=False, offline=True)  # no Hub request per look
    lines = ChunkLines(Engine(rules).prefilter)
    seen: set[tuple[str, int]] = set()
    with tempfile.NamedTemporaryFile(prefix="vllm-doctor-follow-", suffix=".log") as capture:

        def look(opts: Options, final: bool = False) -> Report:
            capture.flush()
            report = pipeline.explain([capture.name], rules, opts)
            report.paths = ["-"]
            if not final:  # the final report says it all
                _announce(report, seen, say)
            return report

        due, last = False, 0.0
        try:
            while True:
                wait = max(0.0, last + INTERVAL - time.monotonic()) if due else None
                if not select.select([fd], [], [], wait)[0]:
                    last, due = time.monotonic(), False  # quiet after candidate lines: look now
                    look(interim)
                    continue
                chunk = os.read(fd, CHUNK)
                if not chunk:
                    break
                capture.write(chunk)
                due = due or bool(lines.feed(chunk))
                if due and time.monotonic() - last >= INTERVAL:
                    last, due = time.monotonic(), False
                    look(interim)
        except KeyboardInterrupt:
            pass  # Ctrl-C ends the stream: the report of what came
        return look(options, final=True)


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
        say(f"vllm-doctor: {where}{d.severity} {d.category}: {d.summary}{fix}")
