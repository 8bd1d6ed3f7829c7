"""One log, many lives (issue 9): real lab recordings concatenated in every order, interleaved,
under container prefixes, and cut short; each gives the right latest status, timeline and facts
that do not mix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import LAB
from vllm_doctor.cli import app
from vllm_doctor.render.json import to_dict
from vllm_doctor.render.markdown import render as to_markdown
from vllm_doctor.render.text import render as to_text

OOM, HEALTHY, PORT, SIGKILL = "cache-oom.log", "healthy.log", "startup-port-in-use.log", "wrapper-sigkill.log"


def lines_of(name: str) -> list[str]:
    """A recording's lines as `cat` has them (tqdm's carriage returns stay inside their line)."""
    text = (LAB / name).read_bytes().decode()
    return [line + "\n" for line in (text[:-1] if text.endswith("\n") else text).split("\n")]


def joined(tmp_path: Path, *names: str, each=lambda name, line: line) -> Path:
    out = tmp_path / "server.log"
    out.write_bytes("".join(each(n, line) for n in names for line in lines_of(n)).encode())
    return out


def lives(report) -> list[tuple[str, str, object]]:
    """(status, outcome, max_model_len) of each lifetime."""
    return [(x["status"], x["outcome"], x["facts"]["max_model_len"]) for x in to_dict(report)["lifetimes"]]


def explain(*args: str):
    return CliRunner().invoke(app, ["explain", *args, "--no-gpu"], env={"NO_COLOR": "1"})


def test_fail_then_fix_is_healthy_with_the_fixed_starts_facts(tmp_path, run):
    report = run(joined(tmp_path, OOM, HEALTHY))
    data = to_dict(report)
    assert data["status"] == "healthy" and data["lifetime"] == 2
    assert data["facts"]["model"] == "/models/tiny-llama" and data["facts"]["max_model_len"] == 1024
    assert [x[0] for x in lives(report)] == ["failed", "healthy"]
    first = data["lifetimes"][0]
    assert first["outcome"] == "cache-oom" and first["end"] == "fatal" and first["facts"]["max_model_len"] == 32768
    assert first["diagnoses"][0]["rule"] == "kv-cache-too-small-for-max-len" and first["started"] == "11-30 01:53:24"
    assert not data["diagnoses"] or all(d["category"] != "cache-oom" for d in data["diagnoses"])
    text = to_text(report)
    assert text.startswith("vllm-doctor: healthy: no failure found (start 2 of 2; 1 earlier start failed)")
    assert "2 starts: #1 01:53 cache-oom, #2 01:48 served since 01:48, shut down at 01:48" in text
    assert "**2 starts: #1 01:53 cache-oom" in to_markdown(report)
    assert explain(str(tmp_path / "server.log")).exit_code == 0


def test_fix_then_fail_is_the_failure_with_its_own_numbers(tmp_path, run):
    report = run(joined(tmp_path, HEALTHY, OOM))
    data = to_dict(report)
    assert data["status"] == "failed" and data["diagnoses"][0]["category"] == "cache-oom"
    # the healthy start's KV cache (1,048,576 tokens) is not this start's: no "32 sequences of 32768 tokens"
    assert data["facts"]["max_model_len"] == 32768 and data["facts"]["kv_cache"]["tokens"] is None
    assert data["facts"]["concurrency"] == {"kv_tokens": None, "max_model_len": None, "worst_case_sequences": None}
    assert data["diagnoses"][0]["numbers"]["fit_max_model_len"] == 8064
    assert lives(report)[0] == ("healthy", "served since 01:48, shut down at 01:48", 1024)
    assert data["lifetimes"][0]["facts"]["kv_cache"]["tokens"] == 1048576
    assert explain(str(tmp_path / "server.log")).exit_code == 1


def test_a_crash_loop_of_three_is_named(tmp_path, run):
    report = run(joined(tmp_path, OOM, OOM, OOM))
    data = to_dict(report)
    assert [x[1] for x in lives(report)] == ["cache-oom"] * 3
    assert data["crash_loop"] == {"cause": "cache-oom", "first": 1, "last": 3, "times": 3}
    assert [x["lines"]["first"] for x in data["lifetimes"]] == [4, 170, 336]  # each start's banner
    assert "crash loop: starts #1-#3 all failed with cache-oom (3 times in a row)" in to_text(report)
    two = to_dict(run(joined(tmp_path, OOM, OOM)))
    assert "crash_loop" not in two and len(two["lifetimes"]) == 2


def test_three_different_starts_in_one_timeline(tmp_path, run):
    report = run(joined(tmp_path, PORT, OOM, HEALTHY))
    assert [x[:2] for x in lives(report)] == [
        ("failed", "port-in-use"),
        ("failed", "cache-oom"),
        ("healthy", "served since 01:48, shut down at 01:48"),
    ]
    assert "3 starts: #1 02:11 port-in-use, #2 01:53 cache-oom, #3 01:48 served" in to_text(report)


def test_two_servers_interleaved_in_one_file_keep_their_facts(tmp_path, run):
    """Two servers (API pids 15836 and 14044) writing to one file in bursts of 20 lines."""
    a, b = (lines_of(n) for n in (OOM, SIGKILL))
    mixed = []
    for i in range(0, max(len(a), len(b)), 20):
        mixed += a[i : i + 20] + b[i : i + 20]
    log = tmp_path / "mixed.log"
    log.write_bytes("".join(mixed).encode())
    data = to_dict(run(log))
    by_server = {x["server"]: x for x in data["lifetimes"]}
    assert set(by_server) == {"pid 15836", "pid 17323"}
    oom, served = by_server["pid 15836"], by_server["pid 17323"]
    assert oom["facts"]["max_model_len"] == 32768 and oom["diagnoses"][0]["category"] == "cache-oom"
    assert served["facts"]["max_model_len"] == 4096 and served["facts"]["kv_cache"]["tokens"] == 8192
    assert served["ready"] and served["facts"]["stats"]["samples"] == 1
    assert all(d["category"] != "cache-oom" for d in served["diagnoses"])


def _container(prefix: str):
    """As in a container: the API server is pid 1 in every start."""

    def each(_name: str, line: str) -> str:
        return prefix + re.sub(r"\(APIServer pid=\d+\)", "(APIServer pid=1)", line)

    return each


@pytest.mark.parametrize("prefix", ["vllm-1  | ", "[pod/vllm-0/vllm] ", "2025-09-20T03:15:00.000000000Z stdout F "])
def test_container_restarts_under_collector_prefixes(tmp_path, run, prefix):
    report = run(joined(tmp_path, OOM, PORT, HEALTHY, each=_container(prefix)))
    assert [x[:2] for x in lives(report)] == [
        ("failed", "cache-oom"),
        ("failed", "port-in-use"),
        ("healthy", "served since 01:48, shut down at 01:48"),
    ]
    assert [x[2] for x in lives(report)] == [32768, 1024, 1024]
    assert [x["server"] for x in to_dict(report)["lifetimes"]] == [_server(prefix)] * 3


def _server(prefix: str) -> str:
    return {"vllm-1  | ": "vllm-1 pid 1", "[pod/vllm-0/vllm] ": "pod/vllm-0/vllm pid 1"}.get(prefix, "pid 1")


def test_two_containers_in_one_file(tmp_path, run):
    a = [f"vllm-a  | {x}" for x in lines_of(HEALTHY)]
    b = [f"vllm-b  | {x}" for x in lines_of(OOM)]
    log = tmp_path / "compose.log"
    log.write_bytes(("".join(x for pair in zip(a, b, strict=False) for x in pair) + "".join(b[len(a) :])).encode())
    data = to_dict(run(log))
    by_server = {x["server"].split()[0]: x for x in data["lifetimes"]}
    assert by_server["vllm-a"]["status"] == "healthy" and by_server["vllm-a"]["facts"]["max_model_len"] == 1024
    assert by_server["vllm-b"]["status"] == "failed" and by_server["vllm-b"]["facts"]["max_model_len"] == 32768


def test_the_lifetime_option(tmp_path):
    log = str(joined(tmp_path, OOM, HEALTHY))
    first = explain(log, "--lifetime", "1", "-f", "json")
    assert first.exit_code == 1 and json.loads(first.stdout)["diagnoses"][0]["category"] == "cache-oom"
    every = explain(log, "--lifetime", "all")
    assert every.exit_code == 0, (
        every.stdout and "Start #1 (11-30 01:53:24, lines 4-164): failed, cache-oom" in every.stdout
    )
    assert "BLOCKER" in every.stdout and "Start #2 (shown in full):" in every.stdout
    for bad in ("0", "x", "3"):
        result = explain(log, "--lifetime", bad)
        assert result.exit_code == 2 and "--lifetime" in result.stderr, bad


# ---------------------------------------------------------------- abrupt endings


def test_a_start_killed_during_weight_loading_is_unknown(tmp_path, run):
    log = tmp_path / "cut.log"
    log.write_bytes("".join(lines_of(OOM)[:40]).encode())
    data = to_dict(run(log))
    life = data["lifetimes"][-1]
    assert data["status"] == "unknown" and life["end"] == "abrupt" and life["last_phase"] == "weights_loading"
    assert (
        life["outcome"] == "stopped during weight loading" and "dmesg" in life["note"] and "11 s after" in life["note"]
    )
    result = explain(str(log))
    assert result.exit_code == 4 and "unknown: stopped during weight loading" in result.stdout


def test_a_server_killed_while_serving_says_what_it_was_doing(run):
    data = to_dict(run(LAB / SIGKILL))
    life = data["lifetimes"][-1]
    assert data["status"] == "healthy" and life["ready"] and life["end"] == "serving"
    assert life["last_stats"] == {"line": 101, "running": 4, "waiting": 0, "kv_usage_pct": 31.7}
    assert "still running, or it was killed from outside" in life["note"]
    assert explain(str(LAB / SIGKILL)).exit_code == 0


def test_empty_input_is_one_line_and_unknown(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    result = explain(str(empty))
    assert result.exit_code == 4
    assert result.stdout == "vllm-doctor: unknown: the input is empty (nothing to diagnose)\n"
    data = json.loads(explain(str(empty), "-f", "json").stdout)
    assert data["status"] == "unknown" and data["input"]["empty"] and data["lifetimes"] == []


def test_input_that_is_not_vllm_is_unknown(tmp_path):
    other = tmp_path / "nginx.log"
    other.write_text('127.0.0.1 - - [01/Jan/2026:00:00:00 +0000] "GET / HTTP/1.1" 200 612\n' * 50)
    result = explain(str(other))
    assert result.exit_code == 4 and "unknown: no vLLM output recognised" in result.stdout
    assert "exit" in CliRunner().invoke(app, ["--help"]).stdout.lower()
    assert "4 unknown" in CliRunner().invoke(app, ["explain", "--help"]).stdout


def test_separate_files_are_separate_servers_and_the_worst_leads_each_named(tmp_path):
    """Three servers' logs given together (two failed), the healthy one last: not one timeline
    ending healthy, but the worst server shown, every server named by its file, exit 1."""
    paths = [str(LAB / n) for n in (OOM, PORT, HEALTHY)]
    result = explain(*paths, "-q")
    assert result.exit_code == 1
    assert result.output.startswith("vllm-doctor: failed: port-in-use (blocker) (server startup-port-in-use.log")
    assert "the worst of 3; 2 failed" in result.output
    text = explain(*paths).output
    for line in ("server cache-oom.log pid 15836: #1 01:53 cache-oom", "server startup-port-in-use.log pid 17748",
                 "server healthy.log pid 14044: #3 01:48 served since 01:48"):  # fmt: skip
        assert line in text
    data = json.loads(explain(*paths, "--format", "json").output)
    assert data["status"] == "failed" and "crash_loop" not in data  # no loop across servers
    assert [x["server"] for x in data["lifetimes"]] == ["cache-oom.log pid 15836", "startup-port-in-use.log pid 17748",
                                                        "healthy.log pid 14044"]  # fmt: skip
    worst = explain(str(LAB / HEALTHY), str(LAB / OOM), "-q")  # the failure leads wherever it is given
    assert worst.exit_code == 1 and "failed: cache-oom" in worst.output


@pytest.mark.parametrize("prefix", ["", "vllm-1  | "])
def test_one_servers_log_split_over_two_files_is_one_server(tmp_path, run, prefix):
    """A rotated log: the second file's first line with a pid continues the first file's process
    at a later time (lines before it without a pid, like tqdm's, go with it)."""
    lines = [prefix + x for x in lines_of(HEALTHY)]
    first, second = tmp_path / "vllm.log.1", tmp_path / "vllm.log"
    first.write_text("".join(lines[:40]))
    second.write_text("".join(lines[40:]))
    data = to_dict(run(first, second))
    assert [(x["status"], x["outcome"]) for x in data["lifetimes"]] == [
        ("healthy", "served since 01:48, shut down at 01:48")
    ]
    assert data["facts"]["max_model_len"] == 1024 and data["facts"]["kv_cache"]["tokens"] == 1048576
    backwards = to_dict(run(second, first))  # times that go back: not one process going on
    assert len(backwards["lifetimes"]) == 2
