"""The terminal text without a terminal: its width follows COLUMNS, numbers read with their
meaning and unit, the corrected command pastes back whole, unknown values are left out."""

from __future__ import annotations

import shlex

from typer.testing import CliRunner

from conftest import LAB
from vllm_doctor.cli import app
from vllm_doctor.render.numbers import described, label
from vllm_doctor.render.summary import distinct_evidence, message
from vllm_doctor.render.text import _continued, render

runner = CliRunner()


def _explain(*args, columns: int) -> str:
    return runner.invoke(
        app, ["explain", *map(str, args), "--no-gpu"], env={"NO_COLOR": "1", "COLUMNS": str(columns)}
    ).output


def test_the_width_follows_columns():
    for columns in (40, 60, 80, 120):
        for extra in ([], ["-v"]):
            out = _explain(LAB / "cache-oom.log", *extra, columns=columns)
            assert max(len(line) for line in out.splitlines()) <= columns, (columns, extra)
    narrow, wide = _explain(LAB / "cache-oom.log", columns=60), _explain(LAB / "cache-oom.log", columns=200)
    assert len(narrow.splitlines()) > len(wide.splitlines())


def test_numbers_read_with_their_meaning_and_unit_and_unknowns_are_left_out():
    numbers = {"needed_gib": 4.0, "available_gib": 0.98, "preemptions": None, "survived": False, "held_by_x_gib": 2}
    assert described(numbers) == [
        ("KV cache needed", "4 GiB"),
        ("KV cache available", "0.98 GiB"),
        ("held by x", "2 GiB"),
    ]
    assert label("waiting_kv_max_pct") == ("highest KV cache usage while requests waited", "%")


def test_the_same_message_twice_is_evidence_once(run):
    report = run(LAB / "cache-oom.log")
    top = report.diagnoses[0]
    assert len(top.evidence) == 2
    (only,) = distinct_evidence(top.evidence)
    assert message(only.text).startswith("ValueError: To serve at least one request")


def test_the_corrected_command_is_shown_and_pastes_back_whole(run):
    report = run(LAB / "cache-oom.log")
    command = "vllm serve /models/wide-llama --max-model-len 8064 --gpu-memory-utilization 0.9 --api-key 'a b'"
    report.diagnoses[0].corrected_command = command  # type: ignore[attr-defined]  # issue 11's other half
    out = render(report, redact=False)
    assert "Corrected command" in out
    assert out.index("Corrected command") < out.index("Evidence")
    lines = _continued(command, 40)
    assert all(len(line) <= 40 for line in lines) and len(lines) > 1
    assert shlex.split(" ".join(line.removesuffix("\\") for line in lines)) == shlex.split(command)
    assert "--max-model-len 8064" in "\n".join(lines)  # an option stays with its value


def test_quiet_is_the_verdict_line_alone_in_any_width():
    assert (
        _explain(LAB / "queue-saturation.log", "-q", columns=30)
        == "vllm-doctor: degraded: queue-saturation (warning)\n"
    )
