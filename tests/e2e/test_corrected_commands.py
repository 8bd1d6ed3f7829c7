"""The advice, run for real: for the lab's failing starts (fixtures/lab, recorded on vLLM 0.32 CPU), the
corrected command `explain` prints, with the environment it carries in front, is started on the
real vLLM CPU build and must become ready; for the start no change can fix, no command is offered.

One start after another (2 cores), tiny models, short lengths. Run by scripts/e2e.sh.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_real_vllm import MODELS, VENV, free_port, get, kill_tree

pytestmark = pytest.mark.skipif(not (VENV and MODELS), reason="the e2e tier: run scripts/e2e.sh")

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 240
# (lab recording, its model, the environment it was recorded with: shared/vllm-lab/recordings/*.meta.json)
STARTS = [
    ("cache-oom", "wide-llama", {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    ("cache-oom-boundary", "wide-llama", {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    ("context-exceeds-max", "tiny-llama", {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    ("startup-cpu-memory-utilization", "tiny-llama", {}),
    ("startup-kvcache-space-exceeds-ram", "tiny-llama", {"VLLM_CPU_KVCACHE_SPACE": "64"}),
    (
        "tp-divisibility-vocab",
        "tiny-llama-h6kv6",
        {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"},
    ),
]


def explain(name: str, model: str) -> dict:
    config = ROOT / "fixtures" / "configs" / f"lab-{model}" / "config.json"
    r = subprocess.run(
        [sys.executable, "-m", "vllm_doctor", "explain", str(ROOT / "fixtures" / "lab" / f"{name}.log"),
         "--config", str(config), "--no-gpu", "-f", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.stdout, r.stderr
    return json.loads(r.stdout)


def as_run(line: str, model: str, port: int) -> tuple[dict[str, str], list[str]]:
    """The corrected line's leading VAR=value words and its `vllm serve` arguments, the model and
    the port made this machine's."""
    words = shlex.split(line)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:2] == ["vllm", "serve"], line
    args = [str(Path(MODELS) / model), *words[3:]]
    if "--port" in args:
        args[args.index("--port") + 1] = str(port)
    return env, args


def base_env(recorded: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_", "OMP_", "CUDA_"))}
    env.update(VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1", NO_COLOR="1", **recorded)
    return env


@pytest.mark.parametrize(("name", "model", "recorded"), STARTS, ids=[s[0] for s in STARTS])
def test_the_corrected_command_starts(name: str, model: str, recorded: dict[str, str], tmp_path: Path) -> None:
    report = explain(name, model)
    corrected = report["corrected_command"]
    assert corrected, f"{name}: no corrected command ({report['diagnoses'][0]['fixes']})"
    port = free_port()
    env, args = as_run(corrected["line"], model, port)
    t0 = time.monotonic()
    p = subprocess.Popen([str(Path(VENV) / "bin" / "vllm"), "serve", *args], cwd=tmp_path, env={**base_env(recorded), **env},
                         stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT)  # fmt: skip
    try:
        ready = False
        while time.monotonic() - t0 < READY_TIMEOUT and p.poll() is None:
            if get(f"http://127.0.0.1:{port}/health") == 200:
                ready = True
                break
            time.sleep(2)
        print(f"{name}: {corrected['line']} -> ready={ready} after {time.monotonic() - t0:.0f} s")
        tail = (tmp_path / "server.log").read_text(errors="replace")[-3000:]
        assert ready, f"{name}: {corrected['line']} did not become ready:\n{tail}"
    finally:
        kill_tree(p)


def test_the_start_no_change_fixes_offers_no_command() -> None:
    """6 attention heads over 4 KV heads: no --tensor-parallel-size starts it (the lab's two TP 3 starts)."""
    for name in ("tp-divisibility-kv-heads", "tp-cpu-numa-binding"):
        report = explain(name, "tiny-llama-h6kv4")
        assert report["corrected_command"] is None, name
        fixes = report["diagnoses"][0]["fixes"]
        assert fixes[0]["action"].startswith("No change of this command starts this model"), fixes
        assert not any(f["value"] for f in fixes), fixes
