"""Issue 25, class 5: a planted config cannot silence a blocker unannounced.

A `vllm-doctor.toml` beside a log (run from that directory), the XDG config file or
VLLM_DOCTOR_RULES point at a rule directory whose rules take the built-in ids that diagnose the
lab cache-OOM (exit 1). Without `replaces = "id"` such a rule is refused (a warning naming both
files, the built-in stays; --strict-rules: exit 2); with it, the rules replace the built-ins, and
the config file, the directory and every replaced id are named on stderr and in the report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LAB, ROOT, conforms

# the rules that diagnose the lab cache-OOM (vllm-check: the atlas names vLLM's message when no hand
# rule does); replacing all five leaves it "unknown" (exit 4)
SILENCED = ("kv-cache-too-small-for-max-len", "kv-cache-check-frame", "engine-core-init-failed", "unrecognised-failure",
            "vllm-check")  # fmt: skip
INERT = """id = "{id}"
{replaces}kind = "fact"
title = "nothing"
explanation = "a rule that never matches"
anchors = ["zzzz-never-in-a-log"]
phase = "ready"

[[patterns]]
regex = 'zzzz-never-in-a-log'
"""


def _env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_DOCTOR_", "XDG_CONFIG_HOME"))}
    out.update({"PYTHONPATH": str(ROOT / "src"), "XDG_CONFIG_HOME": "/nonexistent", **extra})
    return out


def _doctor(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "vllm_doctor", "explain", "cache-oom.log", "--no-gpu", *args]
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, timeout=120)


def _plant(tmp_path: Path, declared: bool) -> Path:
    """The log copied into a directory holding vllm-doctor.toml and its rule directory."""
    shutil.copy(LAB / "cache-oom.log", tmp_path / "cache-oom.log")
    rules = tmp_path / "rules"
    rules.mkdir()
    for rule_id in SILENCED:
        replaces = f'replaces = "{rule_id}"\n' if declared else ""
        (rules / f"{rule_id}.toml").write_text(INERT.format(id=rule_id, replaces=replaces))
    (tmp_path / "vllm-doctor.toml").write_text('rules = ["rules"]\n')
    return rules


def test_the_lab_cache_oom_is_a_blocker_without_the_config(tmp_path):
    shutil.copy(LAB / "cache-oom.log", tmp_path / "cache-oom.log")
    p = _doctor(tmp_path)
    assert p.returncode == 1 and p.stderr == b"", p.stderr.decode()


def test_an_undeclared_replacement_is_refused_and_the_blocker_stays(tmp_path):
    rules = _plant(tmp_path, declared=False)
    p = _doctor(tmp_path, "-f", "json")
    err = p.stderr.decode().splitlines()
    assert p.returncode == 1 and "kv-cache-too-small-for-max-len" in {
        d["rule"] for d in json.loads(p.stdout)["diagnoses"]
    }
    assert err[0] == f"vllm-doctor: settings from {tmp_path / 'vllm-doctor.toml'} (rules)"
    builtin = ROOT / "rules" / "cache-oom" / "kv-cache-too-small-for-max-len.toml"
    refused = [e for e in err if str(rules / "kv-cache-too-small-for-max-len.toml") in e]
    assert (
        len(refused) == 1 and str(builtin) in refused[0] and 'replaces = "kv-cache-too-small-for-max-len"' in refused[0]
    )
    strict = _doctor(tmp_path, "--strict-rules")
    assert strict.returncode == 2 and strict.stdout == b""
    assert [e for e in strict.stderr.decode().splitlines() if "settings from" not in e][0].count(".toml") == 2


def _named(p: subprocess.CompletedProcess, config: Path, rules: Path) -> None:
    """Exit 4 as the replacements make it, but every source named on stderr and in the JSON."""
    assert p.returncode == 4, p.stderr.decode()
    err = p.stderr.decode()
    assert f"settings from {config} (rules)" in err
    assert f"rules from {rules} ({len(SILENCED)} rules; replacing {', '.join(sorted(SILENCED))})" in err
    data = conforms(p.stdout)
    by_kind = {s["kind"]: s for s in data["settings"]}
    assert by_kind["rules"]["source"] == str(rules) and {r["id"] for r in by_kind["rules"]["replaced"]} == set(SILENCED)
    assert any(str(rules) in w and "replacing" in w for w in data["input"]["warnings"])


def test_a_declared_replacement_is_named_in_every_report_and_on_stderr(tmp_path):
    rules = _plant(tmp_path, declared=True)
    config = tmp_path / "vllm-doctor.toml"
    _named(_doctor(tmp_path, "-f", "json"), config, rules)
    for fmt in ("text", "markdown", "html"):
        out = _doctor(tmp_path, "-f", fmt, COLUMNS="400").stdout.decode()  # a long tmp path unwrapped
        assert str(config) in out and "replacing" in out and "kv-cache-check-frame" in out, fmt


@pytest.mark.parametrize("where", ["xdg", "variable"])
def test_the_xdg_file_and_the_variable_are_named_too(tmp_path, where):
    rules = _plant(tmp_path, declared=True)
    (tmp_path / "vllm-doctor.toml").unlink()
    if where == "xdg":
        config = tmp_path / "xdg" / "vllm-doctor" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text(f'rules = ["{rules}"]\n')
        p = _doctor(tmp_path, "-f", "json", XDG_CONFIG_HOME=str(tmp_path / "xdg"))
        _named(p, config, rules)
    else:
        p = _doctor(tmp_path, "-f", "json", VLLM_DOCTOR_RULES=str(rules))
        assert p.returncode == 4 and f"rules from {rules} ({len(SILENCED)} rules; replacing" in p.stderr.decode()
        assert "vllm-doctor: settings from VLLM_DOCTOR_RULES (rules)" in p.stderr.decode()
        assert {"kind": "variable", "source": "VLLM_DOCTOR_RULES", "keys": ["rules"]} in conforms(p.stdout)["settings"]


def test_replaces_may_name_another_id_and_must_name_a_rule(tmp_path):
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.loader import load
    from vllm_doctor.matching.problems import RuleError

    (tmp_path / "our-cache-oom.toml").write_text(
        INERT.format(id="our-cache-oom", replaces='replaces = "kv-cache-too-small-for-max-len"\n')
    )
    ids = {r.id: r for r in load([tmp_path], checks=CHECKS)}
    assert "kv-cache-too-small-for-max-len" not in ids and ids["our-cache-oom"].replaced.endswith(
        "kv-cache-too-small-for-max-len.toml"
    )
    (tmp_path / "our-cache-oom.toml").write_text(INERT.format(id="our-cache-oom", replaces='replaces = "no-such"\n'))
    with pytest.raises(RuleError, match="'no-such' is no rule loaded before this one"):
        load([tmp_path], checks=CHECKS)
