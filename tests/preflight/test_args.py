"""The `vllm serve` command line read as vLLM's argparse reads it, without importing vLLM."""

from __future__ import annotations

import pytest

from vllm_doctor.errors import DoctorError
from vllm_doctor.preflight.args import from_cmdline, parse


def test_forms_of_flags():
    a = parse(["--", "meta-llama/Llama-3.1-8B", "-tp", "2", "--max-model-len=4096", "--trust-remote-code",
               "--gpu-memory-utilization", "0.85", "--no-enable-prefix-caching"], env={})  # fmt: skip
    assert a.model == "meta-llama/Llama-3.1-8B"
    assert (a.tp, a.pp, a.integer("max_model_len"), a.number("gpu_memory_utilization")) == (2, 1, 4096, 0.85)
    assert a.on("trust_remote_code") and not a.on("enable_prefix_caching")


def test_a_switch_before_the_model_does_not_swallow_it():
    a = parse(["--trust-remote-code", "my/model", "--port", "9000"], env={})
    assert a.model == "my/model" and a.integer("port") == 9000


def test_model_as_a_flag_and_serve_pasted_with_it():
    assert parse(["serve", "--model", "/m", "-pp", "2"], env={}).model == "/m"
    assert parse(["--model", "/m"], env={}).pp == 1


def test_environment_kept_is_the_one_that_changes_a_start():
    a = parse(["m"], env={"VLLM_CPU_KVCACHE_SPACE": "4", "HF_HOME": "/h", "CUDA_VISIBLE_DEVICES": "1", "PATH": "/bin"})
    assert a.env == {"VLLM_CPU_KVCACHE_SPACE": "4", "HF_HOME": "/h", "CUDA_VISIBLE_DEVICES": "1"}


def test_a_bad_number_is_one_line():
    with pytest.raises(DoctorError, match="--max-model-len lots: not a number"):
        parse(["m", "--max-model-len", "lots"], env={}).integer("max_model_len")


def test_other_servers_from_their_command_lines():
    served = from_cmdline(["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "--gpu-memory-utilization", "0.4"])
    assert served is not None and served.number("gpu_memory_utilization") == 0.4
    module = from_cmdline(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"])
    assert module is not None and module.model == "m"
    assert from_cmdline(["python", "-m", "http.server", "8000"]) is None


@pytest.mark.parametrize(
    ("version", "backend", "default"),
    [("0.4.3", "cuda", 0.9), ("0.32.0", "cuda", 0.92), ("0.33.0", "cpu", 0.92), ("0.34.0", "cuda", 1.0),
     ("0.34.0", "cpu", 0.92), (None, "cuda", 0.92)],
)  # fmt: skip
def test_the_utilization_is_the_flag_else_the_releases_default(version, backend, default):
    """The installed release's default, as its config classes say (the atlas): 0.9, then 0.92; 0.34
    leaves it None, which is 1.0 with the extensible KV cache (CUDA, ROCm) and 0.92 elsewhere."""
    from vllm_doctor.preflight.context import Context

    given = Context(parse(["m", "--gpu-memory-utilization", "0.5"], env={}), no_gpu=True, backend=backend)
    assert given.utilization == 0.5
    ctx = Context(parse(["m"], env={}), no_gpu=True, backend=backend)
    ctx.__dict__["vllm_version"] = version  # (the cached property: the release installed)
    assert ctx.utilization == default
