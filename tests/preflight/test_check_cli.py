"""`vllm-doctor check` as a command: the list, --only, the formats and exit codes of explain, and
a run that never imports vLLM or torch."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from conftest import FIXTURES, ROOT
from vllm_doctor.cli import app
from vllm_doctor.preflight.checks import CHECKS

WIDE = str(FIXTURES / "configs" / "lab-wide-llama")
CPU = {"VLLM_CPU_KVCACHE_SPACE": "1", "NO_COLOR": "1"}


def invoke(*args, env=None):
    return CliRunner().invoke(app, list(args), env={**CPU, **(env or {})})


def test_list_names_every_check_once():
    r = invoke("check", "--list")
    assert r.exit_code == 0
    names = [line.split()[0] for line in r.output.splitlines()]
    assert names == [c.name for c in CHECKS] and len(set(names)) == len(names)
    assert all(c.description and "\n" not in c.description for c in CHECKS)


def test_a_blocker_is_exit_1_in_every_format(tmp_path):
    r = invoke("check", "--format", "json", "--", WIDE, "--max-model-len", "32768")
    assert r.exit_code == 1
    data = json.loads(r.output)
    assert data["schema"] == "vllm-doctor/report/1" and data["status"] == "failed"
    assert data["diagnoses"][0]["category"] == "cache-oom" and data["diagnoses"][0]["rule"] == "check-cache-oom-cpu"
    assert data["facts"]["preflight"]["command"].startswith("vllm serve ")
    r = invoke("check", "--format", "markdown", "-o", str(tmp_path / "r.md"), "--", WIDE, "--max-model-len", "32768")
    assert r.exit_code == 1 and "would fail: cache-oom" in (tmp_path / "r.md").read_text()
    r = invoke("check", "--", WIDE, "--max-model-len", "32768")
    assert r.exit_code == 1 and r.output.startswith("vllm-doctor: would fail: cache-oom")


def test_only_runs_one_check_and_unknown_is_usage():
    r = invoke("check", "--only", "context_limit", "--format", "json", "--", WIDE, "--max-model-len", "1024")
    data = json.loads(r.output)
    assert data["facts"]["preflight"]["ran"] == ["context_limit"] and data["diagnoses"] == []
    assert r.exit_code == 0 and data["facts"]["preflight"]["headline"] == "no blocker found by context_limit (--only)"
    r = invoke("check", "--only", "nope", "--", WIDE)
    assert r.exit_code == 2 and "no check 'nope'" in r.output


def test_fits_is_exit_0_and_a_check_that_cannot_run_is_one_line():
    r = invoke("check", "--offline", "--", WIDE, "--max-model-len", "8064", "--port", "0")
    assert r.exit_code == 0, r.output
    assert "checks could not run (-v: why)" in r.output and "note: check" not in r.output


def test_no_model_is_usage():
    assert invoke("check").exit_code == 2


def test_check_never_imports_vllm_or_torch():
    code = (
        "import sys\n"
        "from vllm_doctor.preflight.args import parse\n"
        "from vllm_doctor.preflight.run import preflight\n"
        f"report = preflight(parse([{WIDE!r}, '--max-model-len', '32768'], env={{'VLLM_CPU_KVCACHE_SPACE': '1'}}))\n"
        "assert report.diagnoses[0].category == 'cache-oom'\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
