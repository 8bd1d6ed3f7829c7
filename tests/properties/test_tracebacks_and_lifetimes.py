"""Issue 35: whatever a server prints, `explain` gives a report and never exits 3. The inputs here are
the shapes of real logs that a clean recording lacks: Python tracebacks cut at any line, frames
without their source lines, one traceback printed by several workers and interleaved line by line;
every launcher's and collector's prefix in front of the lines (docker compose, docker/CRI
timestamps, kubectl --prefix, syslog, CI gutters, vLLM's process prefixes, Ray, torch ranks) with
its colour in each of the three forms; CRLF and bare CR line ends; and server lifetimes in any
order: lab recordings concatenated, cut short, their pids reused, split over several files.

Properties: no exception escapes and every format renders to strict UTF-8; the same input gives the
same report; a failure appended to a healthy log is found; the status is one of four, and through the
real command the exit status is 0, 1 or 4 with no traceback.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, LAB
from vllm_doctor.knowledge.contract import Options
from vllm_doctor.pipeline import explain, whole_evidence
from vllm_doctor.render import FORMATS, render
from vllm_doctor.render.json import to_dict
from vllm_doctor.render.text import show

STATUSES = ("failed", "degraded", "unknown", "healthy")

# vLLM's own head of a line: "(EngineCore pid=15848) ERROR 11-30 01:54:29 [core.py:1510] "
_VLLM_HEAD = re.compile(
    r"^\((?:[A-Za-z_][\w\-]*(?: [\w\-]+)? )?pid=\d+(?:, ip=[\d.]+)?\) "
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]\s]+\] ?)?"
)
_PROCESS = re.compile(r"^\((?:[A-Za-z_][\w\-]*(?: [\w\-]+)? )?pid=\d+(?:, ip=[\d.]+)?\)")
_PID = re.compile(r"pid=(\d+)")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


LAB_LOGS: dict[str, list[str]] = {p.stem: _lines(p) for p in sorted(LAB.glob("*.log"))}
HEALTHY = ("healthy", "healthy-auto-kv", "cache-fits", "wrapper-sigterm-idle")


def _tracebacks() -> list[list[str]]:
    """Every traceback in the fixtures and lab recordings, its lines as the program wrote them (the
    prefix the first line had taken off every line): the header, frames, source and caret lines,
    the exception line and what a pydantic error indents under it."""
    found: dict[tuple[str, ...], None] = {}
    for path in sorted(FIXTURES.rglob("*.log")):
        lines = _lines(path)
        for i, line in enumerate(lines):
            at = line.find("Traceback (most recent call last):")
            if at < 0:
                continue
            prefix, block, raised = line[:at], [line[at:]], False
            for nxt in lines[i + 1 : i + 200]:
                if not nxt.startswith(prefix):
                    break
                rest = nxt[len(prefix) :]
                if rest.startswith(" "):
                    block.append(rest)
                elif raised or not rest.strip():
                    break
                else:
                    block.append(rest)  # the exception line; indented lines after it are its message
                    raised = True
            if len(block) >= 3:
                found[tuple(block)] = None
    return [list(tb) for tb in found]


TRACEBACKS = _tracebacks()


def _lab_line(name: str, needle: str) -> str:
    """The first line of a lab recording holding `needle`, less vLLM's process and logger head."""
    line = next(x for x in LAB_LOGS[name] if needle in x)
    return _VLLM_HEAD.sub("", line)


# failures a single rule catches on their own lines, as the lab recordings print them; with the
# category each gets alone (held by test_each_blocker_alone_is_its_category)
BLOCKERS: list[tuple[str, list[str]]] = [
    ("port-in-use", [_lab_line("startup-port-in-use", "Address already in use")]),
    ("cache-oom", [_lab_line("cache-oom", "ValueError: To serve at least one request")]),
    ("tp-divisibility", [_lab_line("tp-divisibility-vocab", "AssertionError: 320 is not divisible")]),
    (
        "tp-divisibility",
        [
            _lab_line("tp-divisibility", "ValidationError: 1 validation error"),
            _lab_line("tp-divisibility", "Value error, Total number of attention heads"),
        ],
    ),
    ("cpu-omp-numa-binding", [_lab_line("tp-cpu-numa-binding", "AssertionError: Not enough allowed NUMA nodes")]),
    ("torchvision-torch-mismatch", [_lab_line("install-torchvision-mismatch", "operator torchvision::nms")]),
    ("model-not-found", [_lab_line("startup-missing-model-repo-offline", "LocalEntryNotFoundError: Cannot find")]),
    ("cpu-memory-utilization", [_lab_line("startup-cpu-memory-utilization", "ValueError: Available memory on node")]),
    (
        "invalid-quantization",
        [
            _lab_line("startup-invalid-quantization", "ValidationError: 1 validation error"),
            _lab_line("startup-invalid-quantization", "Value error, Unknown quantization method"),
        ],
    ),
]

# -- prefixes: what launchers and collectors put in front of a line ------------------------------

# a collector's prefix, outermost; {m} {s} {n} are the line's time, so a stamp moves line by line
COLLECTORS = (
    "vllm-1  | ",
    "vllm-cpu-1  | ",
    "2024-05-01T10:{m:02d}:{s:02d}.{n:09d}Z ",  # docker --timestamps
    "2024-05-01T10:{m:02d}:{s:02d}.{n:09d}+00:00 stdout F ",  # a CRI file
    "[pod/vllm-0/vllm] ",  # kubectl logs --prefix
    "[2026-01-01T00:{m:02d}:{s:02d}Z]  | ",  # a CI system's stamp and gutter
    "Nov 30 01:{m:02d}:{s:02d} gpu-node-3 vllm[7611]: ",  # syslog
)
# vLLM's process prefixes of every era and launcher, and torch's rank
PROCESSES = (
    "(APIServer pid={pid})",
    "(EngineCore_DP0 pid={pid})",
    "(EngineCore_0 pid={pid})",
    "(EngineCore pid={pid})",
    "(Worker pid={pid})",
    "(Worker_TP{rank} pid={pid})",
    "(VllmWorker TP{rank} pid={pid})",
    "(VllmWorker-{rank} pid={pid})",
    "(VllmWorkerProcess pid={pid})",
    "(RayWorkerWrapper pid={pid}, ip=1.2.3.4)",
    "RayWorkerWrapper pid={pid}, ip=1.2.3.4)",  # Ray's dedup ate the parenthesis
    "(WorkerDict pid={pid})",
    "(pid={pid})",
    "[rank{rank}]:",
)
# a process prefix's colour: none, real ESC, caret text from a pager, syslog's #033, ESC lost in a paste
COLOURS = (
    "{p} ",
    "\x1b[1;36m{p}\x1b[0;0m ",
    "^[[1;36m{p}^[[0;0m ",
    "#033[1;36m{p}#033[0;0m ",
    "[1;36m{p}[0;0m ",
)
APP_LOGGER = "2024-05-01 10:{m:02d}:{s:02d} - vllm.engine - INFO - "  # a Python app's logger around vLLM's
ENDS = ("\n", "\r\n", "\r")
LOGGER_HEADS = ("", "ERROR 11-30 01:54:29 [core.py:1510] ", "ERROR 11-30 01:50:53 [multiproc_executor.py:953] ")


def _stamp(fmt: str, i: int) -> str:
    return fmt.format(m=(i // 60) % 60, s=i % 60, n=i)


def collectors() -> st.SearchStrategy[tuple[str, ...]]:
    """None, one, or two collectors stacked (docker compose over docker's timestamps, ...)."""
    return st.lists(st.sampled_from(COLLECTORS), max_size=2, unique=True).map(tuple)


@st.composite
def process_prefix(draw, pid: int | None = None) -> str:
    """A process prefix with its logger head, in one of the colour forms; or nothing."""
    if draw(st.integers(0, 5)) == 0:
        return ""
    proc = draw(st.sampled_from(PROCESSES)).format(pid=pid or draw(st.integers(1, 99999)), rank=draw(st.integers(0, 7)))
    return draw(st.sampled_from(COLOURS)).format(p=proc) + draw(st.sampled_from(LOGGER_HEADS))


def _recolour(line: str, colour: str) -> str:
    """The line's own vLLM process prefix in another colour form."""
    return _PROCESS.sub(lambda m: colour.format(p=m.group(0)).rstrip(" "), line, count=1)


@st.composite
def line_ends(draw) -> str | list[str]:
    """One line end for a file, or (sometimes) a different one on every line."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.lists(st.sampled_from(ENDS), min_size=1, max_size=8))
    return draw(st.sampled_from(ENDS))


@st.composite
def dressing(draw) -> dict:
    """How a file is dressed: its collectors, its process prefixes' colour, its line ends, sometimes
    an app logger's head, a terminal's hard wrap, its last line cut mid-write."""
    return {
        "stack": draw(collectors()),
        "colour": draw(st.sampled_from(COLOURS)),
        "ends": draw(line_ends()),
        "app": draw(st.integers(0, 9)) == 0,
        "wrap": draw(st.sampled_from((None, None, None, 80, 120, 200))),
        "cut": draw(st.sampled_from((None, None, None, 1, 2, 17, 60))),
        "glue": draw(st.sampled_from((0, 0, 0, 2, 7))),
    }


def _dress(lines: list[str], stack=(), colour=COLOURS[0], ends="\n", app=False, wrap=None, cut=None, glue=0) -> bytes:
    """A file's bytes: each line's process prefix in the colour form, an app logger's head, the
    collectors' prefixes in front; wrapped at a terminal's width; the line ends, every `glue`th one
    lost (a paste that ran records together); the last line cut `cut` bytes in, with no end (a file
    read while its writer was mid-line)."""
    out = []
    for i, line in enumerate(lines):
        line = _recolour(line, colour) if colour != COLOURS[0] else line
        if app:
            line = _stamp(APP_LOGGER, i) + line
        for fmt in reversed(stack):
            line = _stamp(fmt, i) + line
        end = ends if isinstance(ends, str) else ends[i % len(ends)]
        end = "" if glue and i % glue == glue - 1 else end
        pieces = [line[k : k + wrap] for k in range(0, len(line), wrap)] if wrap and line else [line]
        out.extend(piece + end for piece in pieces)
    data = "".join(out).encode("utf-8")
    if cut is not None and out:  # in bytes: the cut may fall inside a character
        last = len(out[-1].encode("utf-8"))
        data = data[: len(data) - last + min(cut, last - 1)]
    return data


# -- tracebacks ----------------------------------------------------------------------------------


@st.composite
def cut_traceback(draw) -> list[str]:
    """A real traceback cut at any line (its head and its tail may both be lost), sometimes with the
    frames' source lines gone, sometimes with a frame printed twice."""
    tb = draw(st.sampled_from(TRACEBACKS))
    stop = draw(st.integers(1, len(tb)))
    start = draw(st.integers(0, stop - 1)) if draw(st.booleans()) else 0
    lines = tb[start:stop]
    if draw(st.booleans()):
        lines = [x for x in lines if not x.startswith("    ")] or lines[:1]  # frames with no source lines
    if draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(lines) - 1))
        lines[at:at] = lines[at : at + draw(st.integers(1, 4))]  # a frame (and its source) twice
    return lines


@st.composite
def tracebacks(draw) -> list[str]:
    """A cut traceback printed by one to three workers under their own prefixes (the same one, or
    each its own) and interleaved line by line; Ray's dedup suffix on a line."""
    workers = draw(st.integers(1, 3))
    pid = draw(st.integers(1, 99999))
    same = draw(st.booleans())  # the TP workers all fail alike, or each its own way
    lines = draw(cut_traceback())
    queues = []
    for w in range(workers):
        prefix = draw(process_prefix(pid=pid + w))
        queues.append([prefix + line for line in (lines if same or not w else draw(cut_traceback()))])
    picks = draw(st.lists(st.integers(0, workers - 1), max_size=sum(map(len, queues))))
    out = []
    for pick in picks:  # the drawn order first, then what is left of each worker's
        if queues[pick]:
            out.append(queues[pick].pop(0))
    for queue in queues:
        out.extend(queue)
    if draw(st.booleans()):
        at = draw(st.integers(0, len(out) - 1))
        out[at] += f" [repeated {draw(st.integers(2, 30))}x across cluster]"
    return out


@st.composite
def traceback_logs(draw) -> list[bytes]:
    """One or two tracebacks alone, or anywhere in one or two lab recordings (a restart), the whole
    file dressed by a launcher and its collectors."""
    lines = [line for host in draw(st.lists(st.sampled_from(sorted(LAB_LOGS)), max_size=2)) for line in LAB_LOGS[host]]
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.integers(0, len(lines)))
        lines[at:at] = draw(tracebacks())
    return [_dress(lines, **draw(dressing()))]


# -- lifetimes -----------------------------------------------------------------------------------

PIDS = (1, 7, 88, 15836)  # a small pool: a restarted container's process gets its old pid again


@st.composite
def starts(draw) -> list[str]:
    """One lab recording: whole, or cut short (a start with nothing after its first lines), its
    pids renumbered from a small pool so that they repeat across starts."""
    lines = LAB_LOGS[draw(st.sampled_from(sorted(LAB_LOGS)))]
    if draw(st.booleans()):
        lines = lines[: draw(st.integers(1, len(lines)))]
    if draw(st.booleans()):
        pids = sorted({m.group(1) for line in lines for m in _PID.finditer(line)})
        new = {old: str(draw(st.sampled_from(PIDS))) for old in pids}
        lines = [_PID.sub(lambda m: "pid=" + new[m.group(1)], line) for line in lines]
    return lines


@st.composite
def lifetime_logs(draw) -> list[bytes]:
    """One to four starts in any order (the same one again is a restart), cut into one to three
    files at any line (a rotated log, or one file per start), each file dressed its own way; or two
    servers' starts interleaved line by line under their compose services (`docker compose logs`)."""
    runs = draw(st.lists(starts(), min_size=1, max_size=4))
    if len(runs) >= 2 and draw(st.integers(0, 3)) == 0:
        queues = [[f"vllm-{k + 1}  | {line}" for line in run] for k, run in enumerate(runs[:2])]
        picks = draw(st.lists(st.integers(0, 1), max_size=len(queues[0]) + len(queues[1])))
        lines = [queues[pick].pop(0) for pick in picks if queues[pick]] + queues[0] + queues[1]
    else:
        lines = [line for run in runs for line in run]
    cuts = sorted(draw(st.lists(st.integers(0, len(lines)), max_size=2)))
    bounds = [0, *cuts, len(lines)]
    files = [lines[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    colour = draw(st.sampled_from(COLOURS))
    out = [_dress(f, **{**draw(dressing()), "colour": colour}) for f in files]
    for k in range(len(out) - 1):  # rotated by size: a line (a character even) split between two files
        if out[k] and draw(st.booleans()):
            at = draw(st.integers(0, len(out[k]) - 1))
            out[k], out[k + 1] = out[k][:at], out[k][at:] + out[k + 1]
    return out


def any_logs() -> st.SearchStrategy[list[bytes]]:
    return st.one_of(traceback_logs(), lifetime_logs())


# -- running it ----------------------------------------------------------------------------------


class Rulebook(list):
    """The built-in rules, with a short repr: Hypothesis prints a failing example's arguments."""

    def __repr__(self) -> str:
        return f"<{len(self)} built-in rules>"


@pytest.fixture(scope="module")
def book(rules) -> Rulebook:
    return Rulebook(rules)


@contextmanager
def written(files: list[bytes]) -> Iterator[list[str]]:
    """The files on disk (Hypothesis reruns a test body: no function-scoped tmp_path), their paths."""
    with tempfile.TemporaryDirectory(prefix="vllm-doctor-props-") as tmp:
        paths = []
        for i, data in enumerate(files):
            path = Path(tmp) / f"server-{i}.log"
            path.write_bytes(data)
            paths.append(str(path))
        yield paths


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@contextmanager
def _screen(lines: int, columns: int) -> Iterator[None]:
    """A terminal of this size for rich (LINES, COLUMNS), the environment as it was after."""
    saved = {k: os.environ.get(k) for k in ("LINES", "COLUMNS")}
    os.environ.update(LINES=str(lines), COLUMNS=str(columns))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _renders(report) -> None:
    """Every format; the text's -q, and as a short narrow terminal gets it (fitted to its height, in
    colour); markdown's github flavour; every start's diagnoses (--lifetime all); and -v's, with the
    cut evidence lines read again from the files: each a str that strict UTF-8 takes."""
    outs = [render(report, fmt) for fmt in FORMATS]
    outs += [render(report, "text", verbosity=-1), render(report, "markdown", flavor="github")]
    with _screen(12, 60):
        show(report, file=(terminal := _Terminal()))
    outs.append(terminal.getvalue())
    every = replace(report, all_lifetimes=True)
    outs += [render(every, fmt) for fmt in FORMATS]
    whole = whole_evidence(report)  # last: it puts the whole lines in place
    outs += [render(whole, fmt, verbosity=1) for fmt in FORMATS]
    for out in outs:
        assert isinstance(out, str)
        out.encode("utf-8")  # strict: a lone surrogate raises


@given(files=traceback_logs())
def test_tracebacks_never_escape_and_every_format_renders(book, files):
    with written(files) as paths:
        report = explain(paths, book, Options())
        _renders(report)
    assert report.status in STATUSES


@given(files=lifetime_logs(), again=st.booleans(), lead=st.integers(0, 4))
def test_lifetimes_never_escape_and_every_format_renders(book, files, again, lead):
    """`again`: the first file named twice; `lead`: --lifetime N (0: the latest)."""
    with written(files) as paths:
        report = explain(paths + paths[:1] if again else paths, book, Options(lifetime=lead or None))
        _renders(report)
    assert report.status in STATUSES
    assert all(life.report.status in STATUSES for life in report.lifetimes)


@given(files=any_logs())
def test_same_input_same_report(book, files):
    with written(files) as paths:
        first = to_dict(explain(paths, book, Options()))
        second = to_dict(explain(paths, book, Options()))
    assert first == second


@st.composite
def healthy_then_failed(draw) -> tuple[str, list[bytes]]:
    """A healthy lab recording, then a failure's lines (a worker's, the engine's own, or bare as the
    traceback's tail prints them), the file dressed by a launcher and its collectors; or the failure
    in a second file (the log rotated just before it)."""
    lines = LAB_LOGS[draw(st.sampled_from(HEALTHY))]
    category, blocker = draw(st.sampled_from(BLOCKERS))
    engine = next((m.group(1) for x in lines if (m := re.match(r"\(EngineCore\w* pid=(\d+)\)", x))), "1")
    head = draw(
        st.sampled_from(
            [
                "",
                f"(EngineCore pid={engine}) ERROR 11-30 01:54:29 [core.py:1510] ",
                "(Worker_TP0 pid=99) ERROR 11-30 01:50:53 [multiproc_executor.py:953] ",
                "(RayWorkerWrapper pid=99, ip=1.2.3.4) ERROR 11-30 01:50:53 [worker_base.py:620] ",
                "[rank0]: ",
            ]
        )
    )
    stack, colour, end = draw(collectors()), draw(st.sampled_from(COLOURS)), draw(st.sampled_from(ENDS))
    failure = [head + x for x in blocker]
    if draw(st.integers(0, 3)) == 0:
        return category, [_dress(lines, stack, colour, end), _dress(failure, stack, colour, end)]
    return category, [_dress([*lines, *failure], stack, colour, end)]


@given(case=healthy_then_failed())
def test_failure_appended_to_healthy_log_is_found(book, case):
    category, files = case
    with written(files) as paths:
        report = explain(paths, book, Options())
    assert report.status == "failed"
    assert category in [d.category for d in report.diagnoses]


@given(files=any_logs())
def test_status_is_one_of_four(book, files):
    with written(files) as paths:
        report = explain(paths, book, Options())
    assert report.status in STATUSES
    assert report.shown is None or 1 <= report.shown <= len(report.lifetimes)


@settings(max_examples=5)
@given(files=any_logs())
def test_command_exits_0_1_or_4_without_a_traceback(files):
    with written(files) as paths:
        proc = subprocess.run(
            [sys.executable, "-m", "vllm_doctor", "explain", *paths, "--format", "json", "--no-gpu", "--offline"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode in (0, 1, 4), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["status"] in STATUSES


# -- plain examples ------------------------------------------------------------------------------


def test_the_fixtures_hold_tracebacks_and_blockers():
    """The strategies draw from real material: tracebacks of several shapes, every blocker's lines."""
    assert len(TRACEBACKS) >= 20
    assert all(tb[0].startswith("Traceback") for tb in TRACEBACKS)
    assert all(lines and all(lines) for _, lines in BLOCKERS)


@pytest.mark.parametrize(("category", "lines"), BLOCKERS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(BLOCKERS)])
def test_each_blocker_alone_is_its_category(book, category, lines):
    with written(["".join(x + "\n" for x in lines).encode()]) as paths:
        report = explain(paths, book, Options())
    assert report.status == "failed"
    assert category in [d.category for d in report.diagnoses]
