"""Hostile rules (issue 10, class 5): a --rules file cannot take the host down.

Patterns from --rules compile only in RE2's linear-time subset, with the pattern's length and
its repetition counts bounded (matching/linear.py), so what used to allocate 23.7 GB
(`a{1000000000}`), hang for 300 s (a 1 MB literal) or cost 5.5 s per rule on a hostile log
(`(?:x{1,100}){1,100}y`, fuzzy `{e<=3}`) is refused by `rules check` and by loading `--rules`,
one line per problem and exit 2; and what stays, such as `(?:a|b|ab)+c`, cannot backtrack.
The regex module is never asked to compile a --rules pattern: these tests make it fail if it
is, so a regression fails here instead of eating the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import regex
from typer.testing import CliRunner

from conftest import LAB, ROOT, SAMPLE_RULE
from vllm_doctor.cli import app
from vllm_doctor.facts import Facts
from vllm_doctor.knowledge.checks import CHECKS
from vllm_doctor.matching import linear
from vllm_doctor.matching.engine import Engine
from vllm_doctor.matching.loader import compile_regex, load
from vllm_doctor.read import logread

SAMPLE_REGEX = "regex = '''it happened (?P<n>\\d+)'''"
ATTACKS = {  # rule id: (its pattern, what the one line about it says)
    "huge-count": (r"it happened a{1000000000}(?P<n>\d+)", "a repetition count may be at most 1000"),
    "nested-counts": (r"it happened (?:x{1,100}){1,100}y(?P<n>\d+)", "nested repeats multiply to 10,000"),
    "fuzzy": (r"(?:it happened){e<=3} (?P<n>\d+)", "fuzzy matching"),
    "megabyte-literal": ("it happened " + "a" * (1 << 20) + r"(?P<n>\d+)", "a pattern may have at most 4,096"),
    "lookbehind": (r"(?<!not )it happened (?P<n>\d+)", "negative lookbehind"),
    "backreference": (r"it happened (?P<n>\d+) (\d) \1", "backreference"),
}
MEMORY_CAP = 4 << 30  # the CLI in a subprocess runs under this address-space limit: a regression fails, the host stays


def rule_text(rule_id: str, pattern: str, anchor: str = "it happened", example: str = "it happened 3") -> str:
    text = SAMPLE_RULE.replace('"my-rule"', f'"{rule_id}"').replace(SAMPLE_REGEX, "regex = " + json.dumps(pattern))
    text = text.replace('anchors = ["it happened"]', f"anchors = [{json.dumps(anchor)}]")
    return text.replace('example = "it happened 3"', f"example = {json.dumps(example)}")


def rules_dir(tmp_path: Path, rules: dict[str, str], name: str = "rules") -> Path:
    d = tmp_path / name
    d.mkdir()
    for rule_id, text in rules.items():
        (d / f"{rule_id}.toml").write_text(text)
    return d


@pytest.fixture
def no_backtracking_engine(monkeypatch):
    """The regex module's compile fails if asked: a rule pattern never reaches it."""

    def never(*a, **k):
        raise AssertionError("a rule pattern reached the regex module")

    monkeypatch.setattr(regex, "compile", never)


def test_rules_check_refuses_every_attack_one_line_each(tmp_path, no_backtracking_engine):
    d = rules_dir(tmp_path, {rid: rule_text(rid, pattern) for rid, (pattern, _) in ATTACKS.items()})
    result = CliRunner().invoke(app, ["rules", "check", str(d)])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == len(ATTACKS), lines  # one problem each, nothing that follows from it
    for rid, (_, reason) in ATTACKS.items():
        [line] = [ln for ln in lines if f"{rid}.toml:" in ln]
        assert line.startswith(f"{d / rid}.toml: key 'patterns[0].regex': ") and reason in line
        assert len(line) < 300  # the megabyte pattern is not echoed


@pytest.mark.parametrize("rid", list(ATTACKS))
def test_loading_rules_refuses_every_attack_with_one_line(tmp_path, no_backtracking_engine, rid):
    pattern, reason = ATTACKS[rid]
    d = rules_dir(tmp_path, {rid: rule_text(rid, pattern)})
    log = tmp_path / "x.log"
    log.write_text("it happened 3\n")
    result = CliRunner().invoke(app, ["explain", str(log), "--rules", str(d), "--strict-rules"])
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"vllm-doctor: {d / rid}.toml: key 'patterns[0].regex': ") and reason in line
    # without --strict-rules: the same line as a warning, and the built-in rules diagnose the log
    result = CliRunner().invoke(app, ["explain", str(log), "--rules", str(d), "--no-gpu"])
    assert result.exit_code == 4, result.output  # the log holds no vLLM output: unknown
    [line] = result.stderr.splitlines()
    assert line.startswith(f"vllm-doctor: {d / rid}.toml: key 'patterns[0].regex': ") and "(skipped" in line


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def test_the_cli_refuses_the_allocation_attack_in_its_own_process(tmp_path):
    """`a{1000000000}` through the real command line: exit 2 and one line, under a memory cap
    (it allocated 23.7 GB before the kernel killed it)."""
    d = rules_dir(tmp_path, {"huge-count": rule_text("huge-count", ATTACKS["huge-count"][0])})
    log = tmp_path / "x.log"
    log.write_text("it happened 3\n")
    for args in (["rules", "check", str(d)], ["explain", str(log), "--rules", str(d), "--strict-rules"]):
        p = subprocess.run(
            [sys.executable, "-m", "vllm_doctor", *args], capture_output=True, text=True, timeout=60, preexec_fn=_capped
        )
        assert p.returncode == 2, p.stderr
        [line] = p.stderr.splitlines()
        assert "a repetition count may be at most 1000" in line


def test_twenty_rules_of_the_slow_shapes_that_remain_cost_nothing_on_a_hostile_log(tmp_path):
    """`(?:a|b|ab)+c` and `(?:x{1,30}){1,30}y` stay (RE2 cannot backtrack on them). Twenty such
    rules on lines built for them: each search is bounded by its program's size times the
    text's, so the whole log goes through without a timeout or a dropped rule."""
    shapes = [r"hostile (?:a|b|ab)+c(?P<n>\d+)", r"hostile (?:x{1,30}){1,30}y(?P<n>\d+)"]
    texts = {
        f"slow-{i}": rule_text(f"slow-{i}", shapes[i % 2], "hostile", "hostile abc3" if i % 2 == 0 else "hostile xy3")
        for i in range(20)
    }
    rules = load([rules_dir(tmp_path, texts)], builtin=False, checks=CHECKS)
    assert all(r.linear for r in rules)
    log = tmp_path / "hostile.log"
    lines = ["hostile " + "ab" * 8000, "hostile " + "x" * 16000] * 50
    log.write_text("\n".join(lines) + "\nhostile abc7\n")
    eng = Engine(rules)
    facts = Facts()
    matches = eng.run(logread.read([str(log)], eng.prefilter, logread.ReadStats()), facts)
    compiled = [compile_regex(p.regex) for r in rules for p in r.patterns]  # what the engine searched with
    assert all(isinstance(rx, linear.LinearPattern) for rx in compiled)
    assert sum(rx._rx.programsize for rx in compiled) <= 20 * 2000  # the linear bound's constant
    assert {rid for rid in matches} == {f"slow-{i}" for i in range(0, 20, 2)}  # the real line at the end


GOOD = """
id = "kv-tight"
category = "cache-oom"
title = "The KV cache is tight"
severity = "warning"
summary = ["Only {tokens} tokens of KV cache ({kind})."]
explanation = "Why."
anchors = ["KV cache size:", "KV tokens:"]
[[patterns]]
regex = '''(?:GPU KV cache size: (?P<tokens>\\d[\\d,]*) tokens|KV tokens: (?P<tokens>\\d+))(?# either wording) (?P<kind>\\w+)(?: \\((?P<extra>[^)]{0,200})\\))?'''
unless = '''ignore me'''
example = "GPU KV cache size: 1,024 tokens gpu"
counter_example = ["GPU KV cache size: 1,024 tokens gpu ignore me"]
[[fixes]]
action = "Raise --gpu-memory-utilization"
why = "Because."
"""


def test_a_rule_in_the_subset_works_end_to_end(tmp_path):
    """Named groups (one name in two alternatives), a comment, a bounded skip and `unless`:
    checked, loaded and matched through RE2, the numbers filled as the regex module would."""
    d = rules_dir(tmp_path, {"kv-tight": GOOD})
    runner = CliRunner()
    check = runner.invoke(app, ["rules", "check", str(d)])
    assert check.exit_code == 0 and "1 rule file(s) OK" in check.stdout, check.stderr
    [rule] = load([d], builtin=False, checks=CHECKS)
    assert rule.linear
    log = tmp_path / "server.log"
    log.write_text("INFO 06-11 09:12:44 worker.py:1] KV tokens: 2048 cpu (spilled)\nINFO done\n")
    result = runner.invoke(app, ["explain", str(log), "--rules", str(d), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    [diag] = [x for x in json.loads(result.stdout)["diagnoses"] if x["rule"] == "kv-tight"]
    assert diag["summary"] == "Only 2048 tokens of KV cache (cpu)."
    ignored = tmp_path / "ignored.log"
    ignored.write_text("INFO KV tokens: 2048 cpu ignore me\n")
    result = runner.invoke(app, ["explain", str(ignored), "--rules", str(d), "--format", "json"])
    assert not [x for x in json.loads(result.stdout)["diagnoses"] if x["rule"] == "kv-tight"]


def test_serve_with_a_hostile_rule_passes_the_server_through_and_exits_with_it(tmp_path):
    """Under `serve` the allocation attack took the wrapper to 4 GB in 11 s and stopped the
    server's output; twenty slow rules kept it 107 s past vLLM's exit. Now serve refuses the
    rule as explain does, before the child starts: one warning naming the file, and the built-in
    rules run in the live watch and in the incident report; every byte of the server passes."""
    fake = ROOT / "tests" / "serve" / "fakevllm.py"
    vllm = tmp_path / "vllm"
    vllm.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    vllm.chmod(0o755)
    replay = tmp_path / "replay.log"
    replay.write_bytes((LAB / "tp-divisibility.log").read_bytes() + b"hostile " + b"ab" * 8000 + b"\n")
    attack = {"huge-count": rule_text("huge-count", ATTACKS["huge-count"][0])}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(NO_COLOR="1", FAKE_REPLAY=str(replay), FAKE_END="exit:1")
    direct = subprocess.run([str(vllm), "serve", "m"], env=env, capture_output=True, timeout=60)
    for d in (rules_dir(tmp_path, attack, "attack"), rules_dir(tmp_path, _slow_rules(), "slow")):
        cmd = [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(vllm), "--preflight", "off"]
        cmd += ["--rules", str(d), "--", "m"]
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=120, preexec_fn=_capped)
        assert p.returncode == 1 and p.stdout == direct.stdout
        stderr = p.stderr
        if d.name == "attack":
            warning, stderr = p.stderr.split(b"\n", 1)
            assert b"huge-count.toml" in warning and b"a repetition count may be at most 1000" in warning
            assert b"skipped: the other rules run" in warning
        assert stderr.startswith(direct.stderr)
        assert b"live watch stopped" not in p.stderr and b"could not diagnose" not in p.stderr
        [report] = (tmp_path / "vllm-doctor-reports").glob("*/report.json")
        assert json.loads(report.read_text())["diagnoses"][0]["category"] == "tp-divisibility"  # the built-in rules
        report.unlink()
        report.parent.rename(tmp_path / f"done-{d.name}")


def _slow_rules() -> dict[str, str]:
    return {
        f"slow-{i}": rule_text(f"slow-{i}", r"hostile (?:a|b|ab)+c(?P<n>\d+)", "hostile", "hostile abc3")
        for i in range(20)
    }
