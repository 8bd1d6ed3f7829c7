"""Issue 37: serve's exit diagnosis inside a pod's grace period. A read with a budget (read/budget.py)
that runs out jumps from the start of a large file to its tail: the failure at the end is found,
every line keeps its number (the middle's newlines are counted, not read), and a warning says
which lines were not read. A pipe cannot jump, and a file no larger than its tail is read whole."""

from __future__ import annotations

import subprocess
import sys
import time

from conftest import FIXTURES
from vllm_doctor.pipeline import explain
from vllm_doctor.read import budget, logread
from vllm_doctor.read.budget import Budget

LAB = FIXTURES / "lab"
ACCESS = '(APIServer pid=12761) INFO:     127.0.0.1:{port} - "POST /v1/chat/completions HTTP/1.1" {status} OK\n'


def serving(path, lines: int) -> None:
    """The lab's healthy start, `lines` access lines (an error among them early on), the lab's cache OOM."""
    body = "".join(ACCESS.format(port=30000 + i % 30000, status=500 if i == 5 else 200) for i in range(lines))
    path.write_text((LAB / "healthy.log").read_text() + body + (LAB / "cache-oom.log").read_text())


def due(seconds: float = 20.0) -> Budget:
    now = time.monotonic()
    return Budget(jump=now - 1, until=now - 1, seconds=seconds, began=now - 1)  # past its time already


def test_a_budget_past_its_time_reads_the_start_and_the_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(budget, "LEAST_HEAD", 1 << 20)
    monkeypatch.setattr(budget, "LEAST_TAIL", 1 << 20)
    monkeypatch.setattr(logread, "BLOCK", 256 << 10)  # (what a buffer holds is read: a small one, a small log)
    log = tmp_path / "server.log"
    serving(log, 100_000)
    whole = explain([str(log)])
    cut = explain([str(log)], budget=due())
    assert cut.lines == whole.lines == len(log.read_bytes().splitlines())
    [said] = [w for w in cut.warnings if "not read" in w]
    assert "the diagnosis had 20 s (serve --diagnose-timeout)" in said and "lines " in said
    first, last = (int(x.replace(",", "")) for x in said.split("lines ")[1].split(" ")[0].split("-"))
    assert 5000 < first < last < whole.lines  # (the first MiB read: 10,000 lines or so)
    top, full = cut.diagnoses[0], whole.diagnoses[0]
    assert top.rule == full.rule and top.category == "cache-oom"
    assert [e.line for e in top.evidence] == [e.line for e in full.evidence]  # the tail's lines keep their numbers
    assert cut.facts.get("vllm_version") == whole.facts.get("vllm_version")  # the start was read


def test_what_cannot_jump_is_read_whole(tmp_path, monkeypatch):
    """A file within twice its tail, and a pipe (no seek), are read to the end: no warning."""
    monkeypatch.setattr(budget, "LEAST_TAIL", 8 << 20)
    log = tmp_path / "server.log"
    serving(log, 20_000)
    assert not [w for w in explain([str(log)], budget=due()).warnings if "not read" in w]
    code = (
        "import sys, time; from vllm_doctor.pipeline import explain; from vllm_doctor.read import budget;"
        "budget.LEAST_HEAD = budget.LEAST_TAIL = 1 << 16; now = time.monotonic();"
        "r = explain(['-'], budget=budget.Budget(now - 1, now - 1, 5.0, now - 1));"
        "print(r.lines, any('not read' in w for w in r.warnings))"
    )
    data = log.read_bytes()  # through a pipe
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=120)
    assert out.stdout.decode().split() == [str(len(data.splitlines())), "False"], out.stderr
