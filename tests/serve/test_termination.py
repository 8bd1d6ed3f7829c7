"""Kubernetes' termination message (serve/termination.py) around the real fake child: on a bad
exit the file holds the cause, the first fix and the corrected command in at most 4096 bytes, and
serve still exits with the child's status."""

from __future__ import annotations

import json
from pathlib import Path

from test_serve import report_dirs, run_serve

from conftest import LAB
from vllm_doctor.serve import termination
from vllm_doctor.serve.options import Outcome


def test_a_failed_start_leaves_its_cause_in_the_termination_log(tmp_path, fake_bin):
    log = tmp_path / "termination-log"
    rc, _, err = run_serve(
        tmp_path, fake_bin, "--termination-log", str(log), FAKE_REPLAY=LAB / "cache-oom.log", FAKE_END="exit:1"
    )
    assert rc == 1, err.decode()
    data = log.read_bytes()
    assert 0 < len(data) <= termination.LIMIT
    text = data.decode()
    lines = text.splitlines()
    assert lines[0] == "vllm-doctor: failed: cache-oom (blocker)"
    assert lines[1] == "Fix 1: Lower --max-model-len to 8064"
    assert lines[2] == "Corrected command (fix 1 applied: --max-model-len 8064):"
    # the lab start set its CPU KV space: the command as pasted carries it in front
    assert lines[3].startswith("VLLM_CPU_KVCACHE_SPACE=1 vllm serve ") and lines[3].endswith("--max-model-len 8064")
    assert "exit status 1; never became ready" in text
    assert f"Incident report: {report_dirs(tmp_path)[0]}/" in text


def test_a_clean_exit_leaves_the_termination_log_alone(tmp_path, fake_bin):
    log = tmp_path / "termination-log"
    rc, _, err = run_serve(
        tmp_path, fake_bin, "--termination-log", str(log), FAKE_REPLAY=LAB / "healthy.log", FAKE_END="exit:0"
    )
    assert rc == 0, err.decode()
    assert not log.exists()


def test_an_unwritable_termination_log_changes_nothing_of_the_exit(tmp_path, fake_bin):
    log = tmp_path / "no-such-dir" / "termination-log"
    rc, _, err = run_serve(
        tmp_path, fake_bin, "--termination-log", str(log), FAKE_REPLAY=LAB / "tp-divisibility.log", FAKE_END="exit:3"
    )
    assert rc == 3, err.decode()
    assert not log.exists() and len(report_dirs(tmp_path)) == 1


def test_the_message_keeps_the_cause_first_and_fits_4096_bytes():
    outcome = Outcome(status=1, report_dir=Path("/var/incidents/x"))
    command = "vllm serve m " + " ".join(f"--opt{i} ü{i}" for i in range(1000))  # a long command, multi-byte text
    text = termination.message(["vllm-doctor: failed: x", "Fix 1: do y", command], ["a summary " * 50], outcome)
    assert len(text.encode()) <= termination.LIMIT and text.startswith(
        "vllm-doctor: failed: x\nFix 1: do y\nvllm serve m"
    )
    short = termination.message(["v", "f"], ["summary"], outcome)
    assert short == "v\nf\nsummary\nvLLM ended: exit status 1; never became ready\nIncident report: /var/incidents/x/\n"


def test_secrets_are_masked_in_the_message():
    from vllm_doctor.render.redact import Redactor

    mask = Redactor(["s3cr3t-value-123"]).text
    text = termination.message(["vllm serve m --api-key s3cr3t-value-123"], [], Outcome(status=1), mask)
    assert "s3cr3t" not in text and "[REDACTED]" in text


def test_the_default_is_kubernetes_file_only_where_it_is_writable(tmp_path, monkeypatch):
    monkeypatch.setattr(termination, "DEFAULT", tmp_path / "termination-log")
    assert termination.default_path() is None  # missing: not in a pod
    (tmp_path / "termination-log").write_text("")
    assert termination.default_path() == tmp_path / "termination-log"
    (tmp_path / "termination-log").chmod(0o400)
    assert termination.default_path() is None or __import__("os").geteuid() == 0


def test_the_readmes_kubernetes_examples_install_this_distribution():
    """Pasted, `pip install vllm-doctor` installs another project: the examples name ours (pyproject)."""
    import re
    import tomllib

    root = Path(__file__).parents[2]
    name = tomllib.loads((root / "pyproject.toml").read_text())["project"]["name"]
    readme = (root / "README.md").read_text()
    installs = re.findall(r"pip install -q ([\w.-]+) && exec vllm-doctor (\w+)", readme)
    assert {cmd for _, cmd in installs} == {"check", "serve"} and {n for n, _ in installs} == {name}
    assert "kubectl logs --previous" in readme and "| vllm-doctor explain -" in readme


def test_a_saturated_server_with_a_surrogate_in_its_arguments_gets_its_report_and_message(tmp_path, fake_bin):
    """Issue 35: 100 stats samples all waiting with the cache full (a run past the bulk reader's
    batch: exit 3 in the diagnosis) and `'\\udfff'` in the argument dump (a lone surrogate no
    UTF-8 file takes): serve wrote no report.json/md/html and no termination message."""
    lines = (LAB / "queue-saturation.log").read_text().splitlines()
    start = lines[: next(i for i, ln in enumerate(lines) if "Application startup complete" in ln) + 1]
    start = [ln.replace("'model_tag': '/models/wide-llama'", "'model_tag': '\\udfff'") for ln in start]
    stats = (
        "(APIServer pid=1) INFO 12-01 10:00:{s:02d} [loggers.py:257] Engine 000: Avg prompt throughput: 100.0 tokens/s,"
        " Avg generation throughput: 50.0 tokens/s, Running: 6 reqs, Waiting: 10 reqs, CPU KV cache usage: 99.5%,"
        " Prefix cache hit rate: 0.0%"
    )
    log = tmp_path / "saturated.log"
    log.write_text("\n".join([*start, *(stats.format(s=i % 60) for i in range(100))]) + "\n")
    message = tmp_path / "termination-log"
    rc, _, err = run_serve(tmp_path, fake_bin, "--termination-log", str(message), FAKE_REPLAY=log, FAKE_END="exit:1")
    assert rc == 1, err.decode()
    assert b"degraded: queue-saturation (warning)" in err
    (report,) = report_dirs(tmp_path)
    assert {"report.json", "report.md", "report.html", "server.log"} <= {p.name for p in report.iterdir()}
    data = json.loads((report / "report.json").read_text())
    assert data["serve"]["internal_errors"] == [] and data["serve"]["diagnosis_error"] is None
    text = message.read_text()
    assert text.startswith("vllm-doctor: degraded: queue-saturation (warning)") and "'\\udfff'" in text
