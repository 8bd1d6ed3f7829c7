"""The first screen is the answer: `vllm-doctor explain` in a real terminal (tmux) at 80x24 and
200x50 shows the verdict and the first fix on the first screen, wraps between words and never
past the width.

tmux is a test dependency (scripts/ci-deps.sh installs it in CI): missing, these tests fail
under CI=true and are skipped elsewhere.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from conftest import LAB, ROOT

TMUX = shutil.which("tmux")
CASES = [
    # (log, verdict line, first fix, whole report fits 80x24 without scrolling)
    ("cache-oom.log", "vllm-doctor: failed: cache-oom (blocker)", "1. Lower --max-model-len to 8064", True),
    (
        "queue-saturation.log",
        "vllm-doctor: degraded: queue-saturation (warning)",
        "1. Store the KV cache in fp8",
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


def _command(log: str, *args: str) -> str:
    env = f"env -u COLUMNS -u LINES PYTHONPATH={shlex.quote(str(ROOT / 'src'))} TERM=xterm-256color"
    path = (LAB / log).relative_to(ROOT)  # as a user types it, from the checkout
    run = f"{shlex.quote(sys.executable)} -m vllm_doctor explain {shlex.quote(str(path))} --no-gpu"
    return f"cd {shlex.quote(str(ROOT))} && {env} {run} {' '.join(args)}; echo {DONE}; sleep 600"


def capture(socket: str, log: str, width: int, height: int) -> tuple[list[str], list[str], list[str]]:
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


def _reference_words(log: str) -> set[str]:
    """Every word the report holds, printed too wide to wrap: default and -v."""
    words: set[str] = set()
    for extra in ([], ["-v"]):
        out = subprocess.run(
            [sys.executable, "-m", "vllm_doctor", "explain", str((LAB / log).relative_to(ROOT)), "--no-gpu", *extra],
            capture_output=True, text=True, cwd=ROOT,
            env={**os.environ, "COLUMNS": "100000", "NO_COLOR": "1", "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
        words |= _words(out.stdout)
    return words


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
@pytest.mark.parametrize(("log", "verdict", "first_fix", "fits"), CASES, ids=[c[0] for c in CASES])
def test_the_first_screen_is_the_answer(tmux, log, verdict, first_fix, fits, size):
    width, height = size
    visible, rows, joined = capture(tmux, log, width, height)
    first_screen = rows[:height]
    assert first_screen[0] == verdict
    assert any(row.strip().startswith(first_fix) for row in first_screen), first_screen
    if fits or height >= 50:  # nothing scrolled away: the verdict is still on the screen
        assert verdict in visible
    # no row was wrapped by the terminal: every line fits the width as printed
    assert len(joined) == len(rows), [r for r in joined if len(r) > width]
    assert max(len(r) for r in rows) <= width
    # never a word cut in two: every word is one of the report's, or cut at the end with "…"
    known = _reference_words(log)
    for word in _words("\n".join(rows)):
        if word == "\\" or not set(word) - set("█░▁▂▃▄▅▆▇"):  # a shell continuation, a bar or sparkline
            continue
        if word.endswith("…"):
            stem = word[:-1]
            assert any(k.startswith(stem) for k in known), word
        else:
            assert word in known, f"{word!r} is not a word of the report (cut mid-word?)"


def test_cache_oom_fits_80x24(tmux):
    """The lab's cache-oom report, 52 rows at 80 columns before, fits one 80x24 screen, its
    memory bar and corrected command included."""
    _, rows, _ = capture(tmux, "cache-oom.log", 80, 24)
    assert len(rows) <= 24, "\n".join(rows)


def test_evidence_is_cut_with_an_ellipsis_and_shown_once(tmux):
    _, rows, _ = capture(tmux, "cache-oom.log", 80, 24)
    evidence = [r for r in rows if re.match(r"\s+\d+  ", r)]
    assert evidence and all(len(r) <= 80 for r in evidence)
    assert any(r.endswith("…") for r in evidence)
    messages = [r.split("  ", 2)[-1][:40] for r in evidence]
    assert len(messages) == len(set(messages))  # the engine's and the API server's copy: once
