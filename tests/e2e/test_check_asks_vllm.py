"""Issue 38: `check` asks the installed vLLM itself (preflight/oracle.py): its own `vllm serve`
parser and config construction, in a subprocess of its Python, no weights loaded. Held to the real
vLLM CPU build: what it accepts is "would start" as far as vLLM's own check goes, what it refuses
is the first blocker in its words, and its platform is the backend (the lab's install puts a stub
`vllm` metadata first: the CPU backend is still seen)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV = os.environ.get("VLLM_DOCTOR_E2E_VENV")
MODELS = os.environ.get("VLLM_DOCTOR_E2E_MODELS")
pytestmark = pytest.mark.skipif(not (VENV and MODELS), reason="the e2e tier: run scripts/e2e.sh")


def check(*vllm_args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_", "OMP_", "CUDA_"))}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", NO_COLOR="1")
    cmd = [sys.executable, "-m", "vllm_doctor", "check", "--vllm-bin", str(Path(VENV) / "bin" / "vllm"), "--no-gpu",
           "--format", "json", "--", str(Path(MODELS) / "tiny-llama"), *vllm_args]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize(
    ("args", "rule", "words"),
    [
        (("--max-model-len", "2048"), None, "accepts the configuration"),
        (("--dtype", "int8"), "check-vllm-refuses-arguments", "invalid choice: 'int8'"),
        (("--gpu-memory-utilization", "1.5"), "check-vllm-refuses", "less than or equal to 1"),
    ],
    ids=["accepted", "argparse-refuses-dtype", "config-refuses-utilization"],
)
def test_check_says_what_vllm_says(args, rule, words):
    report = check(*args)
    said = report["facts"]["preflight"]["vllm"]
    assert said.startswith("asked vLLM 0.32") and "(cpu," in said and words in said
    assert "backend cpu" in report["facts"]["preflight"]["input"]
    ours = [d for d in report["diagnoses"] if d["rule"].startswith("check-vllm-refuses")]
    if rule is None:
        assert not ours and report["status"] != "failed"
    else:
        assert report["status"] == "failed" and report["diagnoses"][0]["rule"] == rule
        assert words in report["diagnoses"][0]["summary"] and report["diagnoses"][0]["fixes"]
