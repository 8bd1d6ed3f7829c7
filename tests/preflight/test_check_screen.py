"""check's own -v and -q, an unknown option before `--` refused as serve refuses it, and its text
screen: the findings first, a line per area marked ✓ ! ✗ - (ASCII under NO_COLOR or a terminal
that is not UTF-8), the checks that could not run counted on one line (-v: each reason)."""

from __future__ import annotations

import io
import json

from typer.testing import CliRunner

from conftest import FIXTURES
from vllm_doctor.cli import app
from vllm_doctor.preflight.args import parse
from vllm_doctor.preflight.checks import AREAS, CHECKS
from vllm_doctor.preflight.run import preflight
from vllm_doctor.render import checkscreen, text

WIDE = str(FIXTURES / "configs" / "lab-wide-llama")
LLAMA = str(FIXTURES / "configs" / "llama-3-8b")
CPU = {"VLLM_CPU_KVCACHE_SPACE": "1"}
START = ["--no-gpu", "--no-ask-vllm", "--", LLAMA, "--max-model-len", "8192"]


def invoke(*args, env=None):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "100", **(env or {})})


def test_verbose_is_checks_own_not_a_model_for_vllm():
    plain = invoke("check", *START)
    r = invoke("check", "-v", *START)
    assert r.exit_code == plain.exit_code == 4, r.output
    assert "No model given" not in r.output and "No model given" not in plain.output
    assert "preflight of vllm serve " + LLAMA in r.output  # -v did not become the model
    assert "disk           the model is a local directory: nothing to download" in r.output  # each reason
    assert "(-v: why)" in plain.output and "nothing to download" not in plain.output
    assert invoke("check", "--verbose", *START).exit_code == 4


def test_quiet_is_the_verdict_line_only():
    r = invoke("check", "-q", *START)
    assert r.exit_code == 4
    assert r.output.splitlines() == ["vllm-doctor: " + json.loads(invoke("check", "-o", "json", *START).output)[
        "facts"]["preflight"]["headline"]]  # fmt: skip
    assert invoke("check", "-q", "-v", *START).exit_code == 2


def test_an_unknown_option_before_the_dashes_is_refused_as_serve_refuses_it():
    r = invoke("check", "--verbos", *START)
    assert r.exit_code == 2 and "check: no such option --verbos; did you mean --verbose?" in r.output
    r = invoke("check", "--max-model-len", "8192", "--", LLAMA)
    assert r.exit_code == 2 and "check: no such option --max-model-len; vLLM's arguments go after --" in r.output
    r = invoke("check", "--no-gpu", "--")
    assert r.exit_code == 2 and "give the model after --: vllm-doctor check" in r.output


def test_the_could_not_run_notes_are_one_line_and_json_keeps_each():
    r = invoke("check", *START, env={"NO_COLOR": "1"})
    assert "could not run:" not in "".join(line for line in r.output.splitlines() if line.startswith("note:"))
    data = json.loads(invoke("check", "-o", "json", *START).output)
    skipped = data["facts"]["preflight"]["skipped"]
    assert len(skipped) >= 3 and f"  {len(skipped)} checks could not run (-v: why)" in r.output.splitlines()
    assert [w for w in data["input"]["warnings"] if "could not run" in w] == [
        f"check {name} could not run: {why}" for name, why in skipped.items()
    ]


def test_findings_first_then_a_line_per_area():
    r = invoke("check", *START)
    lines = r.output.splitlines()
    at = lines.index("Checks")
    assert any("WARNING" in line for line in lines[:at]) and not any("WARNING" in line for line in lines[at:])
    areas = [line.split()[1] for line in lines[at + 1 :] if line.startswith("  ") and line[2] in "✓!✗-"]
    assert areas == ["vLLM", "model", "parallel", "fit", "GPUs", "host"]
    assert "  ! model     warning: tokenizer; passed: model_config" in r.output
    assert "  ✓ parallel  passed: tp_shape, tp_needed; could not run: tp_devices" in r.output
    assert "  - GPUs      could not run: gpu_free, other_servers, driver, capability" in r.output


def test_a_blocker_marks_its_area_and_no_color_is_ascii():
    start = ["--", WIDE, "--max-model-len", "32768", "--port", "0"]
    r = invoke("check", *start, env=CPU)
    assert r.exit_code == 1 and "  ✗ fit       blocker: fit" in r.output
    r = invoke("check", *start, env={**CPU, "NO_COLOR": "1"})
    assert "  x  fit       blocker: fit" in r.output and "✓" not in r.output and "✗" not in r.output
    assert any(line.startswith("  ok ") for line in r.output.splitlines())


def test_a_terminal_that_is_not_utf8_gets_ascii(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    report = preflight(parse([WIDE, "--max-model-len", "32768", "--port", "0"], env=CPU), no_gpu=True)
    latin = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    text.show(report, file=latin)
    latin.flush()
    drawn = latin.buffer.getvalue().decode("latin-1")
    assert "  x  fit       blocker: fit" in drawn
    assert "✗ fit" in text.render(report)  # a UTF-8 file gets the marks


def test_every_check_has_an_area_and_each_is_listed_once():
    assert {c.area for c in CHECKS} == set(AREAS.values())
    report = preflight(parse([WIDE, "--max-model-len", "8064", "--port", "0"], env=CPU), no_gpu=True)
    listed = [c["check"] for a in report.areas for c in a["checks"]]
    assert listed == [c.name for a in AREAS.values() for c in CHECKS if c.area == a]
    assert checkscreen.folded(report) <= set(report.warnings)
