"""`serve --preflight`: strict refuses a start that cannot fit before vLLM is spawned (the fake
vllm never runs: it would write FAKE_ARGV), warn says why on stderr and starts, off says nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import FIXTURES, LAB

WIDE = str(FIXTURES / "configs" / "lab-wide-llama")


def serve(tmp_path, fake_bin, mode, *model_args):
    argv = tmp_path / "argv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "VLLM_"))}
    env.update(NO_COLOR="1", VLLM_CPU_KVCACHE_SPACE="1", FAKE_ARGV=str(argv), FAKE_REPLAY=str(LAB / "cache-oom.log"),
               FAKE_END="exit:1", HF_HUB_OFFLINE="1")  # fmt: skip
    cmd = [sys.executable, "-m", "vllm_doctor", "serve", "--vllm-bin", str(fake_bin), "--preflight", mode]
    p = subprocess.run([*cmd, "--", *model_args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr, argv.exists()


def test_strict_refuses_a_start_that_cannot_fit(tmp_path, fake_bin):
    rc, err, spawned = serve(tmp_path, fake_bin, "strict", WIDE, "--max-model-len", "32768")
    assert rc == 1 and not spawned
    assert "[vllm-doctor] preflight: would fail: cache-oom (blocker, at fit)" in err
    assert "First fix: Lower --max-model-len to 8064." in err
    assert "not starting vLLM" in err
    assert not (tmp_path / "vllm-doctor-reports").exists()


def test_strict_starts_a_start_that_fits(tmp_path, fake_bin):
    rc, err, spawned = serve(tmp_path, fake_bin, "strict", WIDE, "--max-model-len", "8064", "--port", "0")
    assert spawned and "not starting vLLM" not in err


def test_warn_says_why_and_starts(tmp_path, fake_bin):
    rc, err, spawned = serve(tmp_path, fake_bin, "warn", WIDE, "--max-model-len", "32768")
    assert spawned and rc == 1  # the child's own status: it replays cache-oom and exits 1
    lines = err.splitlines()
    assert lines[0] == "[vllm-doctor] preflight: would fail: cache-oom (blocker, at fit)"  # before the child's
    assert lines[1].startswith(
        "[vllm-doctor] preflight blocker: cache-oom (check-cache-oom-cpu): VLLM_CPU_KVCACHE_SPACE 1 GiB"
    )


def test_off_says_nothing(tmp_path, fake_bin):
    _, err, spawned = serve(tmp_path, fake_bin, "off", WIDE, "--max-model-len", "32768")
    assert spawned and "preflight" not in err
