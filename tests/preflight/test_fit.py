"""The fit on GPUs (the plan's budget over the NVML fake), the context limit from config.json, and
TP against the model's shape and the visible GPUs."""

from __future__ import annotations

import re

import pytest
from preflight_fakes import h100s

from conftest import FIXTURES
from vllm_doctor.preflight import fit, parallel
from vllm_doctor.preflight.args import parse
from vllm_doctor.preflight.context import Context
from vllm_doctor.preflight.finding import CannotRun

DEFAULT_UTILIZATION = 0.92  # vLLM 0.32's (the release a check without vLLM installed assumes: the atlas)


def ctx(model, *argv, gpus=1, env=None, backend=None):
    path = str(FIXTURES / "configs" / model)
    return Context(parse([path, *argv], env=env or {}), nvml=h100s(gpus), offline=True, backend=backend)


def test_llama_3_8b_fits_an_h100():
    (found,) = fit.fit(ctx("llama-3-8b", "--max-model-len", "8192"))
    assert (found.severity, found.category, found.rule) == ("info", "kv-capacity", "check-kv-cache-fits-gpu")
    n = found.numbers
    assert n["kv_bytes_per_token"] == 131072 and n["gpu_memory_utilization"] == DEFAULT_UTILIZATION == 0.92
    expected = n["gpu_total_gib"] * DEFAULT_UTILIZATION - n["weights_gib_per_gpu"] - n["overhead_gib"]
    assert abs(n["kv_cache_gib"] - expected) < 0.02 and n["overhead_gib"] == 4.0  # 1.5 + 0.5 + 2 GiB, plan's default


def test_too_little_utilization_is_cache_oom_with_the_length_that_fits():
    (found,) = fit.fit(ctx("llama-3-8b", "--max-model-len", "8192", "--gpu-memory-utilization", "0.25"))
    assert (found.severity, found.category, found.rule) == ("blocker", "cache-oom", "check-cache-oom-gpu")
    longest = found.numbers["fit_max_model_len"]
    assert 0 < longest < 8192 and longest % 16 == 0  # whole 16-token blocks, one held back
    fixes = {f.flag: f.value for f in found.fixes}
    assert fixes["--max-model-len"] == str(longest) and 0.25 < float(fixes["--gpu-memory-utilization"]) < 0.3
    assert fixes["--kv-cache-dtype"] == "fp8"


def test_weights_that_do_not_fit_are_weights_oom():
    (found,) = fit.fit(ctx("llama-3-8b", "--max-model-len", "8192", "--gpu-memory-utilization", "0.15"))
    assert (found.severity, found.category, found.rule) == ("blocker", "weights-oom", "check-weights-oom")
    assert "the weights take" in found.summary
    assert "--kv-cache-dtype" not in {f.flag for f in found.fixes}  # a smaller KV cache does not shrink the weights


def test_a_thin_margin_is_a_low_confidence_warning():
    (found,) = fit.fit(ctx("llama-3-8b", "--max-model-len", "8192", "--gpu-memory-utilization", "0.26"))
    assert (found.severity, found.confidence, found.rule) == ("warning", "low", "check-cache-oom-tight")
    assert 0 < found.numbers["kv_cache_gib"] - found.numbers["needed_gib"] < fit.TIGHT_MARGIN / 2**30 + 0.01


def test_without_gpu_or_cpu_backend_fit_cannot_run():
    c = Context(parse([str(FIXTURES / "configs" / "llama-3-8b")], env={}), no_gpu=True, offline=True)
    with pytest.raises(CannotRun, match="no GPU to fit on"):
        fit.fit(c)


def test_context_limit_and_the_long_context_switch():
    (found,) = fit.context_limit(ctx("llama-3.1-8b", "--max-model-len", "200000"))
    assert found.rule == "check-context-above-max" and found.numbers["derived_max_model_len"] == 131072
    env = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    (allowed,) = fit.context_limit(ctx("llama-3.1-8b", "--max-model-len", "200000", env=env))
    assert (allowed.severity, allowed.rule) == ("warning", "check-context-above-max-allowed")
    assert fit.context_limit(ctx("llama-3.1-8b", "--max-model-len", "131072")) == []


def test_tp_against_heads_and_gpus():
    (heads,) = parallel.tp_shape(ctx("llama-3-8b", "-tp", "3", gpus=4))
    assert heads.rule == "check-tp-heads" and heads.priority == 80 and "32 attention heads" in heads.summary
    assert parallel.tp_shape(ctx("llama-3-8b", "-tp", "16")) == []  # 8 KV heads replicated, 128,256 / 16
    (gpus,) = parallel.tp_devices(ctx("llama-3-8b", "-tp", "4", gpus=2))
    assert gpus.rule == "check-not-enough-gpus" and gpus.numbers == {"needed": 4, "visible": 2}
    (one_card,) = parallel.tp_needed(ctx("llama-3-8b", "-tp", "2", gpus=2))
    assert one_card.rule == "check-tp-not-needed" and "TP 2" in one_card.summary
    (f32,) = parallel.tp_needed(ctx("llama-3-8b", "-tp", "2", "--dtype", "float32", gpus=2))  # 4 B, as asked
    assert f32.numbers["weights_gib"] == pytest.approx(2 * one_card.numbers["weights_gib"], abs=0.01)
    (layers,) = parallel.tp_shape(ctx("llama-3-8b", "-pp", "64", gpus=64))
    assert (layers.rule, layers.numbers, layers.fixes[0].value) == ("check-pp-layers", {"pp": 64, "layers": 32}, "32")


def test_cpu_fit_is_the_capacity_models_answer_in_whole_gib():
    """The lab's cache-oom: 32,768 tokens x 131,072 B = 4 GiB, the null block on top: 5 GiB, as vLLM reads it."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    (found,) = fit.fit(ctx("lab-wide-llama", "--max-model-len", "32768", env=env, backend="cpu"))
    assert found.rule == "check-cache-oom-cpu" and found.numbers["fit_max_model_len"] == 8064
    assert "Set VLLM_CPU_KVCACHE_SPACE=5" in [f.action for f in found.fixes]
    (ok,) = fit.fit(
        ctx("lab-wide-llama", "--max-model-len", "32768", env={"VLLM_CPU_KVCACHE_SPACE": "5"}, backend="cpu")
    )
    assert ok.rule == "check-kv-cache-fits-cpu"
    # vLLM's int("4.02") refuses the start: a blocker, with the whole GiB that holds what was asked
    (bad,) = fit.fit(
        ctx("lab-wide-llama", "--max-model-len", "32768", env={"VLLM_CPU_KVCACHE_SPACE": "4.02"}, backend="cpu")
    )
    assert bad.rule == "check-cpu-kvcache-space-int" and bad.severity == "blocker"
    assert [f.action for f in bad.fixes] == ["Set VLLM_CPU_KVCACHE_SPACE=5"]


def test_the_cpu_binding_is_held_to_the_ranks_and_this_hosts_cpus():
    """'auto' needs a NUMA node per rank; a bind string one CPU list per rank of CPUs this host has."""
    import os

    cpus = len(os.sched_getaffinity(0))
    auto = parallel.tp_devices(ctx("lab-tiny-llama", "-tp", "2", env={"VLLM_CPU_KVCACHE_SPACE": "1"}, backend="cpu"))
    nodes = len(list(parallel.NUMA_NODES.glob("node[0-9]*")))
    if nodes < 2:  # this host: one NUMA node
        (f,) = auto
        assert f.rule == "check-cpu-numa-nodes" and f.fixes[0].action.startswith("Set VLLM_CPU_OMP_THREADS_BIND=")
    wrong = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-3|4-7|8-11"}
    (f,) = parallel.tp_devices(ctx("lab-tiny-llama", "-tp", "2", env=wrong, backend="cpu"))
    assert f.rule == "check-cpu-bind-string" and "3 lists for 2 ranks" in f.summary
    beyond = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": f"0|{cpus}"}
    (f,) = parallel.tp_devices(ctx("lab-tiny-llama", "-tp", "2", env=beyond, backend="cpu"))
    assert f.rule == "check-cpu-bind-string" and "CPUs this host lacks" in f.summary
    if cpus >= 2:
        fits = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
        assert parallel.tp_devices(ctx("lab-tiny-llama", "-tp", "2", env=fits, backend="cpu")) == []


@pytest.mark.parametrize(
    ("model", "argv", "gpus"),
    [
        ("llama-2-7b", ("--max-model-len", "4096"), 1),  # dense: 32 KV heads
        ("llama-3-8b", ("--max-model-len", "8192", "--gpu-memory-utilization", "0.5"), 1),  # GQA: 8 KV heads
        ("llama-3-8b", ("--max-model-len", "8192", "-tp", "2", "--gpu-memory-utilization", "0.2"), 2),  # TP 2
        ("llama-3.1-8b", ("--max-model-len", "131072", "--gpu-memory-utilization", "0.3"), 1),  # does not fit
    ],
)
def test_check_and_plan_give_the_same_verdict_and_kv_tokens(model, argv, gpus):
    """The same command on the same (faked) GPUs: check's start-or-refuse and KV tokens are plan's, at
    the overhead plan's serve line reserves by default."""
    from vllm_doctor.capacity import gpu
    from vllm_doctor.capacity.plan import PlanRequest, make_plan

    (found,) = fit.fit(ctx(model, *argv, gpus=gpus))
    n = found.numbers
    flags = dict(zip(argv[::2], argv[1::2], strict=True))
    req = PlanRequest(
        models=[str(FIXTURES / "configs" / model)], max_model_len=int(flags["--max-model-len"]),
        utilization=float(flags.get("--gpu-memory-utilization", DEFAULT_UTILIZATION)), tp=int(flags.get("-tp", 1)), gpus=gpus,
        overhead=f"{n['overhead_gib']}GiB", offline=True,
    )  # fmt: skip
    mp = make_plan(req, gpu.snapshot(h100s(gpus))).models[0]
    assert mp.budget.tp == req.tp  # the plan at the TP asked, not one it chose instead
    starts = found.rule in ("check-kv-cache-fits-gpu", "check-cache-oom-tight")
    assert starts == mp.fits, (found.rule, mp.problems)
    assert n["kv_cache_gib"] == pytest.approx(max(mp.budget.cache_bytes, 0) / 2**30, abs=0.01)
    assert n["fit_max_model_len"] == mp.budget.longest_sequence
    if found.rule == "check-kv-cache-fits-gpu":  # vLLM's print (whole blocks) against plan's bytes / bytes per token
        tokens = int(re.search(r"; ([\d,]+) tokens fit", found.summary).group(1).replace(",", ""))
        assert 0 <= mp.budget.tokens - tokens < mp.budget.block_size


@pytest.mark.parametrize(
    ("model", "argv"),
    [
        ("llama-3-8b", ["--max-model-len", "8192"]),
        ("llama-3-8b", ["--max-model-len", "8192", "--gpu-memory-utilization", "0.25"]),
        ("qwen2.5-7b", ["--max-model-len", "32768"]),
        ("mistral-7b-v0.1", ["--max-model-len", "32768"]),
        ("gemma-3-27b", ["--max-model-len", "16384"]),
    ],
)
def test_plan_and_check_give_one_verdict_and_one_cache(model, argv):
    """plan without --overhead reserves the default overhead check reserves (serving.default_overhead):
    the same configuration starts or does not by both, with the same KV cache (plan's step 4 divides
    bytes by bytes per token, vLLM counts whole blocks: within one block)."""
    from vllm_doctor.capacity.plan import PlanRequest, make_plan

    c = ctx(model, *argv)
    (found,) = fit.fit(c)
    util = (
        float(argv[argv.index("--gpu-memory-utilization") + 1])
        if "--gpu-memory-utilization" in argv
        else DEFAULT_UTILIZATION
    )
    req = PlanRequest(models=[str(FIXTURES / "configs" / model)], utilization=util, max_model_len=int(argv[1]),
                      gpus=1, offline=True)  # fmt: skip
    m = make_plan(req, c.snapshot).models[0]
    check_starts = found.severity != "blocker"
    assert (not m.problems) == check_starts, (found.rule, m.problems)
    assert m.budget.overhead_bytes / 2**30 == pytest.approx(found.numbers["overhead_gib"], abs=0.01)
    assert m.budget.cache_bytes / 2**30 == pytest.approx(found.numbers["kv_cache_gib"], abs=0.01)
    if check_starts:
        tokens = int(re.search(r"([\d,]+) tokens fit", found.summary)[1].replace(",", ""))
        assert abs(m.budget.tokens - tokens) < (m.budget.kv_layout.block_size if m.budget.kv_layout else 16)


def test_the_tp_fix_is_the_command_asked_again_at_that_tp():
    """llama-3.1-8b at 131,072 tokens and 0.25 on 4 GPUs: TP 2 would hold the sequence were the
    overhead TP 1's, but past TP 1 the non-torch memory grows by 0.5 GiB and TP 2 does not start
    (check says so of that command); the fix offered is 4, which does."""
    argv = ("--max-model-len", "131072", "--gpu-memory-utilization", "0.25")
    (found,) = fit.fit(ctx("llama-3.1-8b", *argv, gpus=4))
    assert found.rule == "check-cache-oom-gpu"
    assert [f.value for f in found.fixes if f.flag == "--tensor-parallel-size"] == ["4"]
    (two,) = fit.fit(ctx("llama-3.1-8b", *argv, "-tp", "2", gpus=4))
    (four,) = fit.fit(ctx("llama-3.1-8b", *argv, "-tp", "4", gpus=4))
    assert two.severity == "blocker" and four.severity != "blocker", (two.rule, four.rule)
    (one_gpu,) = fit.fit(ctx("llama-3.1-8b", *argv, gpus=1))  # no TP above the GPUs there are
    assert not [f for f in one_gpu.fixes if f.flag == "--tensor-parallel-size"]


def test_a_refusal_before_the_cache_is_never_a_fit(tmp_path):
    """Issue 38: 6 attention heads over 4 KV heads cannot be grouped at any TP; check said "would
    start" with a cache of "0 GiB ... 0 blocks" (the capacity model's early refusal read as a fit).
    Now tp_shape names it a blocker and the fit cannot run."""
    import json

    config = json.loads((FIXTURES / "configs" / "llama-3-8b" / "config.json").read_text())
    config.update(num_attention_heads=6, num_key_value_heads=4, hidden_size=384, head_dim=64)
    (tmp_path / "config.json").write_text(json.dumps(config))
    c = Context(parse([str(tmp_path), "--max-model-len", "2048"], env={"VLLM_CPU_KVCACHE_SPACE": "1"}), offline=True,
                no_gpu=True, backend="cpu")  # fmt: skip
    (found,) = parallel.tp_shape(c)
    assert (found.severity, found.rule) == ("blocker", "check-heads-not-multiple-of-kv-heads")
    assert found.summary.startswith("6 attention heads are not a multiple of 4 KV heads")
    with pytest.raises(CannotRun, match="refused before the cache is sized"):
        fit.fit(c)
