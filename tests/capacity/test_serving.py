"""`plan`'s serve line (capacity/serving.py): the model by name, a TP size that fits, distinct ports,
the default overhead it reserves, and vLLM's own KV budget flags."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, LAB
from vllm_doctor.capacity import serving
from vllm_doctor.cli import app

CONFIGS = FIXTURES / "configs"
runner = CliRunner()


def plan_json(*args):
    result = runner.invoke(app, ["plan", *map(str, args), "--format", "json", "--no-gpu"])
    return result.exit_code, json.loads(result.stdout)


def test_a_config_file_is_served_by_its_directory_or_its_hub_repo(tmp_path):
    code, data = plan_json("--config", CONFIGS / "llama-3-8b" / "config.json", "--gpu-memory", "80GB")
    assert shlex.split(data["models"][0]["serve_command"])[:3] == ["vllm", "serve", str(CONFIGS / "llama-3-8b")]
    snapshot = tmp_path / "hub" / "models--meta-llama--Meta-Llama-3-8B" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    shutil.copy(CONFIGS / "llama-3-8b" / "config.json", snapshot / "config.json")
    code, data = plan_json("--config", snapshot / "config.json", "--gpu-memory", "80GB")
    assert data["models"][0]["serve_command"].startswith("vllm serve meta-llama/Meta-Llama-3-8B ")


def test_when_tp_1_does_not_fit_the_plan_is_the_size_that_does():
    """The headline is the serve line's verdict, its steps at the TP it chose."""
    code, data = plan_json(CONFIGS / "llama-3-70b", "--gpu-memory", "80GB", "--max-model-len", "8192")
    m = data["models"][0]
    assert code == 0 and not m["problems"]
    assert m["notes"][0].startswith("--tensor-parallel-size 1 does not fit: no room for the KV cache")
    assert m["notes"][0].endswith("the plan is for 4, which does")
    assert m["serve_command"].endswith("--max-model-len 8192 --gpu-memory-utilization 0.92 --tensor-parallel-size 4")
    assert m["weights_per_gpu_bytes"] == pytest.approx(m["weights_bytes"] / 4)
    code, data = plan_json(CONFIGS / "llama-3-70b", "--gpu-memory", "80GB", "--max-model-len", "8192", "--gpus", "1")
    m = data["models"][0]
    assert code == 1 and "no room for the KV cache" in m["problems"][0] and not m["serve_command"]
    kv = next(s for s in m["steps"] if s["name"] == "2 KV cache memory")
    # never a negative memory; the default overhead of a 70B model on an 80 GB card (4 + 0.5 + 2 GiB) reserved
    assert kv["value"] == "0.0 GB" and "- 7.0 GB overheads: short by 74.5 GB" in kv["work"]  # 80 GB x 0.92
    assert not any("-" in s["value"] for s in m["steps"])
    assert m["cache_short_bytes"] == pytest.approx(141.1e9 - 73.6e9 + 6.5 * 2**30, rel=0.01)
    assert m["cache_bytes"] == 0
    code, data = plan_json(CONFIGS / "llama-3-70b", "--gpu-memory", "80GB", "--gpus", "2")
    m = data["models"][0]
    assert m["serve_command"] is None and "no --tensor-parallel-size up to 2 leaves the KV cache room" in m["notes"][-1]


def test_co_hosted_models_get_distinct_ports():
    code, data = plan_json(CONFIGS / "llama-3-8b", CONFIGS / "qwen2.5-7b", "--gpu-memory", "80GB",
                           "--max-model-len", "8192")  # fmt: skip
    ports = [shlex.split(m["serve_command"]) for m in data["models"]]
    assert [w[w.index("--port") + 1] for w in ports] == ["8000", "8001"]


@pytest.mark.parametrize(
    ("gib", "params", "tp", "want"),
    [(80, 8e9, 1, 1.5 + 0.5 + 2), (24, 8e9, 1, 1.5 + 0.5 + 1), (80, 32e9, 2, 2.5 + 1 + 2), (141, 405e9, 8, 4 + 1 + 2)],
)
def test_the_default_overhead_by_gpu_and_model_size(gib, params, tp, want):
    total, work = serving.default_overhead(gib * 2**30, int(params), tp)
    assert total == want * 2**30 and "estimated defaults" in work


def test_kv_cache_memory_bytes_replaces_memory_times_utilization():
    code, data = plan_json("--params", "7B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                           "--gpu-memory", "80GB", "--kv-cache-memory-bytes", "4GiB", "--max-model-len", "8192")  # fmt: skip
    m = data["models"][0]
    assert m["cache_bytes"] == 4 * 2**30 and m["tokens"] == 4 * 2**30 // 131_072 == 32_768
    assert "--kv-cache-memory-bytes 4294967296 (set explicitly" in m["steps"][1]["work"]
    words = shlex.split(m["serve_command"])
    assert words[words.index("--kv-cache-memory-bytes") + 1] == str(4 * 2**30)
    assert "--gpu-memory-utilization" not in words


def test_cpu_kvcache_space_predicts_the_lab_recording():
    """The wide model at VLLM_CPU_KVCACHE_SPACE=1 (fixtures/lab/cache-fits.log): 8,192 tokens in
    blocks of 128, and 8,064 the longest length that starts."""
    lab = {c["id"]: c for c in map(json.loads, (LAB / "cases.jsonl").read_text().splitlines())}["lab-cache-fits"]
    code, data = plan_json(CONFIGS / "lab-wide-llama", "--cpu-kvcache-space", "1", "--max-model-len", "8192")
    m = data["models"][0]
    assert m["tokens"] == lab["facts"]["kv_cache_tokens"] == 8192
    assert m["serve_command"] == (
        f"VLLM_CPU_KVCACHE_SPACE=1 vllm serve {CONFIGS / 'lab-wide-llama'} --max-model-len {lab['facts']['max_model_len']}"
    )
    result = runner.invoke(app, ["plan", str(CONFIGS / "lab-wide-llama"), "--cpu-kvcache-space", "0.5", "--no-gpu"])
    assert result.exit_code == 2 and "whole GiB" in result.output and result.output.strip().count("\n") == 0
