"""The command line: formats, exit codes, stdin, output files and clear errors."""

from __future__ import annotations

import gzip
import subprocess
import sys

from typer.testing import CliRunner

from conftest import LAB, conforms
from vllm_doctor.cli import app

runner = CliRunner()


def explain(*args, **kw):
    return runner.invoke(app, ["explain", *map(str, args)], **kw)


def test_exit_1_on_a_blocker_and_0_on_a_healthy_log():
    assert explain(LAB / "cache-oom.log").exit_code == 1
    assert explain(LAB / "healthy.log").exit_code == 0


def test_fail_on_warning_gates_a_degraded_log():
    log = LAB / "queue-saturation.log"
    assert explain(log).exit_code == 0
    assert explain(log, "--fail-on", "warning").exit_code == 1


def test_text_output_shows_the_verdict_then_the_fixes_then_the_evidence():
    result = explain(LAB / "cache-oom.log", env={"NO_COLOR": "1"})
    out = result.output
    assert "\x1b[" not in out
    first = out.splitlines()[0]
    assert "cache-oom" in first and "blocker" in first
    for part in ("Evidence", "Fixes, in order", "1. Lower --max-model-len to 8064"):
        assert part in out
    assert out.index("Fixes, in order") < out.index("Evidence")
    assert "Numbers" not in out and "needed_gib" not in out  # the summary carries the numbers


def test_verbose_adds_every_number_with_its_meaning_and_quiet_keeps_the_verdict():
    out = explain(LAB / "cache-oom.log", "-v", env={"NO_COLOR": "1", "COLUMNS": "200"}).output
    assert "KV cache needed: 4 GiB" in out and "KV cache available: 0.98 GiB" in out
    assert "needed_gib" not in out and "None" not in out
    assert "(wrapper; the cause is above)" in out  # the full evidence
    quiet = explain(LAB / "cache-oom.log", "-q", env={"NO_COLOR": "1"})
    assert quiet.output == "vllm-doctor: failed: cache-oom (blocker)\n" and quiet.exit_code == 1
    assert explain(LAB / "cache-oom.log", "-q", "-v").exit_code == 2


def test_json_and_markdown_formats(tmp_path):
    data = conforms(explain(LAB / "tp-divisibility.log", "--format", "json").output)
    assert data["diagnoses"][0]["category"] == "tp-divisibility"
    target = tmp_path / "incident.md"
    result = explain(LAB / "tp-divisibility.log", "--format", "markdown", "-o", target)
    assert result.exit_code == 1
    md = target.read_text()
    assert md.startswith("## vllm-doctor: failed: tp-divisibility")
    assert "--tensor-parallel-size" in md and "```text" in md
    assert "<" not in md  # plain Markdown: no raw HTML (Jira, GitLab)
    assert str(target) in result.output  # a one-line summary on the terminal
    github = explain(LAB / "tp-divisibility.log", "--format", "markdown", "--flavor", "github").output
    assert "<details><summary>Evidence" in github


def test_stdin_and_gzip(tmp_path):
    raw = (LAB / "context-exceeds-max.log").read_bytes()
    result = explain("-", "--format", "json", input=raw)
    assert conforms(result.output)["diagnoses"][0]["category"] == "context-exceeds-max"
    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(raw))
    data = conforms(explain(gz, "--format", "json").output)
    assert data["diagnoses"][0]["category"] == "context-exceeds-max"
    assert data["input"]["lines"] == raw.count(b"\n")


def test_several_files_keep_their_own_line_numbers():
    data = conforms(explain(LAB / "healthy.log", LAB / "tp-divisibility.log", "-f", "json").output)
    ev = data["diagnoses"][0]["evidence"][0]
    assert ev["path"].endswith("tp-divisibility.log")
    assert (
        (LAB / "tp-divisibility.log")
        .read_bytes()
        .decode()
        .split("\n")[ev["line"] - 1]
        .strip()
        .startswith(ev["text"][:40])
    )


def test_unreadable_input_is_one_clear_line_and_exit_2(tmp_path):
    for bad, words in (
        (tmp_path / "missing.log", "no such file"),
        (tmp_path, "is a directory"),
    ):
        result = explain(bad)
        assert result.exit_code == 2
        assert words in result.output
        assert "Traceback" not in result.output


def test_target_concurrency_budget():
    data = conforms(
        explain(LAB / "healthy.log", "-f", "json", "--target-concurrency", "2048", "--target-len", "1024").output
    )
    budget = data["facts"]["concurrency"]
    assert budget["kv_tokens"] == 1048576
    assert budget["worst_case_sequences"] == 1024
    assert budget["can_hold_target"] is False
    assert budget["missing_tokens"] == 2048 * 1024 - 1048576


def test_runs_as_a_module():
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(LAB / "cache-oom.log"), "-f", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1
    assert conforms(proc.stdout)["status"] == "failed"


def test_usage_error_is_one_line_with_status_2():
    proc = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(LAB / "healthy.log"), "--format", "yaml"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--format" in proc.stderr


def test_the_entry_point_builds_only_the_command_it_runs_and_it_says_the_same():
    """main() hands typer an app of the one command the command line names (building every
    command is 13 ms of a cold start); that command's help and usage errors are the whole app's."""
    from typer.main import get_command

    from vllm_doctor.cli.commands import _narrowed

    for words in ([], ["--help"], ["--version"], ["explian"], ["-h", "explain"]):
        assert _narrowed(words) is app  # no command first: the whole app (its help, its suggestions)
    for name in ("explain", "serve", "rules"):
        only = _narrowed([name])
        assert list(get_command(only).commands) == [name]  # type: ignore[attr-defined]
        for args in ([name, "-h"], [name, "--no-such-option"]):
            got, want = runner.invoke(only, args), runner.invoke(app, args)
            assert (got.exit_code, got.output) == (want.exit_code, want.output)
    assert len(get_command(app).commands) > 3  # type: ignore[attr-defined]  # (the whole app is untouched)
