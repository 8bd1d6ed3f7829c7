"""Every diagnosis of every fixture and lab recording, pinned: its severity, its rule and the
evidence lines it cites, one line per diagnosis in report order (tests/pipeline/snapshots/).

A fixture's .expect.toml says what its top diagnosis must be; the snapshot holds the rest, so a
rule that starts firing on another line, a second rule firing, or a new ranking shows in review
as a diff of these files. A maintainer regenerates them on purpose, after reading that diff:

    VLLM_DOCTOR_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/pipeline/test_snapshots.py

(it rewrites every snapshot, removes those of inputs that are gone, and passes).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path

import pytest
from test_fixtures import CASES

from conftest import FIXTURES, LAB
from vllm_doctor.data import Report
from vllm_doctor.knowledge.contract import Options

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("VLLM_DOCTOR_UPDATE_SNAPSHOTS") == "1"
HEADER = "# severity rule: evidence lines (source:line past the first input); VLLM_DOCTOR_UPDATE_SNAPSHOTS=1 rewrites\n"


def _inputs() -> list[tuple[str, Path, Path | None]]:
    """(snapshot name, input, config.json or None): the fixtures, the lab's and the KV families' logs."""
    out = []
    for log, expect in CASES:
        want = tomllib.loads(expect.read_text())
        config = FIXTURES / "configs" / want["config"] / "config.json" if "config" in want else None
        out.append((f"logs/{log.parent.name}/{log.name}", log, config))
    out += [(f"lab/{p.name}", p, None) for p in sorted(LAB.glob("*.log"))]
    out += [(f"kv-families/{p.name}", p, None) for p in sorted((FIXTURES / "kv-families").glob("*.log"))]
    return out


INPUTS = _inputs()


def snapshot(report: Report) -> str:
    lines = [HEADER]
    for d in report.diagnoses:
        cited = [f"{e.source}:{e.line}" if e.source else str(e.line) for e in d.evidence]
        lines.append(f"{d.severity} {d.rule}: {' '.join(cited) or '-'}\n")
    return "".join(lines)


def _path(name: str) -> Path:
    return SNAPSHOTS / f"{name}.txt"


@pytest.mark.parametrize(("name", "log", "config"), INPUTS, ids=[i[0] for i in INPUTS])
def test_every_diagnosis_is_the_snapshot(name: str, log: Path, config: Path | None, run):
    got = snapshot(run(log, options=Options(config=str(config)) if config else None))
    path = _path(name)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
    assert path.is_file(), f"no snapshot for {name}: VLLM_DOCTOR_UPDATE_SNAPSHOTS=1 writes it (then review it)"
    want = path.read_text(encoding="utf-8")
    diff = difflib.unified_diff(want.splitlines(), got.splitlines(), f"snapshot {name}", "now", lineterm="")
    assert got == want, "the diagnoses changed:\n" + "\n".join(diff)


def test_every_snapshot_belongs_to_an_input():
    known = {_path(name) for name, _, _ in INPUTS}
    stale = sorted(p for p in SNAPSHOTS.rglob("*.txt") if p not in known)
    if UPDATE:
        for p in stale:
            p.unlink()
        stale = []
    assert not stale, f"snapshots of inputs that are gone: {[str(p.relative_to(SNAPSHOTS)) for p in stale]}"
