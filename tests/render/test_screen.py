"""The first screen is the answer: `vllm-doctor explain` in a real terminal (tmux). At 80x24 the
report fits the screen with the typed command above and the prompt below (render/text.py's DROPS
give up parts until it does), so once the command returns the visible pane still holds the
verdict and the first fix; at 200x50 nothing is given up, pictures included. Lines wrap between
words and never past the width.

tmux is a test dependency (scripts/ci-deps.sh installs it in CI): missing, these tests fail
under CI=true and are skipped elsewhere.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, LAB, ROOT
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.render.text import SHORTENED

TMUX = shutil.which("tmux")
BARS = set("█░▁▂▃▄▅▆▇")  # the terminal's memory bar and sparklines
CASES = [
    # (log, verdict line, first fix, pictures drawn on a wide terminal)
    (LAB / "cache-oom.log", "vllm-doctor: failed: cache-oom (blocker)", "1. Lower --max-model-len to 8064", True),
    (
        LAB / "queue-saturation.log",
        "vllm-doctor: degraded: queue-saturation (warning)",
        "1. Give the cache more memory: raise VLLM_CPU_KVCACHE_SPACE",
        True,
    ),
    (  # three diagnoses, two blockers and a warning: 44 rows at 80 columns in full
        FIXTURES / "logs/engine-dead/0.5.0_v0-background-loop-errored.log",
        "vllm-doctor: failed: engine-dead (blocker)",
        "1. Read the first traceback above this line",
        False,
    ),
]
DONE = "__vllm_doctor_done__"


@pytest.fixture
def tmux(tmp_path):
    """A tmux server of this test's own (its own socket), killed afterwards."""
    if TMUX is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is missing under CI: scripts/ci-deps.sh installs it")
        pytest.skip("tmux is not installed")
    socket = f"vd-screen-{os.getpid()}-{tmp_path.name}"
    yield socket
    subprocess.run([TMUX, "-L", socket, "kill-server"], capture_output=True, check=False)


def _command(log: Path, *args: str) -> str:
    env = f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(str(ROOT / 'src'))} TERM=xterm-256color"
    path = log.relative_to(ROOT)  # as a user types it, from the checkout
    run = f"{shlex.quote(sys.executable)} -m vllm_doctor explain {shlex.quote(str(path))} --no-gpu"
    return f"cd {shlex.quote(str(ROOT))} && {env} {run} {' '.join(args)}; echo {DONE}; sleep 600"


def capture(socket: str, log: Path, width: int, height: int) -> tuple[list[str], list[str], list[str]]:
    """(the visible pane, the whole output as the terminal shows it, the same with wrapped rows joined)."""
    assert TMUX is not None
    subprocess.run(
        [TMUX, "-L", socket, "new-session", "-d", "-x", str(width), "-y", str(height), _command(log)], check=True
    )
    subprocess.run([TMUX, "-L", socket, "set-option", "-g", "history-limit", "5000"], check=True)
    history: list[str] = []
    for _ in range(300):
        history = _pane(socket, "-S", "-")
        if any(DONE in row for row in history):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"explain did not finish in tmux: {history}")
    visible = _pane(socket)
    joined = _pane(socket, "-J", "-S", "-")
    end = next(i for i, row in enumerate(history) if DONE in row)
    return visible, history[:end], joined[: next(i for i, row in enumerate(joined) if DONE in row)]


def _pane(socket: str, *args: str) -> list[str]:
    assert TMUX is not None
    out = subprocess.run([TMUX, "-L", socket, "capture-pane", "-p", *args], capture_output=True, text=True, check=True)
    return out.stdout.split("\n")


def _words(text: str) -> set[str]:
    return set(text.split())


def _piped(log: Path, *args: str, columns: int = 100000) -> list[str]:
    """The report printed to a pipe (nothing given up), `columns` wide."""
    out = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(log.relative_to(ROOT)), "--no-gpu", *args],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    return out.stdout.rstrip("\n").split("\n")


def _reference_words(log: Path) -> set[str]:
    """Every word the report holds, printed too wide to wrap: default and -v."""
    return _words("\n".join(_piped(log) + _piped(log, "-v") + [SHORTENED]))


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
@pytest.mark.parametrize(("log", "verdict", "first_fix"), [c[:3] for c in CASES], ids=[c[0].name for c in CASES])
def test_the_first_screen_is_the_answer(tmux, log, verdict, first_fix, size):
    width, height = size
    visible, rows, joined = capture(tmux, log, width, height)
    # once the command is done, the screen itself (not the history) shows the answer
    assert visible[0] == verdict, visible
    assert any(row.strip().startswith(first_fix) for row in visible), visible
    assert len(rows) <= height - 2, "\n".join(rows)  # room for the typed command and the prompt
    # no row was wrapped by the terminal: every line fits the width as printed
    assert len(joined) == len(rows), [r for r in joined if len(r) > width]
    assert max(len(r) for r in rows) <= width
    # never a word cut in two: every word is one of the report's, or cut at the end with "…"
    known = _reference_words(log)
    for row in rows:
        if re.fullmatch(r"also: (\d+ (blocker|warning|note)s?, )+-v shows (it|them)", row):
            continue  # the diagnoses folded to fit, counted
        for word in row.split():
            if word == "\\" or not set(word) - BARS:  # a shell continuation, a bar or sparkline
                continue
            if word.endswith("…"):
                assert any(k.startswith(word[:-1]) for k in known), word
            else:
                assert word in known, f"{word!r} is not a word of the report (cut mid-word?)"


@pytest.mark.parametrize(("log", "pictures"), [(c[0], c[3]) for c in CASES], ids=[c[0].name for c in CASES])
def test_a_tall_terminal_gets_everything(tmux, log, pictures):
    """200x50: what a pipe gets at that width, row for row, the pictures drawn in blocks."""
    _, rows, _ = capture(tmux, log, 200, 50)
    piped = _piped(log, columns=200)
    assert SHORTENED not in rows
    assert len(rows) == len(piped), "\n".join(rows)
    drawn = [r for r, p in zip(rows, piped, strict=True) if r.rstrip() != p.rstrip()]
    assert all(set(r) & BARS for r in drawn), drawn  # only the pictures differ: blocks, not letters
    assert bool(drawn) == pictures, rows


def test_a_short_terminal_gives_up_parts_in_order(tmux):
    """The three-diagnosis report at 80x24: the first diagnosis keeps its fixes and evidence, the
    other two shrink to their titles, and the last line says -v shows everything."""
    log = CASES[2][0]
    _, rows, _ = capture(tmux, log, 80, 24)
    assert rows[-1] == SHORTENED
    assert " BLOCKER  The server failed with an error no rule recognises" in rows
    assert " WARNING  Requests end in errors (finished_reason=error, HTTP 5xx)" in rows
    assert not any("Search vLLM's issues" in r for r in rows)  # the second diagnosis's fix: -v
    assert any(r.startswith("    2. Restart the server") for r in rows)  # the first's second fix stays


def test_a_note_is_folded_into_one_line(tmux):
    """queue-saturation at 80x24: the info note (the cache's size) becomes "also: 1 note"."""
    _, rows, _ = capture(tmux, LAB / "queue-saturation.log", 80, 24)
    assert "also: 1 note, -v shows it" in rows
    assert not any(r.startswith(" INFO ") for r in rows)
    assert any(r.strip().startswith("Corrected command") for r in rows)


def test_evidence_is_cut_with_an_ellipsis_and_shown_once(tmux):
    _, rows, _ = capture(tmux, LAB / "cache-oom.log", 80, 24)
    evidence = [r for r in rows if re.match(r"\s+\d+  ", r)]
    assert evidence and all(len(r) <= 80 for r in evidence)
    assert any(r.endswith("…") for r in evidence)
    messages = [r.split("  ", 2)[-1][:40] for r in evidence]
    assert len(messages) == len(set(messages))  # the engine's and the API server's copy: once


def test_a_pipe_gets_everything_in_colour_too():
    """--color always (FORCE_COLOR) makes rich treat a pipe as a terminal: the height stays a
    terminal's business, and the pipe gets the whole report."""
    log = LAB / "queue-saturation.log"
    out = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(log), "--no-gpu", "--color", "always"],
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "COLUMNS": "80", "LINES": "24", "PYTHONPATH": str(ROOT / "src")},
    ).stdout  # fmt: skip
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out).rstrip("\n").split("\n")
    assert "\x1b[" in out and SHORTENED not in plain
    assert len(plain) == len(_piped(log, columns=80)) > 24


class _Tty(io.StringIO):
    """A terminal as rich and show() see one: isatty(), its size from COLUMNS and LINES."""

    def isatty(self) -> bool:
        return True


def _squeezed(text: str) -> str:
    return "".join(text.split())


def test_every_fixture_and_lab_report_keeps_its_answer_on_an_80x24_screen(monkeypatch):
    """All of them, without tmux: the report fits 22 rows and still holds the verdict, the first
    diagnosis's title and first fix, and the corrected command."""
    from vllm_doctor import pipeline
    from vllm_doctor.knowledge.checks import Options
    from vllm_doctor.matching.loader import load
    from vllm_doctor.render import text
    from vllm_doctor.render.summary import corrected_command, headline

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    monkeypatch.setenv("NO_COLOR", "1")
    rules, shortened = load(checks=CHECKS), 0
    for log in sorted(FIXTURES.glob("logs/*/*.log")) + sorted(LAB.glob("*.log")):
        report = pipeline.explain([str(log)], rules, Options(gpu=False))
        screen = _Tty()
        text.show(report, file=screen, redact=False)
        rows = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue()).rstrip("\n").split("\n")  # bold under NO_COLOR
        assert len(rows) <= 22, (log, rows)
        flat = _squeezed("".join(rows))  # what is printed, without the breaks wrapping made
        assert flat.startswith(_squeezed(f"vllm-doctor: {headline(report)}")), (log, rows)
        if not report.diagnoses:
            continue
        first, command = report.diagnoses[0], corrected_command(report, redact=False)
        note = first.severity == "info" and not first.fixes  # a note is its summary alone
        assert (note or _squeezed(first.title) in flat) and _squeezed(first.summary) in flat, (log, rows)
        assert not first.fixes or _squeezed(f"1. {first.fixes[0].action}") in flat, (log, rows)
        assert command is None or _squeezed(command[0]) in flat, (log, rows)
        shortened += rows[-1] == text.SHORTENED
    assert shortened >= 100  # the cut is exercised, not only the reports that fit as they are
