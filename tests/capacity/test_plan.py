"""`vllm-doctor plan`: the seed's numbers exactly, config-based plans, TP, several models on one
card, the ready `vllm serve` line, and one-line errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, conforms
from vllm_doctor.capacity import gpu
from vllm_doctor.capacity.plan import PlanError, PlanRequest, make_plan
from vllm_doctor.cli import app

CONFIGS = FIXTURES / "configs"
SEED = ["--params", "7B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "bfloat16",
        "--gpu-memory", "80GB", "--gpu-memory-utilization", "0.90"]  # fmt: skip
BARE = ["--overhead", "0GB"]  # the seed's arithmetic: no overhead (without it, the default check reserves too)
runner = CliRunner()


def plan(*args, env=None):
    return runner.invoke(app, ["plan", *map(str, args)], env={"NO_COLOR": "1", **(env or {})})


def plan_json(*args):
    result = plan(*args, "--format", "json", "--no-gpu")
    return result.exit_code, conforms(result.stdout, "plan-1")


def test_the_seed_exactly():
    result = plan(*SEED, *BARE, "--max-model-len", "8192", "--no-gpu")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "1 weights" in out and "14.0 GB" in out
    assert "2 KV cache memory" in out and "58.0 GB" in out and "80.0 GB x 0.90 - 14.0 GB weights" in out
    assert "131,072 B" in out and "2 x 32 layers x 8 KV heads x 128 head dim x 2 B (bfloat16)" in out
    assert "442,504 (about 442,000)" in out
    assert "5 sequences at 8,192" in out
    line = next(ln for ln in out.splitlines() if "5 sequences at 8,192" in ln)
    assert line.split()[4] == "54"
    assert "GB = 10^9 bytes, GiB = 2^30 bytes" in out
    code, data = plan_json(*SEED, *BARE, "--max-model-len", "8192")
    m = data["models"][0]
    assert (m["weights_bytes"], m["cache_bytes"], m["kv_bytes_per_token"]) == (14e9, pytest.approx(58e9), 131_072)
    assert (m["tokens"], m["worst_case_sequences"]) == (442_504, 54)
    assert m["model"]["kv_bytes_per_token"] == 131_072


def test_the_seed_at_32k():
    code, data = plan_json(*SEED, *BARE, "--max-model-len", "32768")
    assert code == 0 and data["models"][0]["worst_case_sequences"] == 13
    assert "5 sequences at 32,768" in plan(*SEED, *BARE, "--max-model-len", "32768", "--no-gpu").output


def test_the_block_examples():
    out = plan(*SEED, "--max-model-len", "8192", "--prompt-len", "40", "--no-gpu").output
    assert "a 40-token prompt" in out and "3 blocks, 8 slots empty in the last" in out
    out = plan(*SEED, "--max-model-len", "8192", "--prompt-len", "200", "--samples", "10", "--no-gpu").output
    assert "130 blocks unshared vs 13 shared" in out
    _, data = plan_json(*SEED, "--prompt-len", "200", "--samples", "10")
    assert data["blocks"][-1]["value"] == "130 blocks unshared vs 13 shared"


def test_gib_in_gib_out():
    code, data = plan_json(
        *SEED[:-4], *BARE, "--gpu-memory", "80GiB", "--gpu-memory-utilization", "0.90", "--max-model-len", "8192"
    )
    m = data["models"][0]
    assert m["cache_bytes"] == pytest.approx(80 * 2**30 * 0.9 - 14e9)
    assert data["gpu"]["unit"] == "GiB"
    out = plan(*SEED[:-4], "--gpu-memory", "80GiB", "--no-gpu").output
    assert "80.0 GiB x 0.92 - 13.0 GiB weights" in out  # 14e9 bytes = 13.04 GiB; 0.92: 0.32's default


def test_valid_tp_sizes_and_the_serve_line():
    code, data = plan_json(
        CONFIGS / "llama-3-70b", "--gpu-memory", "80GB", "--tensor-parallel-size", "4", "--max-model-len", "8192"
    )
    assert code == 0
    m = data["models"][0]
    assert m["valid_tp_sizes"] == [1, 2, 4, 8]
    assert m["kv_bytes_per_token"] == 2 * 80 * 2 * 128 * 2  # 2 of 8 KV heads per GPU
    assert m["weights_per_gpu_bytes"] == pytest.approx(m["weights_bytes"] / 4)
    assert m["serve_command"] == (
        f"vllm serve {CONFIGS / 'llama-3-70b'} --max-model-len 8192 --gpu-memory-utilization 0.92 --tensor-parallel-size 4"
    )
    assert m["model"]["params_source"] == "estimated from the shape"


def test_a_plan_that_does_not_fit_exits_1():
    result = plan(CONFIGS / "llama-3-70b", "--gpu-memory", "80GB", "--gpus", "1", "--no-gpu")
    assert result.exit_code == 1 and "no room for the KV cache" in result.output
    result = plan(CONFIGS / "llama-3-8b", "--gpu-memory", "80GB", "-tp", "3", "--gpus", "4", "--no-gpu")
    # the plan is its serve line's: TP 3 does not divide the heads, 4 does and fits, so it plans 4
    assert result.exit_code == 0 and "does not divide the heads; valid sizes: 1, 2, 4" in result.output
    code, data = plan_json(*SEED, *BARE, "--max-model-len", "500000")
    m = data["models"][0]
    # TP 1 does not hold the length asked for, TP 2 does: the plan says so and is TP 2's, the serve line's
    assert code == 0 and not m["problems"] and "the longest is 442,480" in m["notes"][0]
    assert "--max-model-len 500000" in m["serve_command"] and "--tensor-parallel-size 2" in m["serve_command"]
    assert m["notes"][0].startswith("--tensor-parallel-size 1 does not fit") and m["notes"][0].endswith(
        "the plan is for 2, which does"
    )


def test_target_concurrency_gives_the_length():
    code, data = plan_json(*SEED, "--max-model-len", "8192", "--target-concurrency", "100")
    m = data["models"][0]
    # the steps and the serve line reserve the default overhead of a 7B model on an 80 GB card (1.5 +
    # 0.5 + 2 GiB), as check does: one length for both
    tokens = int((80e9 * 0.9 - 14e9 - 4 * 2**30) // 131_072)
    assert m["max_model_len_for_target"] == tokens // 100 // 16 * 16 == 4096
    assert (
        f"--max-model-len {tokens // 100 // 16 * 16}"
        in m["serve_command"]
        == ("vllm serve <model> --max-model-len 4096 --gpu-memory-utilization 0.90 --dtype bfloat16")
    )
    assert any(
        "reserve 4.0 GiB per GPU beside the cache, as check does: 1.5 GiB activation peak" in n for n in m["notes"]
    )
    code, data = plan_json(*SEED, *BARE, "--max-model-len", "8192", "--target-concurrency", "100")
    assert data["models"][0]["max_model_len_for_target"] == 442_504 // 100 // 16 * 16 == 4416  # the seed's


def test_mla_fp8_weights_and_kv_dtype():
    code, data = plan_json(
        CONFIGS / "deepseek-v3", "--gpu-memory", "141GB", "--gpus", "8", "-tp", "8", "--max-model-len", "32768"
    )
    m = data["models"][0]
    assert m["kv_bytes_per_token"] == 70_272  # MLA: the latent is not split over TP
    # fp8 checkpoint: 8 bits per weight, the embeddings and lm_head (2 x 129,280 x 7,168) kept in bf16
    embed = 2 * 129_280 * 7_168
    assert m["weights_bytes"] == pytest.approx((m["model"]["params"] - embed) * 1 + embed * 2)
    assert "estimated from the shape" in m["steps"][0]["work"]
    code, fp8 = plan_json(*SEED, "--kv-cache-dtype", "fp8")
    assert fp8["models"][0]["kv_bytes_per_token"] == 65_536
    assert "--kv-cache-dtype fp8" in fp8["models"][0]["serve_command"]
    code, awq = plan_json(*SEED, "--quantization", "awq")
    assert awq["models"][0]["weights_bytes"] == 3.5e9


def test_several_models_on_one_card():
    code, data = plan_json(
        CONFIGS / "llama-3-8b", CONFIGS / "qwen2.5-7b", "--gpu-memory", "80GB", "--max-model-len", "8192"
    )
    assert code == 0
    fractions = [s["gpu_memory_utilization"] for s in data["split"]]
    assert sum(fractions) <= 0.92 and all(f > 0.2 for f in fractions)  # within vLLM 0.32's default together
    for m, f in zip(data["models"], fractions, strict=False):
        assert m["gpu_memory_utilization"] == f and m["worst_case_sequences"] >= 1
        assert f"--gpu-memory-utilization {f:.2f}" in m["serve_command"]
    code, data = plan_json(
        CONFIGS / "llama-3-70b",
        CONFIGS / "llama-3-70b",
        "--gpu-memory",
        "80GB",
        "--max-model-len",
        "8192",
        "--gpus",
        "1",
    )
    assert code == 1 and data["split"] is None and "do not fit together" in data["notes"][-1]


def test_sliding_window_models_are_sized_as_v1_does():
    """Mistral-7B-v0.1: every layer on a 4,096-token window, so a 32,768-token request holds the
    window plus 2 x 8,192 tokens in flight, plus one block: cdiv(4,095 + 16,384, 16) + 1 = 1,281
    blocks, not the 2,048 of full attention (kvcache.py; measured on real vLLM in test_kv_families)."""
    code, data = plan_json(CONFIGS / "mistral-7b-v0.1", "--gpu-memory", "80GB", "--max-model-len", "32768")
    m = data["models"][0]
    steps = {s["name"]: s["value"] for s in m["steps"]}
    blocks = int(m["cache_bytes"] // (16 * 131_072))
    assert steps["5 blocks"] == f"{blocks:,}" and steps["6 blocks per request at 32,768"] == "1,281"
    assert m["worst_case_sequences"] == blocks // 1281 == 20  # 4 GiB of the default overhead reserved (0.92 of 80 GB)
    assert m["tokens"] == int(blocks / 1281 * 32768)
    assert not any("approximate" in s["work"] for s in m["steps"])
    assert any("hybrid manager" in n for n in m["notes"])


def test_markdown_shows_the_work():
    result = plan(*SEED, *BARE, "--max-model-len", "8192", "--format", "markdown", "--no-gpu")
    assert "| step | work | value |" in result.output
    assert "| 2 KV cache memory | 80.0 GB x 0.90 - 14.0 GB weights - 0.0 GB overheads | 58.0 GB |" in result.output
    assert "```sh\nvllm serve <model> --max-model-len 8192" in result.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--layers", "32", "--gpu-memory", "80GB"], "--kv-heads, --head-dim missing"),
        (SEED[:-4] + ["--gpu-memory", "80"], "with a unit"),
        (SEED[:-4] + ["--gpu-memory", "80GB", "--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
        (["--layers", "2", "--kv-heads", "2", "--head-dim", "64", "--gpu-memory", "80GB"], "pass --params"),
        (SEED[:-4] + ["--gpu-memory", "auto"], "--gpu-memory auto needs NVML"),
        ([str(CONFIGS), "--gpu-memory", "80GB"], "no config.json"),
        (["--config", "/nonexistent/config.json", "--gpu-memory", "80GB"], "no such file"),
        (SEED[:-4] + ["--gpu-memory", "80GB", "--dtype", "float7"], "--dtype float7: unknown"),
        (SEED[:-4] + ["--gpu-memory", "80GB", "--kv-cache-dtype", "fp6"], "--kv-cache-dtype fp6: unknown"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, words):
    result = runner.invoke(app, ["plan", *args, "--no-gpu"])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0


def test_gpu_memory_auto_from_the_adapter():
    from test_gpu import FakeNvml

    snap = gpu.snapshot(FakeNvml())
    p = make_plan(PlanRequest(params="7B", layers=32, kv_heads=8, head_dim=128, max_model_len=8192), snap)
    assert p.gpu_bytes == 81559 * 2**20 and p.gpu_unit == "GiB" and p.gpus == 2
    assert p.models[0].valid_tp_sizes == [1, 2]  # up to the GPUs present
    assert any("vLLM's fraction must shrink to at most 0.72" in n for n in p.notes)
    with pytest.raises(PlanError, match="needs NVML"):
        make_plan(PlanRequest(params="7B", layers=32, kv_heads=8, head_dim=128), gpu.skipped("--no-gpu"))


def test_the_serve_line_never_carries_a_length_vllm_refuses():
    """tiny-llama's maximum is 2,048: 4,096 without VLLM_ALLOW_LONG_MAX_MODEL_LEN is vLLM's refusal, and the
    serve line keeps 2,048; with the variable the line carries it in front and the length asked for."""
    lab = CONFIGS / "lab-tiny-llama"
    code, data = plan_json(lab, "--max-model-len", "4096", "--cpu-kvcache-space", "1")
    m = data["models"][0]
    assert code == 1 and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in m["problems"][0]
    assert m["serve_command"].endswith("--max-model-len 2048") and m["longest_max_model_len"] == 2048
    code, data = plan_json(lab, "--max-model-len", "4096", "--cpu-kvcache-space", "1",
                           "--env", "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")  # fmt: skip
    m = data["models"][0]
    assert code == 0 and m["serve_command"].startswith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 VLLM_CPU_KVCACHE_SPACE=1 vllm")
    assert plan(lab, "--env", "no-equals-sign", "--no-gpu").exit_code == 2


def test_plan_takes_the_flags_that_shape_the_cache():
    """gpt-oss (every other layer on a 128-token window): the hybrid manager off sizes them as full."""
    args = (CONFIGS / "gpt-oss-120b", "--gpu-memory", "80GiB", "--max-model-len", "65536", "-tp", "4")
    _code, on = plan_json(*args)
    _code, off = plan_json(*args, "--disable-hybrid-kv-cache-manager", "--max-num-batched-tokens", "4096")
    assert off["models"][0]["tokens"] < on["models"][0]["tokens"] / 1.5  # half the layers stop holding every token
    assert "--disable-hybrid-kv-cache-manager --max-num-batched-tokens 4096" in off["models"][0]["serve_command"]
