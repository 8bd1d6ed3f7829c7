"""Limits before parsing (issue 25, classes 6, 7 and 10): a huge or deeply nested file, a number
that is not finite or past any sane size, a count a loop would run to. Each ends in one line and
exit 2 (it was exit 3 "internal error", minutes and gigabytes, or a hang), or in a diagnosis that
says what it could not read.

The hangs run as subprocesses under a generous timeout: a safety net, the exit status is what is
asserted. Sparse files (truncate) take no disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, SAMPLE_RULE

CONFIG = FIXTURES / "configs" / "llama-3-8b" / "config.json"


def _run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllm_doctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "VLLM_DOCTOR_CONFIG": "", **(env or {})},
    )


def _one_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("vllm-doctor: "), proc.stderr[-2000:]
    assert "internal error" not in proc.stderr and all(w in proc.stderr for w in words), proc.stderr


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


def _config(tmp: Path, **values: str) -> Path:
    """llama-3-8b's config.json with some values written as raw JSON (NaN, 1e308, 400 digits)."""
    text = CONFIG.read_text()
    for key, raw in values.items():
        data = json.loads(text)
        assert key in data, key
        data[key] = "@@"
        text = json.dumps(data).replace('"@@"', raw)
    path = tmp / "config.json"
    path.write_text(text)
    return path


def _log(tmp: Path) -> str:
    (tmp / "x.log").write_text("it happened 3\n")
    return str(tmp / "x.log")


def _plan(*args: str) -> list[str]:
    return ["plan", "--no-gpu", "--gpu-memory", "80GB", *args]


# (id) -> builder(tmp) -> (args, env, words the one line says)
CASES = {
    # size: read-bounded before tomllib / json (a 1 GiB settings file took 2 GB and 31 s, a rule file 3.75 min)
    "settings-file-1GiB": lambda t: (
        ["explain", _log(t), "--no-gpu"],
        {"VLLM_DOCTOR_CONFIG": str(_sparse(t / "vllm-doctor.toml", 1 << 30))},
        ["vllm-doctor.toml", "larger than a settings file"],
    ),
    "rule-file-1GiB": lambda t: (
        ["explain", _log(t), "--no-gpu", "--rules", str(_sparse_rule(t)), "--strict-rules"],
        {},
        ["big.toml", "larger than a rule file"],
    ),
    "config-json-500MB": lambda t: (
        _plan("--config", str(_sparse(t / "config.json", 500_000_000))),
        {},
        ["larger than a config.json"],
    ),
    # depth
    "settings-nested-5000": lambda t: (
        ["explain", _log(t), "--no-gpu"],
        {"VLLM_DOCTOR_CONFIG": str(_write(t / "s.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n"))},
        ["s.toml", "nested too deeply"],
    ),
    "config-json-nested-100000": lambda t: (
        _plan("--config", str(_write(t / "config.json", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"))),
        {},
        ["nested too deeply"],
    ),
    # magnitudes in config.json
    "config-layers-1e308": lambda t: (_plan("--config", str(_config(t, num_hidden_layers="1e308"))), {}, ["num_hidden_layers"]),
    "config-layers-NaN": lambda t: (_plan("--config", str(_config(t, num_hidden_layers="NaN"))), {}, ["NaN"]),
    "config-layers-Infinity": lambda t: (_plan("--config", str(_config(t, num_hidden_layers="Infinity"))), {}, ["Infinity"]),
    "config-layers-10**400": lambda t: (_plan("--config", str(_config(t, num_hidden_layers="1" + "0" * 400))), {}, ["digits"]),
    "config-intermediate-1e308": lambda t: (_plan("--config", str(_config(t, intermediate_size="1e308"))), {}, ["intermediate_size"]),
    "config-vocab-1e308": lambda t: (_plan("--config", str(_config(t, vocab_size="1e308"))), {}, ["vocab_size"]),
    "config-layers-1e8": lambda t: (_plan("--config", str(_config(t, num_hidden_layers="100000000"))), {}, ["num_hidden_layers", "10,000"]),
    # plan's own numbers
    "plan-layers-10**30": lambda t: (
        _plan("--layers", "1" + "0" * 30, "--kv-heads", "8", "--head-dim", "128", "--params", "7B"), {}, ["--layers"]
    ),
    "plan-params-1e400": lambda t: (
        _plan("--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--params", "1e400"), {}, ["parameter count"]
    ),
    "plan-overhead-minus-100GB": lambda t: (_plan("--config", str(CONFIG), "--overhead", "-100GB"), {}, ["--overhead"]),
    "plan-overhead-nanGB": lambda t: (_plan("--config", str(CONFIG), "--overhead", "nanGB"), {}, ["--overhead"]),
    "plan-overhead-400-digits-GB": lambda t: (_plan("--config", str(CONFIG), "--overhead", "9" * 400 + "GB"), {}, ["--overhead"]),
    # counts a loop ran to (hangs)
    "plan-tp-10**18": lambda t: (_plan("--config", str(CONFIG), "-tp", str(10**18)), {}, ["--tensor-parallel-size"]),
    "plan-gpus-10**18": lambda t: (_plan("--config", str(CONFIG), "--gpus", str(10**18)), {}, ["--gpus"]),
    "check-tp-10**18": lambda t: (
        ["check", "--no-gpu", "--offline", "--", str(CONFIG.parent), "-tp", str(10**18)], {}, ["--tensor-parallel-size"]
    ),
    "check-tp-nan": lambda t: (
        ["check", "--no-gpu", "--offline", "--", str(CONFIG.parent), "-tp", "nan"], {}, ["--tensor-parallel-size", "finite"]
    ),
    "check-max-model-len-inf": lambda t: (
        ["check", "--no-gpu", "--offline", "--", str(CONFIG.parent), "--max-model-len", "inf"], {}, ["--max-model-len"]
    ),
    # --prometheus' window (checked before any request)
    "prometheus-start-nan": lambda t: (
        ["explain", "--prometheus", "http://127.0.0.1:9", "--start", "nan", "--end", "10"], {}, ["nan", "finite"]
    ),
    "prometheus-end-inf": lambda t: (
        ["explain", "--prometheus", "http://127.0.0.1:9", "--start", "1", "--end", "inf"], {}, ["inf", "finite"]
    ),
    "prometheus-since-5000-digits": lambda t: (
        ["explain", "--prometheus", "http://127.0.0.1:9", "--since", "1" + "0" * 5000 + "s"], {}, ["--since"]
    ),
    "prometheus-since-10**23-days": lambda t: (
        ["explain", "--prometheus", "http://127.0.0.1:9", "--since", "9" * 23 + "d"], {}, ["--since", "years"]
    ),
    # alerts that can never fire
    "alerts-tpot-nan": lambda t: (["alerts", "--tpot-budget", "nan"], {}, ["--tpot-budget", "finite"]),
    "alerts-tpot-inf": lambda t: (["alerts", "--tpot-budget", "inf"], {}, ["--tpot-budget", "finite"]),
    "alerts-queue-nan": lambda t: (["alerts", "--queue-budget", "nan"], {}, ["--queue-budget", "finite"]),
}  # fmt: skip


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _sparse_rule(tmp: Path) -> Path:
    rules = tmp / "rules"
    rules.mkdir()
    _sparse(rules / "big.toml", 1 << 30)
    return rules


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_a_limit_is_one_line(tmp_path, case):
    args, env, words = CASES[case](tmp_path)
    _one_line(_run(*args, cwd=tmp_path, env=env, timeout=120), *words)


def test_serve_with_a_huge_tp_starts_without_counting_to_it(tmp_path):
    """serve's preflight (warn) says it could not run and starts the server, whose own status ends it."""
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\nexit 7\n")
    fake.chmod(0o755)
    proc = _run("serve", "--vllm-bin", str(fake), "--", str(CONFIG.parent), "-tp", str(10**18), cwd=tmp_path)
    assert proc.returncode == 7, proc.stderr[-2000:]
    assert "--tensor-parallel-size" in proc.stderr and "internal error" not in proc.stderr


def test_a_cut_scrape_is_not_called_healthy(tmp_path):
    """Past 100,000 samples the scrape is cut: the report says so, is not healthy, and does not
    claim the KV usage metric is missing (it sat past the cut)."""
    lines = [f'vllm:num_requests_running{{engine="{i}"}} 0' for i in range(100_100)]
    lines += ["vllm:num_requests_waiting 0", "vllm:kv_cache_usage_perc 0.1"]
    scrape = _write(tmp_path / "big.metrics", "\n".join(lines) + "\n")
    proc = _run("explain", "--metrics", str(scrape), "--format", "json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert proc.returncode == 4 and report["status"] == "unknown", (proc.returncode, report["status"])
    assert report["facts"]["metrics"]["samples_not_read"] == 102
    assert any("cut" in w for w in report["input"]["warnings"]), report["input"]["warnings"]
    assert not any("is exposed" in w for w in report["input"]["warnings"]), report["input"]["warnings"]
    text = _run("explain", "--metrics", str(scrape), "--color", "never", cwd=tmp_path).stdout
    assert text.startswith("vllm-doctor: unknown: the scrape was cut") and "healthy" not in text.split("\n")[0]


def test_a_rules_tree_that_changes_during_the_walk(tmp_path, monkeypatch):
    """A folder listed and gone before the walk reaches it (another process pruning the tree) is
    left out, and a file listed and gone before its read is that file's "cannot read": rglob
    raised FileNotFoundError, exit 3."""
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching import loader
    from vllm_doctor.matching.problems import RuleError

    rules = tmp_path / "rules"
    (rules / "gone" / "deeper").mkdir(parents=True)
    (rules / "my-rule.toml").write_text(SAMPLE_RULE)
    (rules / "gone" / "deeper" / "my-rule.toml").write_text(SAMPLE_RULE)
    scandir = os.scandir

    def vanishing(path=".", *args):
        if str(path).endswith("gone"):
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path, *args)

    monkeypatch.setattr(os, "scandir", vanishing)
    assert [r.id for r in loader.load([rules], builtin=False, checks=CHECKS)] == ["my-rule"]
    monkeypatch.setattr(os, "scandir", scandir)

    listed = loader.rule_files(rules)
    (rules / "my-rule.toml").unlink()
    skipped: list[RuleError] = []
    monkeypatch.setattr(loader, "rule_files", lambda d: listed)
    loader.load([rules], builtin=False, checks=CHECKS, skip=skipped.append)
    assert [e.path for e in skipped] == [str(rules / "my-rule.toml")] and "cannot read" in str(skipped[0])


def test_the_limits_keep_real_inputs():
    """The bounds sit far above every real input: each fixture config and the built-in rules load."""
    from vllm_doctor.capacity.hub import read_config_file
    from vllm_doctor.capacity.shape import shape_from_config
    from vllm_doctor.knowledge.checks import CHECKS
    from vllm_doctor.matching.loader import builtin_dir, load, rule_files

    for path in sorted((FIXTURES / "configs").glob("*/config.json")):
        assert shape_from_config(read_config_file(path)).layers >= 1
    assert len(load(checks=CHECKS)) == len(rule_files(builtin_dir()))


def test_valid_tp_sizes_are_the_divisors_not_a_count():
    from vllm_doctor.capacity.arithmetic import tp_ok, valid_tp_sizes

    for heads, kv in ((32, 8), (40, 40), (96, 8), (1, None), (None, 4), (7, 1), (128, 1)):
        assert valid_tp_sizes(heads, kv, 256) == [t for t in range(1, 257) if tp_ok(t, heads, kv)]
    # a limit of 10**18 (-tp 10**18) is the divisors of 64 at once; it counted to 10**18 (in a child: a hang is caught)
    code = "from vllm_doctor.capacity.arithmetic import valid_tp_sizes as v; print(v(64, 8, 10**18), v(None, 8, 10**18)[-1])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split("]")[0] == "[1, 2, 4, 8, 16, 32, 64" and proc.stdout.split()[-1] == "4096", proc.stdout


@pytest.mark.parametrize("kind", ["sparse-1GiB", "nested-100k"])
def test_a_hostile_tokenizer_config_is_no_tokenizer_config(tmp_path, kind):
    """check reads tokenizer_config.json beside config.json for the chat template: a sparse GiB
    was read whole, a 100,000-deep nesting raised RecursionError (exit 3); now either is a file it
    cannot read, and check goes on to its verdict."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(CONFIG.read_text())
    (model / "tokenizer.json").write_text("{}")
    tok = model / "tokenizer_config.json"
    _sparse(tok, 1 << 30) if kind == "sparse-1GiB" else tok.write_text("[" * 100_000 + "]" * 100_000)
    # the check runs under a fresh parent that reports its one child's peak RSS (the GiB was read whole)
    peak = "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]).returncode; " + (
        "print(r, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    argv = [sys.executable, "-c", peak, sys.executable, "-m", "vllm_doctor", "check", "--no-gpu", "--offline", "--"]
    proc = subprocess.run([*argv, str(model)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "VLLM_DOCTOR_CONFIG": ""})  # fmt: skip
    code, kib = map(int, proc.stdout.split()[-2:])
    assert code in (0, 1, 4) and "Traceback" not in proc.stderr, (code, proc.stderr[-2000:])
    assert kib < 300 << 10, f"peak RSS {kib >> 10} MB"
